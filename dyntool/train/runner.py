"""Run one WikiText-2 training: :func:`load_config` and :func:`run_training` (what `dyntool train` and the studies call).

The command lines live in :mod:`dyntool.cli.train`.
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import torch

from .. import config as cfgmod, safeio
from ..config import to_dict
from ..data.wikitext import load_wikitext
from ..errors import ConfigError, DyntoolError, RunError, StorageError
from ..location import location
from ..progress import TrainProgress
from ..recording_session import rank_writers
from ..run_files import read_json
from ..run_writer import RunWriter
from ..storage import open_backend
from . import checkpoint, ddp
from .checkpoint import check_model
from .config import TrainConfig
from .fsdp import broadcast
from .gpt import GPT
from .recording import ConsoleCallback, MetricsLogger, RecordingCallback
from .sharded import ShardedRecordingCallback, check as check_sharded
from .trainer import Trainer, restore_deterministic, set_deterministic

DEFAULT_OUT = os.path.join("runs", "wikitext")


def load_config(config: str | None, preset: str | None, overrides: list[str],
                resume: str | None = None, values: dict | None = None) -> TrainConfig:
    """Defaults ← TOML ← preset ← overrides ← typed ``values``; with ``resume`` the base is the
    run's config.json.  Also refuses a device this machine doesn't have (before anything is made)."""
    if resume is None:
        cfg = cfgmod.load(TrainConfig, config, preset, overrides, values=values)
    else:
        if config is not None or preset is not None:
            raise ConfigError("--resume", "takes the config of the run it resumes; drop --config/--preset "
                                          "(overrides like --train.max_steps=N still apply)")
        run = open_backend(resume, "--resume", root="/")       # a folder or s3://…/RUN alike
        path = run.where / "config.json"
        try:
            raw = run.get("config.json", safeio.MAX_JSON_BYTES)
            if raw is None:
                raise RunError(f"cannot resume {resume}: {path} is missing")
            base = safeio.loads(raw, "config.json")
        except (OSError, ValueError) as e:
            raise RunError(f"cannot resume {resume}: {path} can't be read ({e})") from None
        if not isinstance(base, dict):
            raise RunError(f"cannot resume {resume}: {path} is not a config object")
        if not isinstance(base.setdefault("train", {}), dict):
            raise RunError(f"cannot resume {resume}: {path} has a 'train' that is not a section "
                           f"(a {type(base['train']).__name__})")
        base["train"]["stop_at"] = 0                        # a resumed run goes on to max_steps
        cfg = cfgmod.load(TrainConfig, base=base, overrides=overrides, values=values)
    _check_device(cfg, preset)
    return cfg


def _check_device(cfg: TrainConfig, preset: str | None) -> None:
    """A CUDA device (or a ``gpu*`` preset left on ``auto``) on a machine without one is refused:
    such a preset on the CPU takes hours, so it must be asked for with ``--device=cpu``."""
    if cfg.device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device", "mps requested but not available on this machine; use --device=cpu")
    if torch.cuda.is_available():
        return
    if cfg.device.startswith("cuda"):
        raise ConfigError("device", f"{cfg.device} requested but no CUDA GPU is visible; use --device=cpu")
    if preset is not None and preset.startswith("gpu") and cfg.device == "auto":
        raise ConfigError("--preset", f"{preset} is sized for a CUDA GPU and none is visible; "
                                      "add --device=cpu to run it on the CPU anyway")


def _check_memory(cfg: TrainConfig, vocab: int, n_params: int) -> None:
    """A rough lower bound of one training step's memory (parameters + optimizer state, the
    activations and attention matrices of a micro-batch, the logits) against what is available:
    an absurd batch or model size is refused before anything is allocated or created."""
    m, d, r = cfg.model, cfg.data, cfg.record
    B, T = max(d.batch_size, d.eval_batch_size), d.block_size
    per_token = m.n_layer * (12 * m.n_embd + 2 * m.n_head * T) + 3 * vocab
    need = 4 * (4 * n_params + B * T * per_token)
    why = safeio.memory_problem(need, "one training step")
    if why:
        raise ConfigError("data.batch_size", f"{why} (batch {d.batch_size}, eval batch {d.eval_batch_size}, block {T}, "
                                             f"{m.n_layer} layers of {m.n_embd}); lower data.batch_size / "
                                             "data.eval_batch_size / data.block_size / the model size")
    if r.enabled and r.batch == "probe":
        # a recording step: the probe's own forward/backward plus ~10 T × T float32 quantities per
        # head (α, S, B, A, ∂L/∂S and their work space) before they are written
        need = 4 * (4 * n_params + r.seqs * T * per_token + 10 * r.seqs * m.n_layer * m.n_head * T * T)
        why = safeio.memory_problem(need, "one recording step")
        if why:
            raise ConfigError("record.seqs", f"{why} ({r.seqs} probe sequences of {T} tokens, {m.n_layer} layers × "
                                             f"{m.n_head} heads); lower record.seqs")


class NothingToDo(Exception):
    """``--resume`` of a run whose checkpoint is already at ``train.max_steps``."""


def resume_source(resume: str, cfg: TrainConfig) -> tuple[dict, str]:
    """Load ``RUN/checkpoint.pt`` (weights_only) and pick the new run's default name.

    Raises :class:`RunError` with the reason when there is nothing to resume from, and
    :class:`NothingToDo` when the checkpoint is already at ``train.max_steps``."""
    run = open_backend(resume, "--resume", root="/")           # a folder or s3://…/RUN alike
    kind = run.what_is("checkpoint.pt")
    if kind not in ("file", "missing"):                  # never opened: a FIFO would hang
        kind = {"link": "a link", "folder": "a folder"}.get(kind, "not a regular file")
        raise RunError(f"cannot resume {resume}: its checkpoint.pt is {kind}; it must be the file "
                       "a training run wrote")
    if kind == "missing":
        old = read_json(run, "config.json", []).get("train", {})          # why there is none
        old = old if isinstance(old, dict) else {}
        if old.get("checkpoint") is False:
            why = "it was trained with train.checkpoint=false"
        else:
            iv = old.get("checkpoint_every", old.get("checkpoint_interval", 0))   # the old name in older runs
            every = f"every {iv} steps, " if iv else ""
            why = (f"it stopped before its first checkpoint (written {every}at the end and on "
                   f"SIGTERM/SIGINT; a kill -9 before step {iv or 'the end'} leaves none)")
        raise RunError(f"cannot resume {resume}: no checkpoint.pt, {why}")
    runs = open_backend(run.where.parent, "--resume", root="/")     # where the new run's name must be free
    return _load_checkpoint(run.where / "checkpoint.pt", resume, cfg, run.where.name, runs.exists)


def _load_checkpoint(src, resume: str, cfg: TrainConfig, run_name: str, taken) -> tuple[dict, str]:
    """The checkpoint at ``src``, validated, and the new run's default name: ``RUN-resumeSTEP``, or
    ``-2``, ``-3`` … while ``taken(name)`` (a second resume gets a fresh name)."""
    ck = checkpoint.load(src)
    step = checkpoint.validate(ck, src, max(cfg.train.max_steps, _is_step(ck.get("step"))))
    if step >= cfg.train.max_steps:
        raise NothingToDo(f"{resume} is already at step {step} = train.max_steps: nothing to do "
                          f"(to train on, pass --max-steps N with N > {step})")
    base = f"{run_name}-resume{step}"
    name, i = base, 2
    while taken(name):
        name, i = f"{base}-{i}", i + 1
    return ck, name


def _is_step(x) -> int:
    """A checkpoint step at or past max_steps is 'nothing to do', not an error: let it through."""
    return x if isinstance(x, int) and not isinstance(x, bool) else 0


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_training(cfg: TrainConfig, out_dir: str = DEFAULT_OUT, name: str | None = None,
                 resume: str | None = None, tags: list[str] | None = None, quiet: bool = False,
                 kind: str = "train", extra_meta: dict | None = None, callbacks: list | None = None):
    """Train one model; returns ``(run_path or None on ranks > 0, final metrics)``.

    ``callbacks``: extra trainer callbacks (a study's probe), placed after the recording callback
    and before the metrics logger, so the keys they add to a step's metrics are written with it."""

    ckpt = None
    if resume is not None:
        ckpt, default_name = resume_source(resume, cfg)
        name = name or default_name
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    sharded = int(os.environ.get("WORLD_SIZE", "1")) > 1 and cfg.train.parallel == "fsdp"
    if cfg.train.parallel != "auto" and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        # one process: nothing to shard or replicate; said, not refused (a resumed run keeps its setting)
        print(f"dyntool: warning: train.parallel={cfg.train.parallel} needs the processes torchrun starts "
              f"(torchrun --nproc_per_node=N -m dyntool train ...); training as one process", file=sys.stderr)
    if sharded:                                    # refused before any process group or run exists
        check_sharded(cfg, int(os.environ["WORLD_SIZE"]))
    dist = ddp.setup(cfg.device)
    det = set_deterministic(cfg.train.deterministic)
    try:
        say = None if quiet or not dist.is_main else (lambda line: print(line, file=sys.stderr, flush=True))
        corpus = load_wikitext(cfg.data.path or None, log=say)
        model = _build_model(cfg, corpus, dist, ckpt, resume)
        meta = _run_meta(cfg, model, corpus, dist, sharded, ckpt, resume, extra_meta)
        run, rank_run = None, None
        if sharded:                                    # every rank records its own shard into rank 0's run
            run, rank_run = rank_writers(dist.rank, lambda: _create_run(out_dir, kind, cfg, name, tags, dist, meta),
                                         broadcast)
        elif dist.is_main:
            run = _create_run(out_dir, kind, cfg, name, tags, dist, meta)
        with run if run is not None else (rank_run or _Null()):
            final = _fit(cfg, model, corpus, dist, run, rank_run, ckpt, resume, quiet, callbacks)
            if run is not None:
                run.update_meta(final=final)
        return (run.path if run is not None else None), final
    finally:
        restore_deterministic(det)
        ddp.cleanup(dist)


def _build_model(cfg: TrainConfig, corpus, dist, ckpt: dict | None, resume: str | None):
    """The GPT on its device, seeded identically on every rank, checked against a checkpoint."""
    m = cfg.model                                            # before the model is allocated
    _check_memory(cfg, corpus.vocab_size, 12 * m.n_layer * m.n_embd ** 2 + corpus.vocab_size * m.n_embd)
    _seed_all(cfg.seed)
    model = GPT(cfg.model, corpus.vocab_size, cfg.data.block_size, cfg.span, dist.device.type)
    model.to(dist.device)
    if cfg.train.dtype == "float64":
        model.double()
    if ckpt is not None:                                     # names and shapes, before any run exists
        check_model(ckpt, model, location(resume) / "checkpoint.pt")
    return model


def _run_meta(cfg: TrainConfig, model, corpus, dist, sharded: bool, ckpt: dict | None,
              resume: str | None, extra_meta: dict | None) -> dict:
    """What meta.json says about this run beyond its config."""
    meta = {"world_size": dist.world, "parallel": "fsdp" if sharded else "ddp" if dist.world > 1 else "none",
            "vocab_size": corpus.vocab_size,
            "n_params": model.num_params(), "backend": model.backend,
            "data_path": str(corpus.path), "data_source": corpus.source, "record_grad_scale": 1.0 / cfg.optim.accum,
            **(extra_meta or {})}
    if ckpt is not None:
        meta["resumed_from"] = {"run": str(location(resume).resolve()),
                                "step": int(ckpt["step"])}
    return meta


def _create_run(out_dir: str, kind: str, cfg: TrainConfig, name, tags, dist, meta: dict):
    """The run folder (rank 0 only; under FSDP its refusal reaches the other ranks: rank_writers)."""
    return RunWriter.create(out_dir, kind, to_dict(cfg), name=name, seeds=[cfg.seed], tags=tags,
                            device=str(dist.device), extra_meta=meta)


def _fit(cfg: TrainConfig, model, corpus, dist, run, rank_run, ckpt: dict | None, resume: str | None,
         quiet: bool, extra: list | None = None) -> dict:
    """Callbacks, checkpoint path and trainer for this rank; train (from the checkpoint, if any)."""
    cbs = []
    if rank_run is not None:                       # FSDP: every rank records its own shard
        cbs = [ShardedRecordingCallback(rank_run, cfg, dist)]
    if run is not None:
        shown = [TrainProgress(f"{Path(str(run.path)).name} "), ConsoleCallback(stream=sys.stderr)]
        cbs = (cbs or [RecordingCallback(run, cfg)]) + list(extra or []) + ([] if quiet else shown) + \
              [MetricsLogger(run, cfg.train.log_every)]
    ck_path = None
    if cfg.train.checkpoint:                       # a Path, or a URLPath: one PUT (dyntool.storage)
        ck_path = Path(os.devnull) if run is None else run.backend.where / "checkpoint.pt"
    trainer = Trainer(cfg, model, corpus, dist, cbs, ck_path)
    trainer.quiet = quiet or not dist.is_main
    if ckpt is not None:
        try:
            trainer.load_state_dict(ckpt)
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as e:
            why = " ".join(str(e).split())[:200]
            raise RunError(f"checkpoint {location(resume) / 'checkpoint.pt'} can't be restored "
                           f"({type(e).__name__}: {why})") from None
    try:
        return trainer.fit()
    except KeyboardInterrupt as e:             # Ctrl-C / SIGTERM: say how to go on
        if run is not None:
            e.next_step = next_step(run.path, ck_path, trainer.step)
        raise
    except StorageError as e:                  # the object store stayed down past the ride-out
        if run is not None:
            try:                               # its checkpoint is asked for once, quickly
                e.next_step = next_step(run.path, ck_path, trainer.step)
            except DyntoolError:               # still down: its first one is told by the step reached
                every = cfg.train.checkpoint_every or cfg.train.max_steps + 1
                e.next_step = (f"stopped at step {trainer.step}, before its first checkpoint: start it again"
                               if ckpt is None and trainer.step < every else
                               f"stopped at step {trainer.step}; once the storage answers, continue from its last "
                               f"checkpoint with: dyntool train --resume {run.path}")
        raise


def next_step(run_path, ck_path, step: int) -> str:
    """The command that continues an interrupted run (or why there is none)."""
    import shlex
    where = location(run_path)
    if ck_path is None or open_backend(where, root="/").what_is("checkpoint.pt") != "file":
        return f"stopped at step {step} with no checkpoint (train.checkpoint=false or none written yet)"
    shown = where
    if isinstance(where, Path):                    # a folder is shown relative to here when below it
        try:
            shown = Path(os.path.relpath(where))
            shown = shown if not str(shown).startswith("..") else where
        except ValueError:
            shown = where
    return f"stopped at step {step}; continue with: dyntool train --resume {shlex.quote(str(shown))}"


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False
