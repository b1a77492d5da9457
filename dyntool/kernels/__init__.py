"""Fused Triton attention that trains and records the cheap tier (issue 33): see ``op.attention``.

Importing this package imports Triton.  To run the kernels on the CPU, ``TRITON_INTERPRET=1`` must
be set before Triton is first imported in the process (by anything: transformers and torch's
inductor import it too), since Triton reads it when a kernel is defined.  :func:`unavailable` says why the
kernel cannot serve a device, without importing Triton where it is missing."""
from __future__ import annotations

import importlib.util
import os

from ..extras import hint


def unavailable(device) -> str | None:
    """None when the fused kernel can run on ``device``; else the reason, in a few words."""
    import torch   # deferred: this package's import stays light (Triton and torch load where a kernel runs)
    if importlib.util.find_spec("triton") is None:
        return hint("triton")
    dev = torch.device(device)
    if dev.type == "cuda":
        return None
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return None
    # a statement, not an instruction: it lands in a CPU run's meta and `info` (the interpreter is for tests)
    return f"no Triton backend for {dev.type}; the fused kernel runs on CUDA GPUs"
