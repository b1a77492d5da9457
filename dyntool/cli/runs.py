"""``dyntool ls``, ``dyntool info`` and ``dyntool check``: what is in a runs folder, in one run
(or study), and whether every committed chunk of a recording reads back.

All three read through :mod:`dyntool.run` (the one safe reader): a malformed run is listed as
``corrupt`` with its problems, never aborts a listing, and nothing outside the given folder is read.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from ..errors import DyntoolError, RunError
from ..location import location
from ..steps import logs_final_state, steps_taken
from .common import DEFAULT_RUNS

LABEL = 9            # `dyntool info`: every value starts in this column
STUDY_LINES, STUDY_RUNS = 12, 20     # `dyntool info STUDY`: a screenful; the rest is in summary.json / ls


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _status(r) -> str:
    return "corrupt" if r.corrupt else r.status


def _natural(text: str) -> list:
    """``seed7`` before ``seed42`` before ``seed2024``: digits compare as numbers."""
    import re
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _ordered(runs) -> list:
    """Runs of one folder (a study's seeds and arms) together, in natural order of their names;
    the folders newest first, as ``list_runs`` orders runs (the app keeps that order)."""
    newest: dict[str, str] = {}
    for r in runs:
        parent = str(r.path.parent)
        newest[parent] = max(newest.get(parent, ""), str(r.meta.get("created", "")))
    return sorted(runs, key=lambda r: (_Desc(newest[str(r.path.parent)]), str(r.path.parent), _natural(r.path.name)))


class _Desc(str):
    """A string that sorts in reverse (newest folder first inside an ascending sort key)."""
    def __lt__(self, other):
        return str.__gt__(self, other)


def _size_means(r) -> str:
    """What a run's size counts, said where it is shown: the same run reads 14 MB on a disk and
    661 KB in object storage (docs/scale.md)."""
    if r.backend.plain_files:
        return "on disk (allocated blocks, as du counts them: each small chunk file takes a whole block)"
    return "stored (the objects' bytes)"


def _table(runs, root) -> list[str]:
    rows = [("ID", "KIND", "STATUS", "STEPS", "RECORDED", "SIZE", "TAGS")]
    for r in _ordered(runs):
        last = steps_taken(r.meta, r.metrics)
        rel = str(r.path.relative_to(root)) if r.path.is_relative_to(root) else str(r.path)
        rows.append((rel, r.kind, _status(r), str(last), str(r.steps_written), _human(r.size_bytes()),
                     ",".join(r.meta.get("tags", []))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def cmd_ls(args) -> int:
    from ..run import list_runs  # deferred: keeps zarr off `dyntool --help`
    root = location(args.runs_dir, "RUNS_DIR")
    runs = list_runs(root)
    if not runs:
        print(f"no runs under {args.runs_dir}")
        return 0
    print("\n".join(_table(runs, root)))
    bad = [r for r in runs if r.corrupt]
    if bad:
        print(f"\n{len(bad)} corrupt run(s): `dyntool info RUN` says what is wrong, "
              "`dyntool check RUN` reads every chunk")
    return 0


def _flat(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _config_lines(config: dict, width: int = 100) -> list[str]:
    """The resolved config as ``key=value`` items wrapped at item boundaries (never cut mid-word)."""
    items = [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in _flat(config)]
    return textwrap.wrap("  ".join(items), width=width, initial_indent="config   ",
                         subsequent_indent="         ", break_long_words=False, break_on_hyphens=False) \
        or ["config   (empty)"]


def _short(v) -> str | None:
    """A summary value in a few characters: numbers to 4 significant digits, short lists of
    scalars; None for long lists and nested lists (per-seed curves), which belong in the file."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        if len(v) > 8 or any(isinstance(x, (list, dict)) for x in v):
            return None
        return "[" + ",".join(_short(x) or "…" for x in v) + "]"
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)      # "±", not "\u00b1"


def _paths_line(paths: dict) -> str:
    """The cheap tier's path per attention site (meta ``attention_paths``), grouped: which sites
    ran in the fused kernel and which on the eager path, with the reason."""
    from collections import defaultdict
    groups = defaultdict(list)
    for site, how in paths.items():
        groups[str(how)].append(str(site))
    return "; ".join(f"{how}: {', '.join(sites[:6])}{' …' if len(sites) > 6 else ''}" for how, sites in groups.items())


SIGNALS = {"signal 15": "SIGTERM (signal 15: kill, a scheduler or torchrun stopping it)",
           "signal 2": "SIGINT (signal 2: Ctrl-C)", "interrupted": "Ctrl-C (SIGINT)"}


def _command(next_step) -> str:
    """The command of a ``next_step`` sentence ("...; continue with: CMD" → CMD)."""
    return str(next_step).split("continue with: ", 1)[-1]


def _stopped_rows(r) -> list[tuple[str, str]]:
    """Why an interrupted or failed run stopped, and the command that continues it: what the
    trainer said when it stopped (meta ``next_step``), else what the run's files allow."""
    m = r.meta
    if r.status not in ("interrupted", "failed"):
        return []
    err = str(m.get("error") or "")
    rows = [("stopped", f"by {SIGNALS.get(err, err or 'an interrupt')}" if r.status == "interrupted"
             else f"failed: {err or 'no error recorded'}")]
    if m.get("next_step"):
        rows.append(("continue", _command(m["next_step"])))
    elif r.kind == "train" and r.backend.what_is("checkpoint.pt") == "file":
        import shlex
        rows.append(("continue", f"dyntool train --resume {shlex.quote(str(r.path))}"))
    elif r.kind != "train":
        rows.append(("continue", "a simulation keeps no checkpoint: its command starts it again, into a new "
                                 "folder (without --name, or with a new one)"))
    return rows


def _info_study(path) -> int:
    """A study (or any folder of runs): what is in it, its summary.json, and the runs table."""
    from collections import Counter
    from ..run import list_runs, study_summary  # deferred: keeps zarr off `dyntool --help`
    from .study_tables import study_table  # deferred: keeps numpy off `dyntool --help`
    runs = list_runs(path)
    if not runs:
        raise RunError(f"{path} is neither a run nor a folder holding runs")
    kinds = Counter(r.kind for r in runs)
    statuses = Counter(_status(r) for r in runs)
    size = sum(r.size_bytes() for r in runs)          # the runs only: `info /` must not walk the disk
    print(f"study    {path}  ({len(runs)} runs, {_human(size)} on disk)")
    print(f"kinds    {', '.join(f'{k} ×{n}' for k, n in kinds.items())}")
    print(f"status   {', '.join(f'{s} ×{n}' for s, n in statuses.items())}")
    said: list[str] = []
    s = study_summary(path, said)
    for q in said:
        print(f"problem  {q}")
    if nxt := _study_next_step(path):                  # a stopped sim study (dyntool/sims/*_resume.py)
        print(f"continue {nxt}")
    table = study_table(s) if s else None
    if table:
        print(f"summary  {path / 'summary.json'}:")
        for line in table:
            print(f"  {line}" if line else "")
    elif s:
        print(f"         (long lists such as per-seed curves are left out: see {path / 'summary.json'})")
        items = [f"{k}={_short(v)}" for k, v in _flat(s) if _short(v) is not None]
        lines = textwrap.wrap("  ".join(items), 100, initial_indent="summary  ",
                              subsequent_indent="         ", break_long_words=False)
        for line in lines[:STUDY_LINES]:
            print(line)
        if len(lines) > STUDY_LINES:
            print(f"         … {len(lines) - STUDY_LINES} more lines of values: see {path / 'summary.json'}")
    print()
    table = _table(runs, path)
    print("\n".join(table[:STUDY_RUNS + 1]))
    if len(table) > STUDY_RUNS + 1:
        print(f"… {len(table) - STUDY_RUNS - 1} more runs: `dyntool ls {path}` lists them all")
    return 0


def _study_next_step(path) -> str | None:
    """A stopped study's study.json says what continues it (None: it finished, or says nothing)."""
    try:
        raw = json.loads((Path(path) / "study.json").read_text())
    except (OSError, ValueError, TypeError):
        return None
    nxt = raw.get("next_step") if isinstance(raw, dict) else None
    return _command(nxt) if nxt else None


def cmd_info(args) -> int:
    # deferred: keeps the record package (dataclasses, inspect) off `dyntool --help`
    from ..record.sites import site_lines
    from ..run import open_run  # deferred: keeps zarr off `dyntool --help`
    from ..storage import open_backend
    p = location(args.run, "RUN_OR_STUDY")
    backend = open_backend(p, "RUN_OR_STUDY")
    if backend.is_dir() and not backend.is_run():
        return _info_study(p)
    r = open_run(backend)                      # the backend that answered, not a second one
    m = r.meta
    if args.verify:
        r.check(full=True)
    df = r.metrics
    status = f"{_status(r)}{f' (meta: {r.status})' if r.corrupt else ''}"
    git = f"{str(m.get('git_commit'))[:10]}{'+dirty' if m.get('git_dirty') else ''}"
    rows = [("run", f"{r.id}  ({r.path})"), ("kind", r.kind), ("status", status),
            ("device", m.get("device", "?")), ("created", m.get("created", "?")),
            ("updated", m.get("updated", "?")),
            ("versions", f"dyntool {m.get('dyntool')}  torch {m.get('torch')}  numpy {m.get('numpy')}  git {git}"),
            ("seeds", m.get("seeds")), ("tags", m.get("tags"))]
    rows += _stopped_rows(r)
    n = steps_taken(m, df)
    if "step" in df and len(df):
        lo, hi = int(df["step"].min()), int(df["step"].max())
        state0 = "; step 0 = the initial state" if logs_final_state(m) and lo == 0 else \
            f"; row {hi} = the validation after the last step" if hi == n and not logs_final_state(m) else ""
        rows.append(("steps", f"{n} optimizer steps taken (metrics rows at steps {lo}..{hi}{state0})"))
    else:
        rows.append(("steps", f"{n} optimizer steps taken"))
    if m.get("final"):
        rows.append(("final", json.dumps(m["final"])))
    if isinstance(m.get("attention_paths"), dict) and m["attention_paths"]:
        rows.append(("paths", _paths_line(m["attention_paths"])))
    for label, value in rows:
        print(f"{label:<{LABEL}}{value}")
    for line in _config_lines(r.config):
        print(line)
    if len(df):
        print(f"{'metrics':<{LABEL}}{len(df)} rows, columns: {', '.join(c for c in df.columns if c != 'step')}")
    rec = r.steps
    shown = [str(int(x)) for x in rec] if len(rec) <= 4 else [*(str(int(x)) for x in rec[:3]), "…", str(int(rec[-1]))]
    at = f" (steps {', '.join(shown)})" if len(rec) else ""
    print(f"{'record':<{LABEL}}{r.steps_written} recorded states{at}, {_human(r.size_bytes())} {_size_means(r)}")
    arrays = list(r.arrays.items())
    wn = max((len(k) for k, _ in arrays), default=0)
    wd = max((len(str(a.dtype)) for _, a in arrays), default=0)
    for name, a in arrays:
        dims = ", ".join(f"{d}={s}" for d, s in zip(a.dims, a.shape))
        print(f"  {name:<{wn}}  {str(a.dtype):<{wd}}  ({dims})")
    problems = r.problems                     # checks the record first: its notes come with it
    st = r.store
    for i, line in enumerate(site_lines(getattr(st, "attrs", None) if st else None)):
        print(f"{'sites' if i == 0 else '':<{LABEL}}{line}")
    for note in r.notes:
        print(f"{'note':<{LABEL}}{note}")
    for p in problems:
        print(f"{'problem':<{LABEL}}{p}")
    if args.verify:
        print(f"{'verify':<{LABEL}}{'every committed chunk reads back' if not r.problems else f'{len(r.problems)} problem(s)'}")
        return 1 if r.problems else 0
    return 0


def cmd_check(args) -> int:
    """Decode every committed chunk of each run (checksums checked where the record has them);
    exit 1 when any run has a problem, when the folder's own summary.json (a study's) can't be
    read, or when there is no run to check."""
    from ..run import list_runs, open_run, study_summary  # deferred: keeps zarr off `dyntool --help`
    from ..storage import open_backend
    p = location(args.run, "RUN_OR_FOLDER")
    backend = open_backend(p, "RUN_OR_FOLDER")
    if not backend.is_dir():
        raise RunError(f"{p} is a file, not a folder" if backend.exists() else f"no run or folder at {p}")
    one = backend.is_run()                     # asked once: on object storage it is a request
    runs = [open_run(backend)] if one else list_runs(p)
    if not runs:
        print(f"{p}: no runs here (nothing checked)")
        return 1
    bad, said = 0, []
    if not one:                                # a study's own file: its table, figures and app read it
        study_summary(p, said)
        for q in said:
            print(f"{p}: {q}")
    for r in runs:
        problems = r.check(full=True)
        if problems:
            bad += 1
            print(f"{r.path}: {len(problems)} problem(s)")
            for q in problems:
                print(f"  {q}")
        else:
            print(f"{r.path}: ok ({r.steps_written} steps committed)")
        for n in r.notes:
            print(f"  note: {n}")
        note = None if problems else _precision_note(r)    # a damaged run's arrays are not read again
        if note:
            print(f"  note: {note}")
    if len(runs) > 1:
        print(f"{len(runs) - bad} of {len(runs)} run(s) ok")
    return 1 if bad or said else 0


def _precision_note(run) -> str | None:
    """A data-quality note (not a problem: the run reads fine, its small gradients did not)."""
    from ..record.precision import underflow_report  # deferred: keeps numpy off `dyntool --help`
    store = getattr(run, "store", None)
    try:
        return underflow_report(store) if store is not None else None
    except (OSError, ValueError, KeyError, DyntoolError):
        return None


def register(sub, simsub) -> None:
    ls = sub.add_parser("ls", help="table of runs under RUNS_DIR (a malformed run shows as 'corrupt')",
                        description="Table of the runs under RUNS_DIR, a study's runs together in seed order. "
                                    "SIZE is what a disk allocates (as du counts it: each small chunk file takes "
                                    "a whole block), in object storage the objects' bytes: the same run can read "
                                    "14 MB on a disk and 661 KB in S3.")
    ls.add_argument("runs_dir", nargs="?", default=DEFAULT_RUNS, metavar="RUNS_DIR",
                    help=f"folder holding runs and studies (default: {DEFAULT_RUNS})")
    ls.set_defaults(fn=cmd_ls)

    info = sub.add_parser("info", help="config, arrays (shapes, dimension names), size and problems of a run; "
                                       "a summary of a study")
    info.add_argument("run", metavar="RUN_OR_STUDY", help="a run directory, or a study / folder of runs")
    info.add_argument("--verify", action="store_true",
                      help="also decode every committed chunk (as `dyntool check`); exit 1 on a problem")
    info.set_defaults(fn=cmd_info)

    check = sub.add_parser("check", help="read every committed chunk of a run (or of every run in a folder); "
                                         "exit 1 if anything is corrupt")
    check.add_argument("run", metavar="RUN_OR_FOLDER", help="a run directory, or a folder whose runs are all checked")
    check.set_defaults(fn=cmd_check)
