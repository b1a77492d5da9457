"""Training checkpoints: written atomically, read with ``torch.load(weights_only=True)``.

A checkpoint is a plain tree of tensors, numbers, strings, lists and dicts (model, optimizer,
scheduler, step, every RNG state), so loading it never unpickles arbitrary objects: a crafted
``checkpoint.pt`` whose pickle would run code (``__reduce__``) is refused with a one-line
:class:`RunError` instead.  The numpy and Python RNG states, which are tuples holding arrays, are
converted to tensors here and back on load.

Under DDP every rank's data generator and CUDA RNG state are gathered, and each rank restores
its own (``data_gen[rank]``, ``cuda[rank]``).
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from ..atomic import replacing

from ..errors import RunError

FORMAT_VERSION = 2


# -- RNG states as plain types ----------------------------------------------------------------

def numpy_state_to_plain(st) -> dict:
    """``np.random.get_state()`` (legacy MT19937 tuple) -> tensors and numbers."""
    name, keys, pos, has_gauss, cached = st
    return {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def numpy_state_from_plain(d: dict):
    return (d["name"], d["keys"].numpy().astype(np.uint32), int(d["pos"]), int(d["has_gauss"]),
            float(d["cached_gaussian"]))


def python_state_to_plain(st) -> dict:
    """``random.getstate()`` = (version, 625 ints < 2**32, gauss_next) -> tensor + numbers."""
    version, internal, gauss = st
    return {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss}


def python_state_from_plain(d: dict):
    return (int(d["version"]), tuple(int(v) for v in d["internal"].tolist()), d["gauss_next"])


def capture_rng() -> dict:
    """This process's torch, numpy and Python RNG states (CUDA is per rank: see the trainer)."""
    return {"torch": torch.get_rng_state(), "numpy": numpy_state_to_plain(np.random.get_state()),
            "python": python_state_to_plain(random.getstate())}


def restore_rng(r: dict) -> None:
    torch.set_rng_state(r["torch"])
    np.random.set_state(numpy_state_from_plain(r["numpy"]))
    random.setstate(python_state_from_plain(r["python"]))


# -- files ------------------------------------------------------------------------------------

def save(sd: dict, path: Path) -> None:
    """Write ``sd`` to ``path`` atomically (:func:`dyntool.atomic.replacing`): never a half-written
    checkpoint; on failure (e.g. disk full) the previous checkpoint is kept."""
    with replacing(path) as tmp:
        torch.save({"format_version": FORMAT_VERSION, **sd}, tmp)


def load(path: Path) -> dict:
    """Read a checkpoint with ``weights_only=True``; anything else is a one-line RunError."""
    path = Path(path)
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as e:
        raise RunError(f"checkpoint {path} can't be read: {e.strerror or e}") from None
    except Exception as e:       # UnpicklingError for code-carrying pickles, RuntimeError for junk
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunError(f"checkpoint {path} refused: not a plain dyntool checkpoint "
                       f"(weights_only load failed: {why[:160]})") from None
    if not isinstance(sd, dict) or not {"step", "model", "optim", "sched", "rng", "data_gen"} <= set(sd):
        raise RunError(f"checkpoint {path} is not a dyntool training checkpoint (missing keys)")
    return sd


def size_bytes(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0
