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

import errno
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from .. import safeio
from ..errors import RunError
from ..storage import open_parent

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

def save(sd: dict, path) -> None:
    """Write ``sd`` to ``path`` (``RUN/checkpoint.pt`` on a disk or ``s3://…/RUN/checkpoint.pt``)
    through the run's storage backend, atomically: never a half-written checkpoint; on failure
    (e.g. disk full) the previous checkpoint is kept.  A disk streams it to a temp file renamed
    over the old one, object storage sends it as one PUT (:meth:`dyntool.storage.Backend.write_with`)."""
    backend, key = open_parent(path, "checkpoint", create=True)
    sd = {"format_version": FORMAT_VERSION, **sd}

    def write(target) -> None:
        try:
            torch.save(sd, target)
        except RuntimeError as e:
            # torch's zip writer reports a full disk as a RuntimeError ("unexpected pos …", "file
            # write failed"): measured before the partial file goes, it is the OSError it was
            if isinstance(target, Path) and shutil.disk_usage(target.parent).free < (1 << 20):
                raise OSError(errno.ENOSPC, "No space left on device", str(path)) from e
            raise
    backend.write_with(key, write)


def load(path) -> dict:
    """Read a checkpoint (a local path or an object-store URL, through its folder's storage
    backend) with ``weights_only=True``; anything else is a one-line RunError."""
    try:
        # root "/": a checkpoint is named by the user (--resume), not found inside a run folder
        backend, key = open_parent(path, "checkpoint", root="/")
        with backend.open_file(key) as f:          # a FIFO or device is refused: it would hang torch.load
            sd = torch.load(f, map_location="cpu", weights_only=True)
    except RunError:
        raise
    except safeio.BadFile as e:
        raise RunError(f"checkpoint {path} refused: {e}") from None
    except OSError as e:
        raise RunError(f"checkpoint {path} can't be read: {e.strerror or e}") from None
    except Exception as e:       # UnpicklingError for code-carrying pickles, RuntimeError for junk
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunError(f"checkpoint {path} refused: not a plain dyntool checkpoint "
                       f"(weights_only load failed: {why[:160]})") from None
    if not isinstance(sd, dict) or not {"step", "model", "optim", "sched", "rng", "data_gen"} <= set(sd):
        raise RunError(f"checkpoint {path} is not a dyntool training checkpoint (missing keys)")
    return sd


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate(sd: dict, path: Path, max_steps: int) -> int:
    """Check a loaded checkpoint's fields before anything is created from it: ``step`` an integer in
    [0, max_steps], ``model`` a dict of finite tensors, ``optim``/``sched`` dicts of the optimizer's
    shape, ``rng`` with the torch/numpy/Python states, ``data_gen`` a list of generator states.
    Returns the step; raises a one-line :class:`RunError` naming the bad field."""
    def bad(field: str, why: str):
        return RunError(f"checkpoint {path} refused: {field} {why}")
    step = sd.get("step")
    if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_floating_point():
        step = int(step.item())
    if not _is_int(step):
        raise bad("step", f"is {str(step)[:40]!r}, not an integer")
    if not 0 <= step <= max_steps:
        raise bad("step", f"{step} is outside [0, train.max_steps = {max_steps}]")
    model = sd.get("model")
    if not isinstance(model, dict) or not model or \
            not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
        raise bad("model", "is not a state dict of tensors")
    for k, v in model.items():
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise bad("model", f"tensor {k} holds NaN or inf")
    optim = sd.get("optim")
    if not isinstance(optim, dict) or not isinstance(optim.get("state"), dict) or \
            not isinstance(optim.get("param_groups"), list) or \
            not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in optim["param_groups"]):
        raise bad("optim", "is not an optimizer state (state, param_groups)")
    if not isinstance(sd.get("sched"), dict):
        raise bad("sched", "is not a scheduler state")
    rng = sd.get("rng")
    try:
        ok = isinstance(rng, dict) and isinstance(rng["torch"], torch.Tensor) and rng["torch"].dtype == torch.uint8
        ok = ok and rng["torch"].numel() == torch.get_rng_state().numel()
        ok = ok and isinstance(rng["numpy"]["keys"], torch.Tensor) and rng["numpy"]["keys"].numel() == 624
        ok = ok and _is_int(rng["numpy"]["pos"]) and 0 <= rng["numpy"]["pos"] <= 624
        ok = ok and isinstance(rng["python"]["internal"], torch.Tensor) and rng["python"]["internal"].numel() == 625
        ok = ok and bool(((rng["numpy"]["keys"] >= 0) & (rng["numpy"]["keys"] < 2**32)).all())
        ok = ok and bool(((rng["python"]["internal"] >= 0) & (rng["python"]["internal"] < 2**32)).all())
    except (KeyError, TypeError, IndexError):
        ok = False
    if not ok:
        raise bad("rng", "is not a set of torch/numpy/Python RNG states")
    gens = sd.get("data_gen")
    if not isinstance(gens, list) or not gens or not all(
            isinstance(g, torch.Tensor) and g.dtype == torch.uint8 for g in gens):
        raise bad("data_gen", "is not a list of generator states")
    return step


def check_model(sd: dict, model: torch.nn.Module, path: Path) -> None:
    """The checkpoint's tensors have the names and shapes of ``model`` (before anything is created)."""
    want = model.state_dict()
    have = sd["model"]
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        raise RunError(f"checkpoint {path} refused: model tensors differ from the config's model "
                       f"(missing {missing[:3]}, unexpected {extra[:3]})")
    for k, v in want.items():
        if tuple(have[k].shape) != tuple(v.shape):
            raise RunError(f"checkpoint {path} refused: model tensor {k} has shape {tuple(have[k].shape)}, "
                           f"the config's model has {tuple(v.shape)}")


def size_bytes(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0
