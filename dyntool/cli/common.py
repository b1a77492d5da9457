"""What the command modules share (one definition each): option helpers that take their types from
the config schema, the output options, the default runs folder.  Below ``dyntool.cli`` and every
command module, so no command module imports the package that imports it."""
from __future__ import annotations

import argparse
import contextlib
import functools
import json

from ..errors import ConfigError, StorageError

DEFAULT_RUNS = "runs"
CFG = "cfg:"          # argparse dest prefix of flags that set a config key


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``dyntool sim toy: error: …``), exit 2, and no prefix
    matching (``--step`` must not silently mean ``--steps``)."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def schema(ref: str) -> type:
    """``"dyntool.sims.toy:ToyConfig"`` → the class (imported on first use: ``dyntool ls`` stays light)."""
    import importlib
    mod, _, name = ref.partition(":")
    return getattr(importlib.import_module(mod), name)


def _parse_for(ref: str, key: str, text: str):
    from .. import config  # deferred: keeps the config layer (~0.1 s) off `dyntool --help`
    return config.parse_value(schema(ref), key, text)


def config_option(p: argparse.ArgumentParser, ref: str, key: str, *flags: str, help: str,
                  metavar: str | None = None) -> None:
    """Add a flag that sets config ``key`` of schema ``ref`` ("module:Class"): parsed and checked
    exactly as the config parses ``--key=value`` (same type, bounds, list syntax), handed over typed."""
    flags = flags or ("--" + key.rsplit(".", 1)[-1].replace("_", "-"),)
    p.add_argument(*flags, dest=CFG + key, default=None, metavar=metavar or key.rsplit(".", 1)[-1].upper(),
                   type=functools.partial(_parse_for, ref, key), help=f"{help} [config: {key}]")
    p.set_defaults(schema=ref)


def add_n_seeds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-seeds", type=int, default=None, metavar="N", dest="n_seeds",
                   help="run seeds 0, 1, ..., N-1 (shorthand for --seeds 0,1,...,N-1)")


def config_values(args, seeds_key: str = "seeds") -> dict:
    """The typed values of the command's :func:`config_option` flags, by dotted key."""
    values = {k[len(CFG):]: v for k, v in vars(args).items() if k.startswith(CFG) and v is not None}
    n = getattr(args, "n_seeds", None)
    if n is not None:
        if seeds_key in values:
            raise ConfigError("--n-seeds", "give either --seeds LIST or --n-seeds N, not both")
        if n < 1:
            raise ConfigError("--n-seeds", f"must be >= 1, got {n}")
        values[seeds_key] = list(range(n))
    return values


def common_output_options(p: argparse.ArgumentParser, out_default: str | None, what: str = "run",
                          default_says: str | None = None) -> None:
    p.add_argument("--out", default=out_default, metavar="DIR",
                   help=f"parent folder of the {what} (default: {default_says or out_default}); "
                        "never inside a run")
    p.add_argument("--name", default=None,
                   help=f"{what} directory name, one path component (default: generated from kind and date)")
    p.add_argument("--tag", action="append", default=[], metavar="TAG",
                   help="label stored in meta.json (repeatable); the app filters by it")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def stopped_study(study) -> bool:
    """A sim study that stopped before its summary (Ctrl-C, a time limit, ``--stop_at_step``):
    print the command that continues it (study.json's ``next_step``) and say so."""
    if (study / "summary.json").is_file():
        return False
    print(json.loads((study / "study.json").read_text())["next_step"])
    return True


@contextlib.contextmanager
def restart_hint(out: str, name: str | None = None, resumable: bool = False):
    """A simulation stopped by Ctrl-C says what is kept and how to go on (the message the CLI prints
    after "interrupted;").  One that checkpoints (``resumable``: every ``sim``; dyntool/sims/resume.py)
    has already said ``--resume RUN`` when it got that far; before its first checkpoint, and for a
    simulation without one, the command starts again, into a new folder; with ``--name`` that folder
    now exists (kept), so the same command would be refused."""
    try:
        yield
    except (KeyboardInterrupt, StorageError) as e:     # StorageError: the object store stayed down
        if getattr(e, "next_step", None) is None:
            again = ("the same command starts it again, into a new folder" if not name else
                     f"the same command with another --name (or none; {name} is kept) starts it again")
            why = "it stopped before its first checkpoint" if resumable else "a simulation keeps no checkpoint"
            e.next_step = f"see it with: dyntool ls {out}; {why}, so {again}"
        raise
