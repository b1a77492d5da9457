"""``dyntool sim sticky-markov`` and ``dyntool sim toy``."""
from __future__ import annotations

import json
import os
import warnings

from .common import add_n_seeds, common_output_options, config_option, config_values, restart_hint

CONTROL_ARMS = ["sgd", "em", "readout", "routing", "all", "sgd_tuned"]
# --controls without --seeds / --n-seeds / a preset / a config file of the user's setting seeds: ten seeds (the README's five first), paired tests
# over ten; arrays on disk for the first two seeds only (the rest log metrics)
CONTROL_SEEDS = [42, 2024, 1337, 7777, 9999, 1, 2, 3, 4, 5]
OVERRIDES = "Any config key can also be set as --key=value or --section.key=value"


def cmd_sticky(args) -> int:
    from .. import config
    from ..errors import ConfigError
    from ..sims.sticky import StickyConfig, run_study
    from ..sims.summary import table
    values = config_values(args)
    if getattr(args, "old_window", None) is not None:
        if "crop" in values:
            raise ConfigError("--window", "--window is the old name of --crop; give one of them")
        warnings.warn("flag --window is deprecated, use --crop", config.DeprecatedKeyWarning, stacklevel=2)
        values["crop"] = args.old_window
    if args.controls:
        if "arms" in values:
            raise ConfigError("--controls", "give either --arms LIST or --controls, not both")
        values["arms"] = CONTROL_ARMS
        if args.preset is None and "seeds" not in values and not _user_seeds(args):
            values["seeds"] = CONTROL_SEEDS
            values.setdefault("record_seeds", 2)
    cfg = config.load(StickyConfig, args.config, args.preset, args.overrides, values=values)
    with restart_hint(args.out, args.name):
        study = run_study(cfg, args.out, name=args.name, tags=args.tag, quiet=args.quiet)
    summary = json.loads((study / "summary.json").read_text())
    print(table(summary))
    print(f"study written to {study}")
    return 0


def _user_seeds(args) -> bool:
    """Did the user choose the seeds: an override, or a config file of their own that sets them?
    (The packaged default file's five README seeds are not a choice; --controls runs ten.)"""
    from .. import config
    if any(o.split("=")[0].lstrip("-") in ("seeds", "record_seeds") for o in args.overrides or []):
        return True
    if args.config is None:
        return False
    path = config.resolve_file(args.config)
    return path.resolve().parent != config.PRESETS.resolve() and "seeds" in config.read_file(path)


def cmd_sim_toy(args) -> int:
    from .. import config
    from ..sims.toy import ToyConfig, run_toy
    cfg = config.load(ToyConfig, args.config, args.preset, args.overrides, values=config_values(args))
    with restart_hint(args.out, args.name):
        run = run_toy(cfg, args.out, name=args.name, tags=args.tag, quiet=args.quiet)
    print(f"toy run written to {run.path}")
    return 0


def cmd_bijection(args) -> int:
    from .. import config
    from ..sims.bijection import BijectionConfig, run_bijection
    cfg = config.load(BijectionConfig, args.config, args.preset, args.overrides, values=config_values(args))
    with restart_hint(args.out, args.name):
        run = run_bijection(cfg, args.out, name=args.name, tags=args.tag, quiet=args.quiet)
    print(json.dumps(run.meta.get("final", {}), indent=1, default=float))
    print(f"bijection run written to {run.path}")
    return 0


def _config_file_options(p, default: str) -> None:
    p.add_argument("--config", default=default, metavar="FILE",
                   help=f"TOML config: a path or a packaged preset file name (default: {default}, "
                        "shipped in dyntool/presets/)")
    p.add_argument("--preset", default=None, metavar="NAME", help="a [preset.NAME] table of the config file")


def register(sub, simsub) -> None:
    ToyConfig, StickyConfig = "dyntool.sims.toy:ToyConfig", "dyntool.sims.sticky:StickyConfig"
    BijectionConfig = "dyntool.sims.bijection:BijectionConfig"
    toy = simsub.add_parser("toy", help="the T=5 toy head (arXiv 2512.22473, toy simulation), recorded every step",
                            description="Train the T = 5 toy attention head by gradient descent, recording "
                                        "every step.",
                            epilog=f"{OVERRIDES}, e.g. --model.causal=true --lr=0.1.  Presets: causal, slow.")
    config_option(toy, ToyConfig, "steps", help="training steps (default 500)")
    config_option(toy, ToyConfig, "seed", help="RNG seed of the initialisation (default 0)")
    _config_file_options(toy, "toy.toml")
    common_output_options(toy, os.path.join("runs", "toy"))
    toy.set_defaults(fn=cmd_sim_toy, takes_overrides=True, writes=True)

    p = simsub.add_parser(
        "sticky-markov", help="EM-like vs SGD on the sticky Markov chain (arXiv 2512.22473), all seeds batched",
        description="Train one attention head on the sticky Markov chain with SGD and the EM-like schedule, "
                    "every (seed, arm) batched; writes a study folder with one run per (seed, arm) and summary.json.",
        epilog=f"{OVERRIDES}, e.g. --construction=nominal --record.every=10.  "
               "Presets: ci, nominal, sweep, controls, varied.")
    config_option(p, StickyConfig, "seeds", metavar="S[,S...]",
                  help="comma-separated seeds (default 42,2024,1337,7777,9999)")
    add_n_seeds(p)
    config_option(p, StickyConfig, "steps", help="training steps (default 1000)")
    config_option(p, StickyConfig, "T", "--T", help="sequence length (default 2000)")
    config_option(p, StickyConfig, "arms", metavar="ARM[,ARM...]",
                  help="arms to run: sgd, em, readout, routing, all, sgd_tuned, em_closed_form "
                       "(default: the config's)")
    p.add_argument("--controls", action="store_true",
                   help=f"run the learning-rate controls too: --arms {','.join(CONTROL_ARMS)}")
    config_option(p, StickyConfig, "value_lr_mult", metavar="X",
                  help="EM-like arm: W_V learning rate = lr × X (default 10)")
    config_option(p, StickyConfig, "sweep", metavar="X[,X...]",
                  help="extra EM-like runs at these value-LR multipliers, e.g. 1,2,5,10,20 (default none)")
    config_option(p, StickyConfig, "crop", "--crop",
                  help="recorded crop: the last N positions (default 200; all of them when N >= T - 1)")
    # the old flag, its own argument so that using it can say so (an argparse alias can't)
    p.add_argument("--window", dest="old_window", type=int, default=None, metavar="N",
                   help="old name of --crop (deprecated)")
    _config_file_options(p, "sticky_markov.toml")
    common_output_options(p, os.path.join("runs", "sticky-markov"), what="study")
    p.set_defaults(fn=cmd_sticky, takes_overrides=True, writes=True)
    b = simsub.add_parser(
        "bijection", help="the Bayesian wind tunnel: a multi-layer GPT on the bijection task (arXiv 2512.22471)",
        description="Train a GPT through dyntool's attention on the bijection in-context task (exact Bayes "
                    "entropy per position), recording attention, values and the manifold analyses.",
        epilog=f"{OVERRIDES}, e.g. --model.n_layer=4 --record.every=500.  Presets: cpu (2 CPU cores, "
               "<= 15 min), paper (6x6x192, 100k steps: a GPU's size, --device cuda; 13.8k of its steps run "
               "on an H200), ci, authors and authors_cpu (the authors' "
               "task: pointer head, query loss, keys with replacement; docs/wind_tunnel_differences.md).")
    config_option(b, BijectionConfig, "steps", help="training steps (default: the config's)")
    config_option(b, BijectionConfig, "seed", help="RNG seed (default 42)")
    config_option(b, BijectionConfig, "device", help="cpu (default), cuda or cuda:N: where the model, batches and "
                  "held-out set live; data is drawn on the CPU either way.  A missing GPU is refused before "
                  "anything is written")
    _config_file_options(b, "bijection.toml")
    common_output_options(b, os.path.join("runs", "bijection"))
    b.set_defaults(fn=cmd_bijection, takes_overrides=True, writes=True)
