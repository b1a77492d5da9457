"""``dyntool sim sticky-markov`` and ``dyntool sim toy``."""
from __future__ import annotations

import json
import os
import warnings

from ..errors import ConfigError
from ..location import location
from .common import add_n_seeds, common_output_options, config_option, config_values, restart_hint, \
    stopped_study

CONTROL_ARMS = ["sgd", "em", "readout", "routing", "all", "sgd_tuned"]
# --controls without --seeds / --n-seeds / a preset / a config file of the user's setting seeds: ten seeds (the README's five first), paired tests
# over ten; arrays on disk for the first two seeds only (the rest log metrics)
CONTROL_SEEDS = [42, 2024, 1337, 7777, 9999, 1, 2, 3, 4, 5]
OVERRIDES = "Any config key can also be set as --key=value or --section.key=value"


def cmd_sticky(args) -> int:
    from .. import config  # deferred: keeps the config layer (~0.1 s) off `dyntool --help`
    from ..sims.sticky import StickyConfig, run_study  # deferred: keeps torch and zarr off `dyntool --help`
    from ..sims.summary import table  # deferred: keeps numpy off `dyntool --help`
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
    if args.resume is None:
        cfg = config.load(StickyConfig, _config_file(args), args.preset, args.overrides, values=values)
        start, out = None, args.out or args.default_out
    else:
        from ..sims import sticky_resume  # deferred: keeps torch off `dyntool --help`
        if args.config is not None or args.preset is not None or args.controls:
            raise ConfigError("--resume", "takes the config of the study it resumes; drop --config/--preset/"
                                          "--controls (overrides like --time_limit_min=M still apply)")
        cfg, start = sticky_resume.load(args.resume, args.overrides, values)
        if start is None:
            return 0
        out = args.out or start["out"]
    name = args.name or (start or {}).get("name")
    with _guarded(args, out), restart_hint(out, name, resumable=True):
        study = run_study(cfg, out, name=name, tags=args.tag, quiet=args.quiet, start=start)
    if stopped_study(study):
        return 0
    summary = json.loads((study / "summary.json").read_text())
    print(table(summary))
    print(f"study written to {study}")
    return 0


def _user_seeds(args) -> bool:
    """Did the user choose the seeds: an override, or a config file of their own that sets them?
    (The packaged default file's five README seeds are not a choice; --controls runs ten.)"""
    from .. import config  # deferred: keeps the config layer (~0.1 s) off `dyntool --help`
    if any(o.split("=")[0].lstrip("-") in ("seeds", "record_seeds") for o in args.overrides or []):
        return True
    if args.config is None:
        return False
    path = config.resolve_file(args.config)
    return path.resolve().parent != config.PRESETS.resolve() and "seeds" in config.read_file(path)


def cmd_sim_toy(args) -> int:
    from ..sims.toy import ToyConfig, run_toy  # deferred: keeps torch and zarr off `dyntool --help`
    run = _simulate(args, ToyConfig, "toy", run_toy)
    if run is not None:
        print(f"toy run written to {run.path}")
    return 0


def cmd_bijection(args) -> int:
    from ..sims.bijection import BijectionConfig, run_bijection  # deferred: keeps torch and zarr off `dyntool --help`
    run = _simulate(args, BijectionConfig, "bijection", run_bijection, reset={"stop_at_step": 0})
    if run is None:
        return 0
    print(json.dumps(run.meta.get("final", {}), indent=1, default=float))
    print(f"bijection run written to {run.path}")
    nxt = run.meta.get("final", {}).get("next_step")
    if nxt:
        print(nxt)
    return 0


def _simulate(args, schema: type, kind: str, run_fn, reset: dict | None = None):
    """A checkpointing simulation: its config (or the run it resumes), then ``run_fn`` under the
    Ctrl-C hint; None when a resumed run is already at its steps."""
    cfg, start = _config_or_resume(args, schema, kind, reset)
    if start is None:
        return None
    out, name = start["out"], start["name"]
    with _guarded(args, out), restart_hint(out, name, resumable=True):
        return run_fn(cfg, out, name=name, tags=args.tag, quiet=args.quiet, resume=start["ckpt"],
                      resumed_from=start["from"])


def _config_or_resume(args, schema: str | type, kind: str, reset: dict | None = None):
    """(config, start) of a sim with ``--resume`` (:mod:`dyntool.sims.resume`, as ``dyntool train
    --resume``): the config is the run's config.json ← overrides (``reset`` first: e.g. a resumed run
    goes on past the old stop_at_step), the run goes beside it as ``RUN-resumeSTEP`` unless --out/--name
    say otherwise.  Without --resume: the config file ← preset ← overrides.  ``start`` is None when the
    checkpoint is already at ``steps`` (nothing to do, said in one line)."""
    from .. import config  # deferred: keeps the config layer (~0.1 s) off `dyntool --help`
    if args.resume is None:
        cfg = config.load(schema, _config_file(args), args.preset, args.overrides, values=config_values(args))
        return cfg, {"out": args.out or args.default_out, "name": args.name, "ckpt": None, "from": None}
    from ..sims import resume  # deferred: keeps torch and zarr off `dyntool --help`
    if args.config is not None or args.preset is not None:
        raise ConfigError("--resume", "takes the config of the run it resumes; drop --config/--preset "
                                      "(overrides like --steps=N still apply)")
    base, ckpt, name, parent = resume.load(args.resume, kind)
    cfg = config.load(schema, base={**base, **(reset or {})}, overrides=args.overrides, values=config_values(args))
    if ckpt["step"] >= cfg.steps:
        print(f"dyntool: {args.resume} is already at step {ckpt['step']} = steps: nothing to do "
              f"(to train on, pass --steps N with N > {ckpt['step']})")
        return cfg, None
    return cfg, {"out": args.out or parent, "name": args.name or name, "ckpt": ckpt,
                 "from": str(location(args.resume))}


def _guarded(args, out: str):
    """The generic --out guard (cli/__init__) for an --out this command chose itself (beside the run
    it resumes, or the default): checked, and cleaned up on a refusal."""
    import contextlib

    from .. import paths  # deferred: keeps zarr off `dyntool --help`
    if args.out is not None:
        return contextlib.nullcontext()
    paths.check_out(out)
    return paths.cleanup_on_reject(out)


def _config_file(args) -> str:
    return args.config if args.config is not None else args.default_config


def _config_file_options(p, default: str) -> None:
    p.add_argument("--config", default=None, metavar="FILE",
                   help=f"TOML config: a path or a packaged preset file name (default: {default}, "
                        "shipped in dyntool/presets/)")
    p.add_argument("--preset", default=None, metavar="NAME", help="a [preset.NAME] table of the config file")
    p.set_defaults(default_config=default)


def _resume_options(p, kind: str, default_out: str) -> None:
    """--resume RUN, and --out's default chosen in the command (beside the resumed run)."""
    p.add_argument("--resume", default=None, metavar="RUN",
                   help=f"continue RUN (a stopped or finished {kind} run) from its checkpoint.pt into a new run "
                        "RUN-resumeSTEP beside it, equal to the uninterrupted run; its config is RUN's "
                        "(overrides like --steps=N or --time_limit_min=M still apply)")
    p.set_defaults(default_out=default_out)


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
    common_output_options(toy, None, default_says="runs/toy, or the folder of the --resume run")
    _resume_options(toy, "toy", os.path.join("runs", "toy"))
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
    common_output_options(p, None, what="study", default_says="runs/sticky-markov, or the folder of the --resume study")
    p.add_argument("--resume", default=None, metavar="STUDY",
                   help="continue STUDY (stopped by Ctrl-C/SIGTERM, --time_limit_min=M or --stop_at_step=N: every "
                        "run trains in one batch, so the study checkpoints as one) from its checkpoint.pt into a new "
                        "study STUDY-resumeSTEP beside it, equal to the uninterrupted one; overrides like --steps=N "
                        "still apply")
    p.set_defaults(default_out=os.path.join("runs", "sticky-markov"))
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
                  "held-out set live; the batches are drawn there and, on CUDA, the step is compiled (--compile=auto|on|off).  "
                  "A missing GPU is refused before anything is written")
    _config_file_options(b, "bijection.toml")
    common_output_options(b, None, default_says="runs/bijection, or the folder of the --resume run")
    _resume_options(b, "bijection", os.path.join("runs", "bijection"))
    b.set_defaults(fn=cmd_bijection, takes_overrides=True, writes=True)
