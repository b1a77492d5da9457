"""Command line: ``dyntool {sim,train,study,ls,info,figures,app}``.

Every user error (bad config value, unknown key, missing data, unwritable directory, corrupt
run, a malformed option) prints one line and exits with code 2; an interrupted run exits 130
after flushing.  Set ``DYNTOOL_DEBUG=1`` to see tracebacks of unexpected errors.

One meaning per option: a named flag that sets a config value is declared with
:func:`config_option`, which derives its type and checks from the schema (so ``--steps`` and
``--steps=…`` as an override can never disagree), and every flag name means the same thing in
every command (``--seeds`` is always a list, ``--n-seeds N`` always seeds 0..N-1).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

from ..errors import ConfigError, DyntoolError
from ..version import __version__
from . import app, export, figures, icl_markov, runs, sim, train
from .common import (CFG, DEFAULT_RUNS, Parser, add_n_seeds, common_output_options,  # noqa: F401
                     config_option, config_values, schema)

def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="dyntool", description=(
        "Record and explore the gradient dynamics of attention. "
        "Runs are directories (config.json, meta.json, metrics.jsonl, record.zarr)."),
        epilog="`dyntool COMMAND --help` lists a command's options.")
    p.add_argument("--version", action="version", version=f"dyntool {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    sim = sub.add_parser("sim", help="simulations (sticky Markov chain, toy head, bijection wind tunnel)",
                         description="Simulations: `dyntool sim SIM --help` lists a simulation's options.")
    sim.set_defaults(help_of=sim)
    simsub = sim.add_subparsers(dest="sim", metavar="SIM", parser_class=Parser)
    _register_optional(sub, simsub)
    return p


def _register_optional(sub, simsub) -> None:
    """Each command module of this package adds its subcommands (one module per concern)."""
    for m in (runs, sim, icl_markov, train, figures, app, export):
        m.register(sub, simsub)


def _split_unknown(unknown: list[str]) -> tuple[list[str], list[str]]:
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
    return overrides, stray


def _command_parser(parser, args):
    """The (sub)parser of the command that ``args`` came from (``dyntool sim toy`` → its own)."""
    p = parser
    for dest in ("command", "sim"):
        subs = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, dest, None)
        if subs is None or name not in subs.choices:
            break
        p = subs.choices[name]
    return p


def _near_miss(parser, args, overrides: list[str]) -> None:
    """``--max-step 20`` is a typo of ``--max-steps``, not a config key: say so (one line, exit 2).
    Only dotless names are checked (``--section.key`` is an override); top-level config keys
    (``--seed``, ``--device``) stay overrides."""
    import difflib
    cmd = _command_parser(parser, args)
    flags = sorted({o for a in cmd._actions for o in a.option_strings if o.startswith("--")})
    top = {"seed", "device"}
    ref = getattr(args, "schema", None)
    if ref:
        import dataclasses
        top |= {f.name for f in dataclasses.fields(schema(ref))}
    for ov in overrides:
        name = ov.split("=", 1)[0]
        if "." in name or name[2:].replace("-", "_") in top or name in flags:
            continue
        close = difflib.get_close_matches(name, flags, n=1, cutoff=0.75)
        if close:
            cmd.error(f"unrecognized argument {name}; did you mean {close[0]}?")


def _run(parser, argv: list[str]) -> int:
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit as e:              # --help, --version, argparse's own (one-line) errors
        return int(e.code or 0)
    overrides, stray = _split_unknown(unknown)
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    _near_miss(parser, args, overrides)
    args.overrides = overrides
    if not getattr(args, "fn", None):
        (getattr(args, "help_of", None) or parser).print_help()
        return 0 if args.command is None else 2
    if overrides and not getattr(args, "takes_overrides", False):
        raise ConfigError(overrides[0].split("=", 1)[0],
                          f"unknown option; `dyntool {args.command}` takes no --section.key=value overrides")
    if not getattr(args, "writes", False):
        return int(args.fn(args) or 0)
    from .. import paths  # deferred: keeps zarr off `dyntool --help`
    paths.check_name(getattr(args, "name", None))
    if args.out is not None:
        paths.check_out(args.out)
    with paths.cleanup_on_reject(args.out):
        return int(args.fn(args) or 0)


def _format_warning(message, category, filename, lineno, line=None, _orig=None):
    """A deprecated key or flag is the user's input: one ``dyntool: warning: …`` line, without
    Python's file path and source line; any other warning is shown as Python shows it.  (The
    format, not the display, is replaced: a caller recording warnings still records them.)"""
    from ..config import DeprecatedKeyWarning  # deferred: keeps the config layer (~0.1 s) off `dyntool --help`
    if issubclass(category, DeprecatedKeyWarning):
        return f"dyntool: warning: {message}\n"
    return _orig(message, category, filename, lineno, line)


def main(argv: list[str] | None = None) -> int:
    import warnings
    orig = warnings.formatwarning
    warnings.formatwarning = functools.partial(_format_warning, _orig=orig)
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:                                          # main() is also called in-process
        warnings.formatwarning = orig


def _main(argv: list[str]) -> int:
    try:
        parser = build_parser()
        return _run(parser, argv)
    except SystemExit as e:              # parser.error() after parsing
        return int(e.code or 0)
    except DyntoolError as e:            # next_step: what continues a run the storage lost
        nxt = getattr(e, "next_step", None)
        print(f"dyntool: error: {e}" + (f"; {nxt}" if nxt else ""), file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:              # e.g. `dyntool figures --list | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as e:
        nxt = getattr(e, "next_step", None)
        # its own line: on a terminal the progress bar's line is still open
        print(("\n" if sys.stderr.isatty() else "") +
              "dyntool: interrupted; the run was flushed and marked 'interrupted'" + (f"; {nxt}" if nxt else ""),
              file=sys.stderr)
        return 130
    except Exception as e:
        from ..paths import disk_full, out_of_gpu_memory  # deferred: keeps zarr off `dyntool --help`
        full = disk_full(e) or out_of_gpu_memory(e)
        if full is not None:
            print(f"dyntool: error: {full}", file=sys.stderr)
            return full.exit_code
        if os.environ.get("DYNTOOL_DEBUG"):
            raise
        print(f"dyntool: internal error: {type(e).__name__}: {e} (set DYNTOOL_DEBUG=1 for details)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
