"""CLI glue of ``dyntool sim bijection`` (kept in one function so it can move with the CLI)."""
from __future__ import annotations

import json
import os


def cmd_bijection(args) -> int:
    from .. import config
    from .bijection import BijectionConfig, run_bijection
    ov = list(args.overrides)
    if args.steps is not None:
        ov.append(f"--steps={args.steps}")
    cfg = config.load(BijectionConfig, args.config, args.preset, ov)
    run = run_bijection(cfg, args.out, name=args.name, tags=args.tag, quiet=args.quiet)
    print(json.dumps(run.meta.get("final", {}), indent=1, default=float))
    print(f"bijection run written to {run.path}")
    return 0


def register_bijection(simsub) -> None:
    p = simsub.add_parser(
        "bijection", help="the Bayesian wind tunnel: a multi-layer GPT on the bijection task (spec §4.4)",
        epilog="Presets in sims/bijection.toml: cpu (2 CPU cores, <= 15 min), paper (6x6x192, 100k steps, "
               "GPU). Any key can be set as --key=value, e.g. --model.n_layer=4 --record.every=500")
    p.add_argument("--steps", type=int, default=None, help="training steps")
    p.add_argument("--out", default=os.path.join("runs", "bijection"), help="parent directory of the run")
    p.add_argument("--name", default=None, help="run directory name (default bijection-DATE-random)")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--config", default=None, help="TOML file (see sims/bijection.toml)")
    p.add_argument("--preset", default=None)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_bijection)
