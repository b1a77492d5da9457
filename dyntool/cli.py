"""Command line: ``dyntool {sim,train,study,ls,info,figures,app}``.

Every user error (bad config value, unknown key, missing data, unwritable directory, corrupt
run) prints one line and exits with code 2; an interrupted run exits 130 after flushing.
Set ``DYNTOOL_DEBUG=1`` to see tracebacks of unexpected errors.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import DyntoolError

DEFAULT_RUNS = "runs"


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


# -- ls / info ------------------------------------------------------------------------------

def cmd_ls(args) -> int:
    from .run import list_runs
    runs = list_runs(args.runs_dir)
    if not runs:
        print(f"no runs under {args.runs_dir}")
        return 0
    root = Path(args.runs_dir)
    rows = [("ID", "KIND", "STATUS", "STEPS", "RECORDED", "SIZE", "TAGS")]
    for r in runs:
        last = r.metrics["step"].max() + 1 if "step" in r.metrics else 0
        rel = str(r.path.relative_to(root)) if r.path.is_relative_to(root) else str(r.path)
        status = r.status + (" (!)" if r.problems else "")
        rows.append((rel, r.kind, status, str(int(last)), str(r.steps_written), _human(r.size_bytes()),
                     ",".join(r.meta.get("tags", []))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0


def cmd_info(args) -> int:
    import json
    from .run import open_run
    r = open_run(args.run)
    m = r.meta
    print(f"run      {r.id}  ({r.path})")
    print(f"kind     {r.kind}   status {r.status}   device {m.get('device', '?')}")
    print(f"created  {m.get('created', '?')}   updated {m.get('updated', '?')}")
    print(f"versions dyntool {m.get('dyntool')}  torch {m.get('torch')}  numpy {m.get('numpy')}  "
          f"git {str(m.get('git_commit'))[:10]}{'+dirty' if m.get('git_dirty') else ''}")
    print(f"seeds    {m.get('seeds')}   tags {m.get('tags')}")
    if m.get("final"):
        print(f"final    {json.dumps(m['final'])}")
    print("config   " + json.dumps(r.config, separators=(",", "=")).replace('"', "")[:600])
    df = r.metrics
    if len(df):
        print(f"metrics  {len(df)} rows, columns: {', '.join(c for c in df.columns if c != 'step')}")
    arrays = r.arrays
    print(f"record   {r.steps_written} steps committed, {_human(r.size_bytes())} on disk")
    for name, a in arrays.items():
        dims = ", ".join(f"{d}={s}" for d, s in zip(a.dims, a.shape))
        print(f"  {name:<20} {str(a.dtype):<8} ({dims})")
    for p in r.problems:
        print(f"problem  {p}")
    return 0


# -- sim ------------------------------------------------------------------------------------

def _load_cfg(cls, args):
    from . import config
    return config.load(cls, getattr(args, "config", None), getattr(args, "preset", None), args.overrides)


def cmd_sim_toy(args) -> int:
    from .sims.toy import ToyConfig, run_toy
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"--steps={args.steps}")
    args.overrides = overrides
    cfg = _load_cfg(ToyConfig, args)
    run = run_toy(cfg, args.out, name=args.name, tags=args.tag)
    print(f"toy run written to {run.path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dyntool", description=(
        "Record and explore the gradient dynamics of attention. "
        "Runs are directories (config.json, meta.json, metrics.jsonl, record.zarr)."))
    from . import __version__
    p.add_argument("--version", action="version", version=f"dyntool {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ls = sub.add_parser("ls", help="table of runs under RUNS_DIR")
    ls.add_argument("runs_dir", nargs="?", default=DEFAULT_RUNS)
    ls.set_defaults(fn=cmd_ls)

    info = sub.add_parser("info", help="config summary, arrays (shapes, dimension names), size of a run")
    info.add_argument("run")
    info.set_defaults(fn=cmd_info)

    sim = sub.add_parser("sim", help="simulations (sticky Markov chain, toy head)")
    simsub = sim.add_subparsers(dest="sim", metavar="SIM")
    toy = simsub.add_parser("toy", help="the T=5 toy head of spec §4.1, recorded every step",
                            epilog="Any config key can be set as --section.key=value, e.g. --model.causal=true --lr=0.1")
    toy.add_argument("--steps", type=int, default=None)
    toy.add_argument("--out", default=os.path.join(DEFAULT_RUNS, "toy"))
    toy.add_argument("--name", default=None, help="run directory name (default: kind-date-random)")
    toy.add_argument("--tag", action="append", default=[])
    toy.add_argument("--config", default=None, help="TOML file")
    toy.add_argument("--preset", default=None)
    toy.set_defaults(fn=cmd_sim_toy)
    _register_optional(sub, simsub)
    return p


def _register_optional(sub, simsub) -> None:
    """Commands contributed by other modules register themselves here (sims, train, app, figures)."""
    import importlib
    for mod in ("dyntool.sims.cli", "dyntool.train.cli", "dyntool.figures_cli", "dyntool.app_cli"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            # the optional module (or its package) is absent: skip; a missing dependency *inside*
            # a present module is a real error and propagates
            if e.name and mod.startswith(e.name):
                continue
            raise
        m.register(sub, simsub)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    overrides, stray, i = [], [], 0
    while i < len(unknown):              # accept --key=value and --key value
        u = unknown[i]
        if u.startswith("--") and "=" in u:
            overrides.append(u)
        elif u.startswith("--") and i + 1 < len(unknown) and not unknown[i + 1].startswith("--"):
            overrides.append(f"{u}={unknown[i + 1]}")
            i += 1
        else:
            stray.append(u)
        i += 1
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = overrides
    if not getattr(args, "fn", None):
        parser.print_help()
        return 0 if args.command is None else 2
    if overrides and not hasattr(args, "config"):
        parser.error(f"{args.command} takes no --section.key=value overrides")
    try:
        return int(args.fn(args) or 0)
    except DyntoolError as e:
        print(f"dyntool: error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:              # e.g. `dyntool figures --list | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("dyntool: interrupted; the run was flushed and marked 'interrupted'", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("DYNTOOL_DEBUG"):
            raise
        print(f"dyntool: internal error: {type(e).__name__}: {e} (set DYNTOOL_DEBUG=1 for details)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
