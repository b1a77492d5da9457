"""Reading run directories (docs/FORMAT.md): :func:`open_run`, :func:`list_runs`, :class:`Run`.

Re-exported as ``dyntool.open_run`` etc.  Nothing here raises on a malformed run: what can't be
read as written is listed in ``Run.problems``.  Writing a run is :mod:`dyntool.run_writer`.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import safeio
from .dataset import chunk, to_xarray
from .errors import RunError
from .location import is_url, location
from .run_writer import RECORD_DIR, STATUSES


def _read_json(path: Path, root: Path, problems: list[str]) -> dict:
    """A JSON object from ``path``; anything else (missing, symlinked outside ``root``, not a regular
    file, too big, too deeply nested, not JSON, not an object) is a problem and reads as ``{}``."""
    if not safeio.inside(path, root):
        problems.append(f"{path.name} resolves outside {root}; not read")
        return {}
    try:
        raw = safeio.read_bytes(path, safeio.MAX_JSON_BYTES)
    except FileNotFoundError:
        raw = None
    except safeio.BadFile as e:
        problems.append(f"{path.name} is corrupted ({e})")
        return {}
    except OSError as e:
        problems.append(f"{path.name} can't be read ({e.strerror or e})")
        return {}
    return json_object(raw, path.name, problems)


def json_object(raw: bytes | None, name: str, problems: list[str]) -> dict:
    """The JSON object in ``raw``, a run file's bytes (``None``: the file is missing); missing, too
    deeply nested, not JSON or not an object is a problem and reads as ``{}``.  The local reader and
    the object-store reader (record/remote.py) both parse through here."""
    if raw is None:
        problems.append(f"{name} is missing")
        return {}
    try:
        obj = safeio.loads(raw, name)
    except safeio.BadFile as e:
        problems.append(f"{name} is corrupted ({e})")
        return {}
    if not isinstance(obj, dict):
        problems.append(f"{name} holds a {type(obj).__name__}, not an object; ignored")
        return {}
    return obj


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# meta.json fields the tools rely on, and the types they must have
_META_TYPES = {"id": str, "kind": str, "status": str, "created": str, "updated": str, "device": str,
               "error": str, "tags": list, "seeds": list, "final": dict}


def _check_meta(meta: dict, problems: list[str]) -> dict:
    """Drop meta fields of the wrong type (reported), so one bad field can't break a listing."""
    out = dict(meta)
    for k, t in _META_TYPES.items():
        if k in out and out[k] is not None and not isinstance(out[k], t):
            problems.append(f"meta.json: {k} is a {type(out[k]).__name__}, not a {t.__name__}; ignored")
            del out[k]
    if "status" in out and out["status"] not in STATUSES:
        problems.append(f"meta.json: unknown status {out['status']!r}")
        del out["status"]
    if "tags" in out:
        out["tags"] = [str(t) for t in out["tags"]]
    if "seeds" in out and not all(_is_int(x) for x in out["seeds"]):
        problems.append(f"meta.json: seeds {out['seeds']!r} are not all integers; ignored")
        del out["seeds"]
    return out


MAX_STEP = 2**53 - 1        # a step beyond this is not a training step (and not exact as a float)
_I64 = 2**63


def _row_ok(row: Any) -> bool:
    if not isinstance(row, dict) or not _is_int(row.get("step")) or not 0 <= row["step"] <= MAX_STEP:
        return False
    for k, v in row.items():         # integers beyond int64 would turn a pandas column into objects
        if _is_int(v) and not -_I64 <= v < _I64:
            row[k] = float(v)
    return True


def _read_metrics(path: Path, root: Path, problems: list[str]) -> list[dict]:
    """Rows of a local metrics.jsonl (:func:`metric_rows`); a file that can't be read is a problem
    and gives no rows."""
    if not safeio.inside(path, root):
        problems.append(f"{path.name} resolves outside {root}; not read")
        return []
    try:
        return metric_rows(safeio.iter_lines(path), problems)
    except FileNotFoundError:
        return []
    except safeio.BadFile as e:
        problems.append(f"{path.name} can't be read ({e})")
        return []
    except OSError as e:
        problems.append(f"{path.name} can't be read ({e.strerror or e})")
        return []


def metric_rows(lines, problems: list[str]) -> list[dict]:
    """Rows of metrics.jsonl from its lines (``safeio.lines_of``; ``None`` = a line over the length
    cap): JSON objects with an integer ``step`` in [0, 2**53); other lines are skipped and reported
    (a partial last line, left by a kill mid-write, is skipped quietly).  Local and object-store
    runs both parse through here."""
    rows, bad = [], []
    for i, line in enumerate(lines):
        if line is None:                           # longer than a metrics row can be
            bad.append(i)
            continue
        if not line.strip():
            continue
        try:
            row = safeio.loads(line, "a line")
        except safeio.BadFile:
            if line.endswith(b"\n"):              # else a partial last line (killed mid-write)
                bad.append(i)
            continue
        if not _row_ok(row):
            bad.append(i)
            continue
        rows.append(row)
    if bad:
        problems.append(f"metrics.jsonl has {len(bad)} malformed line(s) (not JSON, not an object, or "
                        f"no integer step in [0, 2**53)), first at line {bad[0] + 1}; skipped")
    return rows


@dataclass
class Run:
    """A recorded run, read-only.  Arrays are lazy and bounded by the commit marker.

    ``problems``: what can't be read as written (malformed JSON, a corrupt or missing chunk, a
    marker past the data, a file resolving outside the runs folder); :attr:`corrupt` is true when
    there is any.  ``notes``: things worth knowing that are not corruption (a stale 'running')."""

    path: Path
    config: dict
    meta: dict
    _problems: list[str] = field(default_factory=list)
    root: Path | None = None
    notes: list[str] = field(default_factory=list)
    _store: Any = None
    _metrics: Any = None
    _checked: bool = False

    def __post_init__(self):
        self.root = Path(os.path.realpath(self.root if self.root is not None else self.path))

    @property
    def id(self) -> str:
        return self.meta.get("id", self.path.name)

    @property
    def kind(self) -> str:
        return self.meta.get("kind", "?")

    @property
    def status(self) -> str:
        return self.meta.get("status", "unknown")

    @property
    def problems(self) -> list[str]:
        """Everything that can't be read as written (checks the recording's chunks on first use)."""
        self.check()
        return self._problems

    @property
    def corrupt(self) -> bool:
        return bool(self.problems)

    def check(self, full: bool = False) -> list[str]:
        """Open the recording, check each committed chunk (``full``: decode it too) and the
        metrics; the problems found are added to :attr:`problems` (once) and returned."""
        if not self._checked or full:
            self.metrics
            st = self.store
            found = st.verify(full) if st is not None else []
            self._problems.extend(p for p in found if p not in self._problems)
            self.notes.extend(n for n in getattr(st, "notes", None) or [] if n not in self.notes)
            self._checked = True
        return list(self._problems)

    @property
    def store(self):
        """The recording (a :class:`~dyntool.record.store.StoreReader`), or None."""
        if self._store is None:
            from .record.ranks import open_record
            from .record.store import RecordError
            rec = self.path / RECORD_DIR
            self._store = False
            if rec.is_dir() or rec.is_symlink():
                try:                    # one rank's recording, or every rank's merged (ranks.py)
                    self._store = open_record(self.path, root=self.root)
                    self._problems.extend(self._store.problems)
                except RecordError as e:
                    self._problems.append(str(e))
            else:
                self._problems.extend(orphan_ranks(_names_in(self.path)))
        return self._store or None

    @property
    def arrays(self) -> dict:
        st = self.store
        return st.arrays() if st is not None else {}

    @property
    def steps(self):
        import numpy as np
        st = self.store                 # only the step array: no need to open every array
        if st is not None and "step" in st.names():
            return st["step"][:]
        return np.zeros(0, dtype=np.int64)

    @property
    def steps_written(self) -> int:
        st = self.store
        return st.steps_written if st is not None else 0

    @property
    def metrics(self):
        import pandas as pd
        if self._metrics is None:
            self._metrics = pd.DataFrame(_read_metrics(self.path / "metrics.jsonl", self.root, self._problems))
        return self._metrics

    @property
    def static_names(self) -> list[str]:
        st = self.store
        return st.static_names() if st is not None else []

    def static(self, name: str):
        """A per-run array without a step axis (``record.zarr/static/NAME``), or None."""
        st = self.store
        return st.static(name) if st is not None and name in st.static_names() else None

    def refresh(self) -> "Run":
        """Re-read meta, metrics and the commit marker (for a run still being written)."""
        fresh = open_run(self.path, self.root)
        self.meta, self.config, self._problems, self.notes = fresh.meta, fresh.config, fresh._problems, fresh.notes
        self._store, self._metrics, self._checked = None, None, False
        return self

    def to_xarray(self, arrays: list[str] | None = None, steps: str | None = None, chunks=None):
        """The record as a lazy ``xarray.Dataset`` (see :mod:`dyntool.dataset`).  ``chunks``
        (``{dim: size}``, ``"auto"``, or ``"record"`` for the stored chunks): dask-backed arrays, for
        out-of-core analysis (:mod:`dyntool.scale`); needs ``dyntool[scale]``."""
        ds = to_xarray(self, arrays, steps)
        return ds if chunks is None else chunk(self, ds, chunks)

    def size_bytes(self) -> int:
        """Bytes on disk (allocated blocks, as ``du`` counts them), files resolving outside skipped."""
        return disk_usage(self.path, self.root)

    def __repr__(self) -> str:
        return f"Run({self.id!r}, kind={self.kind}, status={self.status}, steps={self.steps_written})"


def orphan_ranks(names) -> list[str]:
    """The problem of a run whose rank-0 recording is gone while other ranks' remain."""
    others = sorted(n for n in names if n.startswith("record.rank") and n.endswith(".zarr"))
    return [f"{RECORD_DIR} (rank 0's recording, which names the ranks) is missing but "
            f"{', '.join(others)} exist(s); the recording can't be read"] if others else []


def _names_in(path: Path) -> list[str]:
    try:
        return [e.name for e in os.scandir(path)]
    except OSError:
        return []


def disk_usage(path: Path, root: Path | None = None) -> int:
    """Allocated bytes below ``path`` (``st_blocks``, as ``du`` counts them: for many small chunk
    files this is well above the sum of their sizes); symlinks are not followed."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return total


def is_run_dir(path: Path) -> bool:
    try:
        return path.is_dir() and ((path / "meta.json").exists() or (path / "config.json").exists())
    except (OSError, ValueError):        # permission denied, a NUL byte
        return False


def is_run(where) -> bool:
    """``where`` (a local folder or an object-store URL, see :mod:`dyntool.location`) is one run,
    not a folder of runs."""
    where = location(where)
    if is_url(where):
        from .record.remote import is_remote_run
        return is_remote_run(where)
    return is_run_dir(where)


def open_run(path: str | Path, root: str | Path | None = None) -> Run:
    """The run at ``path``: a local folder, ``s3://bucket/prefix/RUN`` or ``file:///path/RUN``
    (:mod:`dyntool.location`; object storage through :mod:`dyntool.record.remote`).  Every local file
    read must resolve inside ``root`` (default: the run directory itself; the app and ``ls`` pass the
    runs folder).  Malformed files are reported in ``Run.problems``, never raised; a recording's
    chunks are checked on first use of ``Run.problems`` via :meth:`Run.check` (``corrupt``)."""
    p = location(path)
    if is_url(p):
        from .record.remote import open_remote_run
        return open_remote_run(str(p))
    try:
        if not p.is_dir():
            raise RunError(f"no run at {p} (not a directory)")
    except ValueError:                  # e.g. a NUL byte in the path
        raise RunError(f"not a usable path: {str(p)!r}") from None
    if not is_run_dir(p):
        raise RunError(f"{p} is not a dyntool run (no meta.json or config.json)")
    real_root = Path(os.path.realpath(root if root is not None else p))
    if not safeio.inside(p, real_root):
        raise RunError(f"{p} resolves outside {real_root}; not read")
    problems: list[str] = []
    meta = _check_meta(_read_json(p / "meta.json", real_root, problems), problems)
    config = _read_json(p / "config.json", real_root, problems)
    notes = []
    if meta.get("status") == "running" and _stale(p):
        notes.append("status is 'running' but nothing was written for 10 minutes (killed?)")
    return Run(p, config, meta, problems, real_root, notes)


def study_summary(folder) -> dict:
    """The ``summary.json`` a study writes beside its runs (local or object storage), {} when there
    is none or it is not a JSON object (unreadable files are never raised here)."""
    where = location(folder)
    if is_url(where):
        from .record.remote import read_remote_json
        out = json_object(read_remote_json(where, "summary.json"), "summary.json", [])
        return out if isinstance(out, dict) else {}
    p = where / "summary.json"
    try:
        if p.is_symlink() or not p.is_file():
            return {}
        out = safeio.read_json(p)
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def _stale(p: Path, seconds: float = 600) -> bool:
    newest = max((f.stat().st_mtime for f in (p / "metrics.jsonl", p / "meta.json") if f.exists()), default=0)
    return time.time() - newest > seconds


def find_runs(runs_dir: str | Path, max_depth: int = 3, root: str | Path | None = None) -> list[Path]:
    """Run directories below ``runs_dir`` (study directories included), sorted by path; folders
    resolving outside ``root`` (default ``runs_dir``) are skipped."""
    start = location(runs_dir, "RUNS_DIR")
    if is_url(start):
        from .record.remote import find_remote_runs
        return find_remote_runs(start, max_depth)
    try:
        if not start.is_dir():
            raise RunError(f"runs directory {start} does not exist")
    except ValueError:
        raise RunError(f"not a usable path: {str(start)!r}") from None
    real_root = Path(os.path.realpath(root if root is not None else start))
    found: list[Path] = []

    def walk(d: Path, depth: int):
        try:                                 # an unreadable folder (permissions, /proc) is skipped
            if not safeio.inside(d, real_root):
                return
            if is_run_dir(d):
                found.append(d)
                return
            if depth >= max_depth:
                return
            children = sorted(d.iterdir())
        except (OSError, ValueError):
            return
        for child in children:
            try:
                sub = child.is_dir() and not child.name.startswith(".") and not child.name.endswith(".zarr")
            except (OSError, ValueError):
                continue
            if sub:
                walk(child, depth + 1)

    walk(start, 0)
    return found


def list_runs(runs_dir: str | Path, max_depth: int = 3, root: str | Path | None = None) -> list[Run]:
    """Every run below ``runs_dir`` (runs inside study directories included), newest first.  A
    malformed run is listed with its problems, never raised; nothing outside ``root`` (default
    ``runs_dir``) is read."""
    where = location(runs_dir, "RUNS_DIR")
    if is_url(where):
        found = [open_run(u) for u in find_runs(where, max_depth)]
        found.sort(key=lambda r: r.meta.get("created", ""), reverse=True)
        return found
    real_root = Path(os.path.realpath(root if root is not None else where))
    found = [open_run(d, real_root) for d in find_runs(where, max_depth, real_root)]
    found.sort(key=lambda r: r.meta.get("created", ""), reverse=True)
    return found
