"""``dyntool train`` and ``dyntool study``, plus :func:`run_training` (what both call).

    dyntool train --config sims/wikitext_mhsa.toml --preset small [--max-steps N] [--out DIR]
                  [--name NAME] [--resume RUN] [--section.key=value ...]
    torchrun --nproc_per_node=2 -m dyntool train --config ...        # DDP, rank 0 writes the run
    dyntool study span|ls-logits [--seeds N] [--max-steps N] [--preset NAME] [--out DIR]
"""
from __future__ import annotations

import argparse
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
                resume: str | None = None) -> TrainConfig:
    """Defaults ← TOML ← preset ← overrides; with ``resume`` the base is the run's config.json."""
    from .. import config as cfgmod
    if resume is None:
        return cfgmod.load(TrainConfig, config, preset, overrides)
    if config is not None or preset is not None:
        raise ConfigError("--resume", "takes the config of the run it resumes; drop --config/--preset "
                                      "(overrides like --train.max_steps=N still apply)")
    path = Path(resume) / "config.json"
    try:
        base = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RunError(f"cannot resume {resume}: {path} can't be read ({e})") from None
    base.setdefault("train", {})["stop_at"] = 0       # a resumed run goes on to max_steps
    values = cfgmod._merge(base, cfgmod.parse_overrides(overrides))
    return cfgmod.update(TrainConfig(), values)


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


# -- command line -----------------------------------------------------------------------------

def cmd_train(args) -> int:
    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"--train.max_steps={args.max_steps}")
    if args.config is None and args.resume is None:
        raise ConfigError("--config", "dyntool train needs --config FILE (e.g. sims/wikitext_mhsa.toml) "
                                      "or --resume RUN")
    cfg = load_config(args.config, args.preset, overrides, args.resume)
    out = args.out or (str(Path(args.resume).parent) if args.resume else DEFAULT_OUT)
    path, final = run_training(cfg, out, name=args.name, resume=args.resume, tags=args.tag,
                               quiet=args.quiet)
    if path is not None:
        extra = ""
        if "valid_ppl" in final:
            extra = f" (valid ppl {final['valid_ppl']:.2f}, test ppl {final['test_ppl']:.2f})"
        print(f"train run written to {path}{extra}")
    return 0


def cmd_study(args) -> int:
    from .studies import run_study
    run_study(args.study, out=args.out, seeds=args.seeds, max_steps=args.max_steps,
              preset=args.preset, overrides=list(args.overrides), quiet=args.quiet)
    return 0


def register(sub, simsub) -> None:
    t = sub.add_parser("train", help="train a GPT on WikiText-2 (mhsa / ls / span / qknorm), recorded",
                       epilog="Any config key can be set as --section.key=value, e.g. "
                              "--model.n_layer=2 --optim.lr=1e-3 --record.every=25")
    t.add_argument("--config", default=None, help="TOML file, e.g. sims/wikitext_mhsa.toml")
    t.add_argument("--preset", default=None, help="a [preset.NAME] of the file (small: CPU, gpu)")
    t.add_argument("--max-steps", type=int, default=None, dest="max_steps")
    t.add_argument("--out", default=None, help=f"runs directory (default {DEFAULT_OUT})")
    t.add_argument("--name", default=None, help="run directory name (default: train-date-random)")
    t.add_argument("--resume", default=None, metavar="RUN",
                   help="continue RUN from its checkpoint.pt into a new run (exact on CPU)")
    t.add_argument("--tag", action="append", default=[])
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    t.set_defaults(fn=cmd_train)

    s = sub.add_parser("study", help="multi-run studies: span (baseline vs span-recon), "
                                     "ls-logits (max-logit growth of mhsa vs ls vs qknorm)")
    s.add_argument("study", choices=["span", "ls-logits"])
    s.add_argument("--seeds", type=int, default=3)
    s.add_argument("--max-steps", type=int, default=None, dest="max_steps")
    s.add_argument("--preset", default="small")
    s.add_argument("--out", default=os.path.join("runs", "studies"))
    s.add_argument("--config", default=None, help=argparse.SUPPRESS)   # lets --section.key=value through
    s.add_argument("--quiet", action="store_true")
    s.set_defaults(fn=cmd_study)
