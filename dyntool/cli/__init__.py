"""Command line: ``dyntool {sim,train,study,ls,info,figures,app}``.

Every user error (bad config value, unknown key, missing data, unwritable directory, corrupt
run) prints one line and exits with code 2; an interrupted run exits 130 after flushing.
Set ``DYNTOOL_DEBUG=1`` to see tracebacks of unexpected errors.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import DyntoolError

DEFAULT_RUNS = "runs"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dyntool", description=(
        "Record and explore the gradient dynamics of attention. "
        "Runs are directories (config.json, meta.json, metrics.jsonl, record.zarr)."))
    from .. import __version__
    p.add_argument("--version", action="version", version=f"dyntool {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    sim = sub.add_parser("sim", help="simulations (sticky Markov chain, toy head)")
    simsub = sim.add_subparsers(dest="sim", metavar="SIM")
    _register_optional(sub, simsub)
    return p


def _register_optional(sub, simsub) -> None:
    """Each command module of this package adds its subcommands (one module per concern)."""
    from . import app, export, figures, runs, sim, train
    for m in (runs, sim, train, figures, app, export):
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
