"""``dyntool figures [RUN_OR_STUDY ...] --out DIR [--format pdf,png,svg] [--only NAME[,NAME]]``.

Draws every figure the given runs support (default input: ``runs/``), writes each as
``NAME.{pdf,png,svg}`` + ``NAME.csv|json`` (the data behind it) + ``NAME.txt`` (caption), and says
which figures it skipped and why.  A directory that is not a run (a study, a runs folder) is
expanded into the runs below it.
"""
from __future__ import annotations

import sys

from ..errors import ConfigError, RunError
from ..location import location

DEFAULT_INPUT = "runs"
DPI_RANGE = (30, 1200)          # beyond 1200 dpi a page-sized figure needs gigabytes of raster


def collect_runs(inputs: list[str]) -> list:
    """Runs named by ``inputs`` (run dirs, study dirs, runs folders), each at most once, in order."""
    # deferred: keeps zarr off `dyntool --help` (every command's parser is built for it)
    from ..run import list_runs, open_run
    from ..storage import open_backend
    out, seen = [], set()
    for item in inputs:
        p = location(item, "RUN_OR_STUDY")
        backend = open_backend(p, "RUN_OR_STUDY")
        if not (backend.is_dir() or backend.exists()):      # a file goes on, to be refused below
            raise RunError(f"{p} does not exist")
        found = [open_run(backend)] if backend.is_run() else list_runs(p)
        if not found:
            raise RunError(f"{p} holds no runs")
        for r in found:
            key = r.path.resolve()                  # one key per run, however it was named
            if key not in seen:
                seen.add(key)
                out.append(r)
    return out


def _dpi(text: str) -> int:
    try:
        dpi = int(text)
    except ValueError:
        raise ConfigError("--dpi", f"expected an integer, got {text!r}") from None
    lo, hi = DPI_RANGE
    if not lo <= dpi <= hi:
        raise ConfigError("--dpi", f"must be between {lo} and {hi}, got {dpi}")
    return dpi


def cmd_figures(args) -> int:
    from ..storage import open_backend      # deferred: keeps zarr off `dyntool --help`
    if not args.list:
        # the user's paths are checked before the figure modules load (matplotlib and torch:
        # seconds, more on a loaded machine, before a typo was reported)
        if not args.out:
            raise ConfigError("--out", "DIR is required (where the figures are written)")
        if not open_backend(args.out, "--out").plain_files:
            raise ConfigError("--out", f"{args.out}: figures are written to a local folder "
                                       "(runs in object storage are read, never written, by figures)")
        inputs = args.inputs or [DEFAULT_INPUT]
        runs = collect_runs(inputs)
    # deferred: matplotlib and torch load after the user's paths are checked (above)
    from ..figures import FIGURES, export_all, load
    from ..figures.writer import parse_formats
    from ..figures.registry import FigureError
    load()
    if args.list:
        width = max(len(n) for n in FIGURES)
        for name, spec in FIGURES.items():
            print(f"{name:<{width}}  {spec.title}\n{'':<{width}}  needs: {spec.needs}")
        return 0
    formats = parse_formats(args.format)
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    unknown = [n for n in only or [] if n not in FIGURES]
    if unknown:
        raise FigureError(f"unknown figure(s) {', '.join(unknown)}; see dyntool figures --list")
    for r in runs:
        for prob in r.problems:
            print(f"warning: {r.path}: {prob}", file=sys.stderr)
    from ..figures.common import where      # deferred: as the figure modules above
    from ..run import study_summary
    for study in dict.fromkeys(where(r).parent for r in runs):   # the study figures read its summary
        said: list[str] = []
        study_summary(study, said)
        for prob in said:
            print(f"warning: {study}: {prob}; figures that read it are skipped", file=sys.stderr)
    print(f"{len(runs)} run(s) from {', '.join(inputs)}; writing {'/'.join(formats)} to {args.out}")

    def log(name, rep):
        if name in rep.written:
            files = ", ".join(p.name for p in rep.written[name])
            print(f"  wrote   {name:<20} {files}  ({rep.seconds[name]:.1f}s)", flush=True)

    rep = export_all(runs, args.out, formats, only=only, dpi=args.dpi, log=log)
    # one run per recorded_* figure: name the others
    from ..figures.recorded import not_drawn       # deferred: as the figure modules above
    for (drawn, rest), names in not_drawn(runs, rep.written).items():
        print(f"  note    {', '.join(names)} drew {drawn} only; not drawn: {', '.join(rest)} "
              f"(give each run its own `dyntool figures RUN --out DIR`)")
    for name, why in rep.skipped.items():
        print(f"  skipped {name:<20} {why}")
    for name, why in rep.failed.items():
        print(f"  FAILED  {name:<20} {why} (set DYNTOOL_DEBUG=1 for details)")
    print(f"{len(rep.written)} figure(s) written, {len(rep.skipped)} skipped"
          + (f", {len(rep.failed)} failed" if rep.failed else ""))
    return 1 if rep.failed else 0


def register(sub, simsub) -> None:
    f = sub.add_parser("figures", help="publication figures (PDF/PNG/SVG + data + caption) from runs",
                       description="Draw every figure the given runs support; skipped figures are listed "
                                   "with the reason.  Inputs may be runs, studies or folders of runs.")
    f.add_argument("inputs", nargs="*", metavar="RUN_OR_STUDY",
                   help=f"run or study directories, or folders holding them (default: {DEFAULT_INPUT}/)")
    f.add_argument("--out", default=None, metavar="DIR",
                   help="output directory (required; created if needed, never inside a run)")
    f.add_argument("--format", default="pdf,png", help="comma list of pdf, png, svg (default pdf,png)")
    f.add_argument("--only", default=None, metavar="NAME[,NAME]", help="only these figures (see --list)")
    f.add_argument("--dpi", type=_dpi, default=None,
                   help=f"raster resolution, {DPI_RANGE[0]}-{DPI_RANGE[1]} (default 300)")
    f.add_argument("--list", action="store_true", help="list the figures and what each needs, then exit")
    f.set_defaults(fn=cmd_figures, writes=True)
