"""Reading run directories (docs/FORMAT.md): :func:`open_run`, :func:`list_runs`, :class:`Run`.

Re-exported as ``dyntool.open_run`` etc.  Nothing here raises on a malformed run: what can't be
read as written is listed in ``Run.problems``.  Writing a run is :mod:`dyntool.run_writer`.
"""
from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import safeio
from .dataset import chunk, to_xarray
from .errors import RunError
from .location import URLPath, is_url, location
from .record.object_store import Remote
from .record.ranks import RECORD_DIR
from .run_files import check_meta, json_object, metric_rows, orphan_ranks, read_json, read_metrics  # noqa: F401


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
    def file_problems(self) -> list[str]:
        """The problems found so far in the run's own files (meta, config, metrics once read),
        without opening the recording (:attr:`problems` checks its chunks too)."""
        return list(self._problems)

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
            self._metrics = pd.DataFrame(read_metrics(self.path / "metrics.jsonl", self.root, self._problems))
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


class RemoteRun(Run):
    """A run in object storage (``s3://…/RUN``, ``file:///…/RUN``): the :class:`Run` API, read
    through the object-store backend; ``path`` is a :class:`~dyntool.location.URLPath`."""

    def __post_init__(self):
        self.root = None
        self.remote = Remote(self.path)

    @property
    def id(self) -> str:
        return self.meta.get("id") or self.path.name

    @property
    def store(self):
        if self._store is None:
            from .record.remote import open_remote_record
            from .record.store import RecordError
            try:
                self._store = open_remote_record(self.remote) or False
                if self._store:
                    self._problems.extend(self._store.problems)
                else:
                    self._problems.extend(orphan_ranks(self.remote.list_dir()[0]))
            except RecordError as e:
                self._store = False
                self._problems.append(str(e))
        return self._store or None

    @property
    def metrics(self):
        import pandas as pd
        if self._metrics is None:
            raw = self.remote.get("metrics.jsonl") or b""
            try:
                rows = metric_rows(safeio.lines_of(io.BytesIO(raw), "metrics.jsonl"), self._problems)
            except safeio.BadFile as e:
                self._problems.append(f"metrics.jsonl can't be read ({e})")
                rows = []
            self._metrics = pd.DataFrame(rows)
        return self._metrics

    def refresh(self) -> "RemoteRun":
        fresh = open_remote_run(self.path)
        self.meta, self.config, self._problems = fresh.meta, fresh.config, fresh._problems
        self._store, self._metrics, self._checked = None, None, False
        return self

    def size_bytes(self) -> int:
        return sum(self.remote.list().values())


def open_remote_run(url) -> RemoteRun:
    """:func:`open_run` for an object-store URL.  A run is a prefix holding ``meta.json`` or
    ``config.json``; one that can't be parsed is a run with problems, as a local one."""
    remote = Remote(url)
    problems: list[str] = []
    raw = {k: remote.get(k) for k in ("meta.json", "config.json")}
    if all(v is None for v in raw.values()):
        raise RunError(f"{remote.url} is not a dyntool run (no meta.json or config.json)")
    meta, config = (json_object(raw[k], k, problems) for k in ("meta.json", "config.json"))
    return RemoteRun(URLPath(remote.url), config, check_meta(meta, problems), problems)


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
        return open_remote_run(p)
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
    meta = check_meta(read_json(p / "meta.json", real_root, problems), problems)
    config = read_json(p / "config.json", real_root, problems)
    notes = []
    if meta.get("status") == "running" and _stale(p):
        notes.append("status is 'running' but nothing was written for 10 minutes (killed?)")
    return Run(p, config, meta, problems, real_root, notes)


def study_summary(folder) -> dict:
    """The ``summary.json`` a study writes beside its runs (local or object storage), {} when there
    is none or it is not a JSON object (unreadable files are never raised here)."""
    where = location(folder)
    if is_url(where):
        out = json_object(Remote(where).get("summary.json"), "summary.json", [])
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
