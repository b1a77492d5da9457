"""The ``device`` key of the simulations that can run on a GPU (the wind tunnel, the separable
sticky model): its config type and the check that turns it into a ``torch.device``.

Why a type of its own rather than :data:`dyntool.config.Device`: these sims draw their data from
a CPU ``torch.Generator`` and default to the CPU, so ``auto`` (a run whose device depends on the
machine) and ``mps`` (never tried) are not offered; ``cpu`` keeps every number as it was before the
key existed.
"""
from __future__ import annotations

import re
from typing import Annotated

import torch

from ..config import Pattern
from ..errors import ConfigError

CHOICES = r"cpu|cuda(:\d+)?"
SimDevice = Annotated[str, Pattern(CHOICES, "cpu, cuda or cuda:N")]


def resolve(name: str, key: str = "device") -> torch.device:
    """The device ``name`` names, refused (a :class:`ConfigError`: one line, exit 2 from the CLI)
    when it is malformed or this machine has no such CUDA device.  Call it before any folder is
    made.  A bare ``cuda`` becomes the current CUDA device, so meta.json names the index."""
    if not isinstance(name, str) or not re.fullmatch(CHOICES, name):
        raise ConfigError(key, f"cpu, cuda or cuda:N, got {name!r}")
    dev = torch.device(name)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise ConfigError(key, f"{name} requested but no CUDA GPU is visible; use --device=cpu")
    n = torch.cuda.device_count()
    if dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if dev.index >= n:
        raise ConfigError(key, f"{name} requested but this machine has {n} CUDA device(s) (cuda:0..cuda:{n - 1})")
    return dev
