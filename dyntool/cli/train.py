"""``dyntool train`` and ``dyntool study``.

    dyntool train --config wikitext_mhsa --preset small [--max-steps N] [--out DIR]
                  [--name NAME] [--resume RUN] [--section.key=value ...]
    torchrun --nproc_per_node=2 -m dyntool train --config ...        # DDP, rank 0 writes the run
    torchrun --nproc_per_node=2 -m dyntool train --parallel=fsdp ... # FSDP2, every rank records its shard
    dyntool study span|ls-logits [--seeds LIST | --n-seeds N] [--max-steps N] [--arms LIST] [--preset NAME] [--out DIR]
"""
from __future__ import annotations

import os

from ..errors import ConfigError
from ..location import location
from .common import add_n_seeds, common_output_options, config_option, config_values

TRAIN = "dyntool.train.config:TrainConfig"
STUDY = "dyntool.train.studies:StudyConfig"
OVERRIDES = "Any config key can also be set as --section.key=value, e.g. --model.n_layer=2 --optim.lr=1e-3"


def cmd_train(args) -> int:
    from .. import paths  # deferred: keeps zarr off `dyntool --help`
    if args.config is None and args.resume is None:
        raise ConfigError("--config", "dyntool train needs --config FILE (e.g. wikitext_mhsa, a packaged "
                                      "preset file) or --resume RUN")
    if args.resume is None:   # a section's bad value is refused before torch loads (seconds when loaded)
        from .. import config  # deferred: keeps the config layer (~0.1 s) off `dyntool --help`
        from ..train.config import TrainConfig  # deferred: keeps numpy off `dyntool --help`
        config.load(TrainConfig, args.config, args.preset, args.overrides, values=config_values(args))
    # deferred: keeps torch and zarr off `dyntool --help`
    from ..train.runner import DEFAULT_OUT, NothingToDo, load_config, run_training
    if args.resume is not None:
        args.resume = str(location(args.resume, "--resume"))   # one line for gs://, '', ~nosuchuser
        from ..train.resume_data import check_trainable  # deferred: keeps zarr off `dyntool --help`
        check_trainable(args.resume)
    cfg = load_config(args.config, args.preset, args.overrides, args.resume, values=config_values(args))
    if args.resume is not None:                # the data folder the run read, not a new search
        from ..storage import open_backend  # deferred: keeps zarr off `dyntool --help`
        from ..train.resume_data import use_recorded_data
        use_recorded_data(cfg, open_backend(args.resume, "--resume", root="/"))
    if args.out is None and args.resume:
        out = str(location(args.resume).parent)                 # beside the run it resumes
    else:
        out = args.out or DEFAULT_OUT
    if args.out is None:                     # the generic guard only saw an explicit --out
        paths.check_out(out)
    try:
        with paths.cleanup_on_reject(out):
            path, final = run_training(cfg, out, name=args.name, resume=args.resume, tags=args.tag,
                                       quiet=args.quiet)
    except NothingToDo as e:          # a finished run resumed without a higher --max-steps
        print(f"dyntool: {e}")
        return 0
    if path is not None:
        from ..train.recording import bounded  # deferred: keeps torch and zarr off `dyntool --help`
        extra = ""
        if "best_val_ppl" in final:
            extra += f" (best val ppl {final['best_val_ppl']:.2f} at step {final['best_val_step']}"
        if "valid_ppl" in final:
            extra += ("; " if extra else " (") + \
                f"final valid ppl {final['valid_ppl']:.2f}, test ppl {final['test_ppl']:.2f}{bounded(final)}"
        from ..train.recording import time_summary  # deferred: keeps torch and zarr off `dyntool --help`
        print(f"train run written to {path}{extra + ')' if extra else ''}; {time_summary(final)}")
    return 0


def cmd_study(args) -> int:
    from .. import config  # deferred: keeps the config layer (~0.1 s) off `dyntool --help`
    from ..train.studies import StudyConfig, run_study  # deferred: keeps torch and zarr off `dyntool --help`
    study = config.load(StudyConfig, values=config_values(args))
    run_study(args.study, out=args.out, study=study, preset=args.preset, overrides=list(args.overrides),
              quiet=args.quiet, name=args.name, tags=args.tag)
    return 0


def register(sub, simsub) -> None:
    t = sub.add_parser("train", help="train a GPT on WikiText-2 (mhsa / ls / span / qknorm), recorded",
                       description="Train a GPT on WikiText-2, recording the attention dynamics.",
                       epilog=f"{OVERRIDES} --record.every=25.  Config files: wikitext_mhsa, wikitext_ls, "
                              "wikitext_span, wikitext_qknorm (presets small: CPU, gpu: one CUDA GPU).")
    t.add_argument("--config", default=None, metavar="FILE",
                   help="TOML config: a path or a packaged preset file name, e.g. wikitext_mhsa "
                        "(dyntool/presets/wikitext_mhsa.toml also works)")
    t.add_argument("--preset", default=None, metavar="NAME",
                   help="a [preset.NAME] table of the config file (small: CPU; gpu: one CUDA GPU)")
    config_option(t, TRAIN, "train.max_steps", "--max-steps", metavar="N",
                  help="optimizer steps; the LR schedule spans them (>= 1)")
    config_option(t, TRAIN, "train.parallel", "--parallel", metavar="ddp|fsdp",
                  help="under torchrun: ddp (default; rank 0 records) or fsdp (FSDP2: every rank "
                       "records its own shard of the probe)")
    t.add_argument("--resume", default=None, metavar="RUN",
                   help="continue RUN from its checkpoint.pt into a new run (exact on CPU; on CUDA "
                        "with --train.deterministic=true); a run at its max_steps needs "
                        "--max-steps N higher, else 'nothing to do' (exit 0, no run created)")
    common_output_options(t, None, what="run", default_says="runs/wikitext, or the folder of the --resume run")
    t.set_defaults(fn=cmd_train, takes_overrides=True, writes=True)

    s = sub.add_parser("study", help="multi-run studies: span (baseline vs span-recon), "
                                     "ls-logits (max-logit growth of mhsa vs ls vs qknorm), "
                                     "atlas (every head of a WikiText GPT, every step: sinks, induction)",
                       description="Train every arm of a study for each seed into one study folder "
                                   "(runs + summary.json) and print its table.",
                       epilog=f"{OVERRIDES} (applied to every run of the study).")
    s.add_argument("study", choices=["span", "ls-logits", "atlas"],
                   help="span: mhsa vs span-recon; ls-logits: mhsa vs ls vs qknorm in the LS paper's configuration "
                        "(n/d = 64, lr 6e-4; its regime only at --preset gpu); atlas: mhsa vs qknorm, every "
                        "head's sink/induction scores and driving gradients per step (presets ci, cpu, gpu; "
                        "--atlas.every=N etc. set its probe, docs/atlas.md)")
    config_option(s, STUDY, "seeds", metavar="S[,S...]", help="comma-separated seeds (default 0,1,2)")
    add_n_seeds(s)
    config_option(s, STUDY, "max_steps", "--max-steps", metavar="N",
                  help="optimizer steps of every run, >= 1 (default: the preset's)")
    config_option(s, STUDY, "arms", metavar="A[,A...]",
                  help="ls-logits: run only these arms (of mhsa, mhsa-eager-fp32 (gpu), ls, qknorm; default all); "
                       "atlas: of mhsa, qknorm")
    s.add_argument("--preset", default="small", metavar="NAME",
                   help="preset of the packaged config files (default small; ls-logits: cpu = small, gpu)")
    common_output_options(s, os.path.join("runs", "studies"), what="study")
    s.set_defaults(fn=cmd_study, takes_overrides=True, writes=True)
