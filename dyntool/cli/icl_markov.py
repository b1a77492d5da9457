"""``dyntool sim icl-markov``: the in-context Markov chain study (arXiv 2402.11004)."""
from __future__ import annotations

import json
import os

from .common import add_n_seeds, common_output_options, config_option, config_values, restart_hint

SCHEMA = "dyntool.sims.icl_markov_config:ICLMarkovConfig"


def cmd_icl_markov(args) -> int:
    # deferred: keeps the config layer (tomllib, inspect: ~0.1 s) and torch off `dyntool --help`
    from .. import config
    from ..sims.icl_markov_config import ICLMarkovConfig
    from ..sims.icl_markov_study import run_study, table
    cfg = config.load(ICLMarkovConfig, args.config, args.preset, args.overrides, values=config_values(args))
    with restart_hint(args.out, args.name):
        study = run_study(cfg, args.out, name=args.name, tags=args.tag, quiet=args.quiet)
    print(table(json.loads((study / "summary.json").read_text())))
    print(f"study written to {study}")
    return 0


def register(sub, simsub) -> None:
    p = simsub.add_parser(
        "icl-markov", help="in-context Markov chains: stages of a statistical induction head (arXiv 2402.11004)",
        description="Train a two-layer attention-only transformer on in-context Markov chains (a fresh chain per "
                    "sequence), the cheap tier on every step and the full tier on a schedule; writes a study folder "
                    "with one run per (seed, prior) and summary.json (stages, which layer moves first, a leading "
                    "indicator, the doubly stochastic control prior).",
        epilog="Any config key can also be set as --key=value or --section.key=value, e.g. --model.n_head=2 "
               "--record.every=100.  Presets: cpu (2 CPU cores), dense (cpu + the seeded dense rerun), ci.")
    config_option(p, SCHEMA, "seeds", metavar="S[,S...]", help="comma-separated seeds (default 0,1,2,3,4)")
    add_n_seeds(p)
    config_option(p, SCHEMA, "k", "--k", help="number of states (default 3)")
    config_option(p, SCHEMA, "steps", help="training steps (default 2000)")
    config_option(p, SCHEMA, "device", help="cpu, cuda, cuda:N, mps or auto (default cpu)")
    config_option(p, SCHEMA, "control", help="also run the doubly stochastic control prior (default true)")
    p.add_argument("--config", default="icl_markov.toml", metavar="FILE",
                   help="TOML config: a path or a packaged preset file name (default: icl_markov.toml)")
    p.add_argument("--preset", default=None, metavar="NAME", help="a [preset.NAME] table of the config file")
    common_output_options(p, os.path.join("runs", "icl-markov"), what="study")
    p.set_defaults(fn=cmd_icl_markov, takes_overrides=True, writes=True)
