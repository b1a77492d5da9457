"""``dyntool sim sticky-markov``: registered into the main CLI (``dyntool/cli.py``)."""
from __future__ import annotations

import json
import os


def _floats(s: str) -> list[float]:
    return [float(v) for v in s.split(",") if v.strip()]


def cmd_sticky(args) -> int:
    from .. import config
    from ..errors import ConfigError
    from .sticky import StickyConfig, run_study
    from .summary import table
    ov = list(args.overrides)
    if args.seeds is not None:
        if not args.seeds.strip(","):
            raise ConfigError("seeds", "needs at least one seed")
        ov.append(f"--seeds={args.seeds}")
    for flag, key in ((args.steps, "steps"), (args.T, "T"), (args.arms, "arms"),
                      (args.value_lr_mult, "sweep"), (args.window, "window")):
        if flag is not None:
            ov.append(f"--{key}={flag}")
    if args.controls:
        ov.append("--arms=sgd,em,readout,routing,all,sgd_tuned")
    cfg = config.load(StickyConfig, args.config, args.preset, ov)
    study = run_study(cfg, args.out, name=args.name, tags=args.tag, quiet=args.quiet)
    summary = json.loads((study / "summary.json").read_text())
    print(table(summary))
    print(f"study written to {study}")
    return 0


def register(sub, simsub) -> None:
    p = simsub.add_parser(
        "sticky-markov", help="EM-like vs SGD on the sticky Markov chain (spec §4.2), all seeds batched",
        epilog="Any config key can be set as --key=value or --record.key=value, e.g. "
               "--construction=nominal --record.every=10 --arms=sgd,em,em_closed_form")
    p.add_argument("--seeds", default=None, help="comma-separated, default 42,2024,1337,7777,9999")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 1000)")
    p.add_argument("--T", type=int, default=None, help="sequence length (default 2000)")
    p.add_argument("--arms", default=None,
                   help="sgd,em[,readout,routing,all,sgd_tuned,em_closed_form] (default sgd,em)")
    p.add_argument("--controls", action="store_true",
                   help="add the learning-rate controls: --arms=sgd,em,readout,routing,all,sgd_tuned")
    p.add_argument("--value-lr-mult", dest="value_lr_mult", default=None,
                   help="sweep of EM-like value-LR multipliers, e.g. 1,2,5,10,20")
    p.add_argument("--window", type=int, default=None, help="recorded window of last positions (default 200)")
    p.add_argument("--out", default=os.path.join("runs", "sticky-markov"), help="parent directory of the study")
    p.add_argument("--name", default=None, help="study directory name (default study-DATE)")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--config", default=None, help="TOML file (see sims/sticky_markov.toml)")
    p.add_argument("--preset", default=None)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(fn=cmd_sticky)
    from .bijection_cli import register_bijection
    register_bijection(simsub)
