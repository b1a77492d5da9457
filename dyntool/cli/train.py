"""``dyntool train`` and ``dyntool study``.

    dyntool train --config sims/wikitext_mhsa.toml --preset small [--max-steps N] [--out DIR]
                  [--name NAME] [--resume RUN] [--section.key=value ...]
    torchrun --nproc_per_node=2 -m dyntool train --config ...        # DDP, rank 0 writes the run
    dyntool study span|ls-logits [--seeds N] [--max-steps N] [--preset NAME] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import ConfigError
from ..train.runner import DEFAULT_OUT, NothingToDo, load_config, run_training


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
    try:
        path, final = run_training(cfg, out, name=args.name, resume=args.resume, tags=args.tag,
                                   quiet=args.quiet)
    except NothingToDo as e:          # a finished run resumed without a higher --max-steps
        print(f"dyntool: {e}")
        return 0
    if path is not None:
        extra = ""
        if "best_val_ppl" in final:
            extra += f" (best val ppl {final['best_val_ppl']:.2f} at step {final['best_val_step'] + 1}"
        if "valid_ppl" in final:
            extra += ("; " if extra else " (") + \
                f"final valid ppl {final['valid_ppl']:.2f}, test ppl {final['test_ppl']:.2f}"
        print(f"train run written to {path}{extra + ')' if extra else ''}")
    return 0


def cmd_study(args) -> int:
    from ..train.studies import run_study
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
                   help="continue RUN from its checkpoint.pt into a new run (exact on CPU; on CUDA "
                        "with --train.deterministic=true); a run at its max_steps needs "
                        "--max-steps N higher, else 'nothing to do' (exit 0, no run created)")
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
