"""Run one WikiText-2 training: :func:`load_config` and :func:`run_training` (what `dyntool train` and the studies call).

The command lines live in :mod:`dyntool.cli.train`.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, RunError
from .config import TrainConfig

DEFAULT_OUT = os.path.join("runs", "wikitext")


def load_config(config: str | None, preset: str | None, overrides: list[str],
                resume: str | None = None, values: dict | None = None) -> TrainConfig:
    """Defaults ← TOML ← preset ← overrides ← typed ``values``; with ``resume`` the base is the
    run's config.json.  Also refuses a device this machine doesn't have (before anything is made)."""
    from .. import config as cfgmod
    if resume is None:
        cfg = cfgmod.load(TrainConfig, config, preset, overrides, values=values)
    else:
        if config is not None or preset is not None:
            raise ConfigError("--resume", "takes the config of the run it resumes; drop --config/--preset "
                                          "(overrides like --train.max_steps=N still apply)")
        path = Path(resume) / "config.json"
        try:
            base = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RunError(f"cannot resume {resume}: {path} can't be read ({e})") from None
        if not isinstance(base, dict):
            raise RunError(f"cannot resume {resume}: {path} is not a config object")
        base.setdefault("train", {})["stop_at"] = 0       # a resumed run goes on to max_steps
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


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_training(cfg: TrainConfig, out_dir: str = DEFAULT_OUT, name: str | None = None,
                 resume: str | None = None, tags: list[str] | None = None, quiet: bool = False,
                 kind: str = "train", extra_meta: dict | None = None):
    """Train one model; returns ``(run_path or None on ranks > 0, final metrics)``."""
    from ..data.wikitext import load_wikitext
    from ..run import RunWriter
    from . import ddp
    from .gpt import GPT
    from .recording import ConsoleCallback, MetricsLogger, RecordingCallback
    from .trainer import Trainer

    ckpt = None
    if resume is not None:
        src = Path(resume) / "checkpoint.pt"
        if not src.is_file():
            raise RunError(f"cannot resume {resume}: no checkpoint.pt (run with train.checkpoint=true)")
        ckpt = torch.load(src, map_location="cpu", weights_only=False)
        name = name or f"{Path(resume).name}-resume{ckpt['step']}"
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    dist = ddp.setup(cfg.device)
    try:
        corpus = load_wikitext(cfg.data.path or None)
        _seed_all(cfg.seed)                                  # identical init on every rank
        model = GPT(cfg.model, corpus.vocab_size, cfg.data.block_size, cfg.span, dist.device.type)
        model.to(dist.device)
        if cfg.train.dtype == "float64":
            model.double()
        from ..config import to_dict
        meta = {"world_size": dist.world, "vocab_size": corpus.vocab_size,
                "n_params": model.num_params(), "backend": model.backend,
                "data_path": str(corpus.path), "record_grad_scale": 1.0 / cfg.optim.accum,
                **(extra_meta or {})}
        if ckpt is not None:
            meta["resumed_from"] = {"run": str(Path(resume).resolve()), "step": int(ckpt["step"])}
        run = None
        if dist.is_main:
            run = RunWriter.create(out_dir, kind, to_dict(cfg), name=name, seeds=[cfg.seed], tags=tags,
                                   device=str(dist.device), extra_meta=meta)
        with run if run is not None else _Null():
            cbs = []
            if run is not None:
                cbs = [RecordingCallback(run, cfg)] + ([] if quiet else [ConsoleCallback()]) + \
                      [MetricsLogger(run, cfg.train.log_interval)]
            ck_path = None
            if cfg.train.checkpoint:
                ck_path = run.path / "checkpoint.pt" if run is not None else Path(os.devnull)
            trainer = Trainer(cfg, model, corpus, dist, cbs, ck_path)
            if ckpt is not None:
                trainer.load_state_dict(ckpt)
            final = trainer.fit()
            if run is not None:
                run.update_meta(final=final)
        return (run.path if run is not None else None), final
    finally:
        ddp.cleanup(dist)


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False
