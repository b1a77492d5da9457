"""Checkpoints and ``--resume`` for the simulations: one mechanism, used by every sim (the studies
too: ``icl-markov`` checkpoints each run, :mod:`.icl_markov_resume`; ``sticky-markov``, one batched
engine, the study as one, :mod:`.sticky_resume`).

It follows ``dyntool train --resume RUN`` (:mod:`dyntool.train.runner`): the run's ``config.json``
is the base config (overrides still apply), its ``checkpoint.pt`` (written atomically by
:func:`dyntool.train.checkpoint.save`, read back with ``weights_only``) holds the model, the
optimizer, the step reached, the sim's data generators and the process RNG states, and the
resumed run is a **new** run beside it, ``RUN-resumeSTEP`` (``-2``, ``-3``, … while taken), whose
rows start at that step.  Restored that way, a resumed run's rows and parameters are bitwise those
of the uninterrupted run on the CPU (tests/integration/test_sim_resume.py), and equal to float
rounding on CUDA, whose backward kernels may add in any order (tests/gpu/test_bijection_cuda.py).

A sim writes its checkpoint (:class:`Checkpointer`) when SIGTERM/SIGINT stops it (between two
steps: each step runs in :func:`dyntool.run_writer.critical_section`), when its time limit or
``stop_at_step`` stops it, at the end, and every ``every`` steps if asked; the interrupted run's
meta says the command that continues it (:func:`continue_command`).

A simulation checkpoint differs from a training one in its keys (``kind``, ``gens``, ``extra``),
so neither command resumes the other's run by mistake.
"""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import torch

from .. import safeio
from ..errors import RunError
from ..location import location
from ..run_writer import write_json_atomic
from ..storage import open_backend
from ..train import checkpoint
from ..train.checkpoint import capture_rng, restore_rng

FILE = "checkpoint.pt"
KEYS = {"kind", "step", "model", "optim", "gens", "rng", "extra"}


def state(kind: str, step: int, model: torch.nn.Module, opt, gens: dict, extra: dict | None = None) -> dict:
    """A plain checkpoint tree at ``step`` (the number of optimizer steps taken, the next to run):
    ``gens`` name -> torch.Generator (CPU or CUDA; its state is a CPU byte tensor)."""
    return tree(kind, step, model.state_dict(), opt.state_dict(), {k: g.get_state() for k, g in gens.items()}, extra)


def tree(kind: str, step: int, params: dict, optim: dict, gens: dict | None = None, extra: dict | None = None) -> dict:
    """:func:`state` from state dicts: a sim without an nn.Module or torch optimizer (the batched
    sticky-chain engine: ``params`` its weights, ``optim`` ``{"state": {}, "param_groups": []}``)."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"kind": kind, "step": int(step), "model": params, "optim": optim, "gens": dict(gens or {}),
            "rng": {**capture_rng(), "cuda": cuda}, "extra": dict(extra or {})}


def restore(sd: dict, model: torch.nn.Module, opt, gens: dict) -> int:
    """Load a checkpoint from :func:`load` into ``model``, ``opt`` and ``gens``; returns its step."""
    try:
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        for k, g in gens.items():
            g.set_state(sd["gens"][k])
        restore_rng(sd["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        why = " ".join(str(e).split())[:200]
        raise RunError(f"the checkpoint can't be restored into this config's model ({type(e).__name__}: "
                       f"{why}); a resumed run keeps its model size") from None
    if sd["rng"].get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(sd["rng"]["cuda"])
    return int(sd["step"])


class Checkpointer:
    """Writes ``RUN/checkpoint.pt`` of one run (a folder or an object-store prefix)."""

    def __init__(self, run, kind: str, every: int = 0):
        self.path = run.backend.where / FILE
        self.kind, self.every, self.step = kind, every, None

    def save(self, step: int, model, opt, gens: dict, extra: dict | None = None) -> None:
        checkpoint.save(state(self.kind, step, model, opt, gens, extra), self.path)
        self.step = step

    def due(self, step: int) -> bool:
        """After ``step`` updates: is a periodic checkpoint due?"""
        return bool(self.every) and step > 0 and step % self.every == 0


def load(resume: str, kind: str) -> tuple[dict, dict, str, str]:
    """``--resume RUN`` of a ``kind`` simulation: (its config.json, its checkpoint, the new run's
    default name ``RUN-resumeSTEP``, the folder RUN is in).  One-line :class:`RunError` when there
    is nothing to resume from."""
    where = location(resume, "--resume")
    run = open_backend(where, "--resume", root="/")
    raw = run.get("config.json", safeio.MAX_JSON_BYTES)
    if raw is None:
        raise RunError(f"cannot resume {resume}: no config.json (not a run folder)")
    base = safeio.loads(raw, "config.json")
    sd = read(run, where, resume, kind)
    if not isinstance(base, dict):
        raise RunError(f"cannot resume {resume}: config.json is not an object")
    return base, sd, beside(where, int(sd["step"])), str(where.parent)


def beside(where, step: int) -> str:
    """The continuation's name, in the folder of ``where``: ``NAME-resumeSTEP`` (``-2``, … while taken)."""
    name, i = f"{where.name}-resume{step}", 2
    parent = open_backend(where.parent, "--resume", root="/")
    while parent.exists(name):
        name, i = f"{where.name}-resume{step}-{i}", i + 1
    return name


def read(run, where, resume: str, kind: str) -> dict:
    """The checkpoint.pt of the run (or study) folder ``run`` (a storage backend at ``where``),
    checked: one-line :class:`RunError` when it is missing, not a ``kind`` sim's, or malformed."""
    what = run.what_is(FILE)
    if what == "missing":
        raise RunError(f"cannot resume {resume}: no {FILE} (written when a run is stopped by Ctrl-C, SIGTERM, "
                       f"its time limit or stop_at_step, and at the end; a kill -9 before that leaves none)")
    if what != "file":
        raise RunError(f"cannot resume {resume}: its {FILE} is not a regular file")
    try:
        with run.open_file(FILE) as f:          # a FIFO or device is refused: it would hang torch.load
            sd = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise RunError(f"cannot resume {resume}: {FILE} refused ({why})") from None
    if not isinstance(sd, dict) or not KEYS <= set(sd):
        other = "a training run's: use dyntool train --resume" if isinstance(sd, dict) and "sched" in sd else \
            "not a simulation checkpoint"
        raise RunError(f"cannot resume {resume}: its {FILE} is {other}")
    if sd["kind"] != kind:
        raise RunError(f"cannot resume {resume}: it is a {sd['kind']} run, not {kind}")
    checkpoint.validate({**sd, "sched": {}, "data_gen": [torch.zeros(1, dtype=torch.uint8)]}, where / FILE,
                        _int(sd["step"]))
    return sd


def _int(x) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else 0


def set_next_step(study: Path, line: str | None) -> None:
    """A sim study's study.json says how to go on (``line``), or nothing once it finished (None)."""
    raw = json.loads((study / "study.json").read_text())
    if raw.get("next_step") != line:
        write_json_atomic(study / "study.json", {**raw, "next_step": line})


def continue_command(cli: str, run_path, step: int) -> str:
    """What continues a run stopped at ``step``: ``dyntool sim CLI --resume RUN`` (a folder below
    here is shown relative to it)."""
    where = location(run_path)
    shown = where
    if isinstance(where, Path):
        rel = os.path.relpath(where)
        shown = Path(rel) if not rel.startswith("..") else where
    return f"stopped at step {step}; continue with: dyntool sim {cli} --resume {shlex.quote(str(shown))}"
