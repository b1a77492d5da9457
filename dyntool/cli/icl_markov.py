"""``dyntool sim icl-markov``: the in-context Markov chain study (arXiv 2402.11004)."""
from __future__ import annotations

import json
import os

from ..errors import ConfigError
from .common import add_n_seeds, common_output_options, config_option, config_values, restart_hint, \
    stopped_study

SCHEMA = "dyntool.sims.icl_markov_config:ICLMarkovConfig"


def cmd_icl_markov(args) -> int:
    # deferred: keeps the config layer (tomllib, inspect: ~0.1 s) and torch off `dyntool --help`
    from .. import config
    from ..sims.icl_markov_config import ICLMarkovConfig
    from ..sims.icl_markov_study import run_study, table
    from ..sims.icl_markov_resume import load_study
    if args.resume is None:
        cfg, study = config.load(ICLMarkovConfig, args.config or "icl_markov.toml", args.preset, args.overrides,
                                 values=config_values(args)), None
    elif args.config is not None or args.preset is not None or args.name is not None:
        raise ConfigError("--resume", "goes on in the study folder with the study's config; drop "
                                      "--config/--preset/--name (overrides like --time_limit_min=M still apply)")
    else:
        study, cfg = load_study(args.resume, args.overrides, config_values(args))
    with restart_hint(args.out, args.name, resumable=True):
        study = run_study(cfg, args.out, name=args.name, tags=args.tag, quiet=args.quiet, resume=study)
    if stopped_study(study):
        return 0
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
    p.add_argument("--config", default=None, metavar="FILE",
                   help="TOML config: a path or a packaged preset file name (default: icl_markov.toml)")
    p.add_argument("--preset", default=None, metavar="NAME", help="a [preset.NAME] table of the config file")
    p.add_argument("--resume", default=None, metavar="STUDY",
                   help="continue STUDY (stopped by Ctrl-C/SIGTERM, --time_limit_min=M or --stop_at_step=N) in "
                        "its folder: finished runs are kept, the stopped run continues from its checkpoint.pt "
                        "into RUN-resumeSTEP (equal to the uninterrupted run), the rest start; overrides like "
                        "--time_limit_min=M still apply")
    common_output_options(p, os.path.join("runs", "icl-markov"), what="study")
    p.set_defaults(fn=cmd_icl_markov, takes_overrides=True, writes=True)
