"""``dyntool ls`` and ``dyntool info``: what is in a runs folder, what is in one run."""
from __future__ import annotations

from pathlib import Path

from . import DEFAULT_RUNS


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


# -- ls / info ------------------------------------------------------------------------------

def cmd_ls(args) -> int:
    from ..run import list_runs
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
    from ..run import open_run
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



def register(sub, simsub) -> None:
    ls = sub.add_parser("ls", help="table of runs under RUNS_DIR")
    ls.add_argument("runs_dir", nargs="?", default=DEFAULT_RUNS, metavar="RUNS_DIR",
                    help=f"folder holding runs and studies (default: {DEFAULT_RUNS})")
    ls.set_defaults(fn=cmd_ls)

    info = sub.add_parser("info", help="config summary, arrays (shapes, dimension names), size of a run")
    info.add_argument("run", metavar="RUN", help="a run directory")
    info.set_defaults(fn=cmd_info)

