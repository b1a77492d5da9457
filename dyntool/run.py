"""Reading run directories (docs/FORMAT.md): :func:`open_run`, :func:`list_runs`, :class:`Run`.

Re-exported as ``dyntool.open_run`` etc.  Nothing here raises on a malformed run: what can't be
read as written is listed in ``Run.problems``.  A run is read through its storage backend
(:mod:`dyntool.storage`: a local folder or an object-store prefix, the same code for both).
Writing a run is :mod:`dyntool.run_writer`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import safeio
from .dataset import chunk, to_xarray
from .errors import RunError
from .location import URLPath, location
from .record.ranks import RECORD_DIR, open_record  # noqa: F401  (RECORD_DIR: re-exported)
from .record.store import RecordError
from .run_files import check_meta, held_to_written, json_object, metric_rows, orphan_ranks, read_json, read_metrics  # noqa: F401
from .storage import Backend, open_backend
from .storage.local import disk_usage, is_run_dir  # noqa: F401  (re-exported: is_run_dir, disk_usage)


@dataclass
class Run:
    """A recorded run, read-only.  Arrays are lazy and bounded by the commit marker.

    ``path``: a :class:`~pathlib.Path`, or a :class:`~dyntool.location.URLPath` for a run in object
    storage; ``backend``: where its bytes are read (:mod:`dyntool.storage`).
    ``problems``: what can't be read as written (malformed JSON, a corrupt or missing chunk, a
    marker past the data, a file resolving outside the runs folder); :attr:`corrupt` is true when
    there is any.  ``notes``: things worth knowing that are not corruption (a stale 'running')."""

    path: Path | URLPath
    config: dict
    meta: dict
    _problems: list[str] = field(default_factory=list)
    root: Path | None = None
    notes: list[str] = field(default_factory=list)
    _store: Any = None
    _metrics: Any = None
    _checked: bool = False
    backend: Backend | None = None

    def __post_init__(self):
        if self.backend is None:
            self.backend = open_backend(self.path, root=self.root)
        self.root = self.backend.root

    @property
    def remote(self):
        """The object store of a run in object storage (:class:`~dyntool.storage.remote.Remote`)."""
        return getattr(self.backend, "remote", None)

    @property
    def id(self) -> str:
        return self.meta.get("id") or self.path.name

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
            held_to_written(self.meta, len(self.metrics), st.steps_written if st is not None else 0, found)
            self._problems.extend(p for p in found if p not in self._problems)
            self.notes.extend(n for n in getattr(st, "notes", None) or [] if n not in self.notes)
            self._checked = True
        return list(self._problems)

    @property
    def store(self):
        """The recording (one rank's reader, or every rank's merged: :mod:`dyntool.record.ranks`),
        or None."""
        if self._store is None:
            try:
                self._store = open_record(self.backend) or False
            except RecordError as e:
                self._store = False
                self._problems.append(str(e))
            else:
                if self._store:
                    self._problems.extend(self._store.problems)
                else:
                    self._problems.extend(orphan_ranks(_names_in(self.backend)))
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
            rows = read_metrics(self.backend, self._problems, finished=self.status == "finished")
            self._metrics = pd.DataFrame(rows)
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
        """Bytes stored: on a disk allocated blocks, as ``du`` counts them (links not followed);
        in object storage the objects' sizes."""
        return self.backend.size()

    def __repr__(self) -> str:
        return f"Run({self.id!r}, kind={self.kind}, status={self.status}, steps={self.steps_written})"


RemoteRun = Run        # the old name of a run in object storage: one class reads both now


def _names_in(backend) -> list[str]:
    try:
        dirs, files = backend.list()
    except (OSError, ValueError):
        return []
    return dirs + files


def _need_dir(p: Path | URLPath, missing: str) -> None:
    """A local folder must exist (``missing`` says so otherwise); a URL is left to its backend,
    which has no folders to test (a prefix exists when something is stored under it)."""
    if isinstance(p, Path):
        try:
            if p.exists() and not p.is_dir():
                raise RunError(f"{p} is a file, not a folder")
            if not p.is_dir():
                raise RunError(missing)
        except ValueError:                  # e.g. a NUL byte in the path
            raise RunError(f"not a usable path: {str(p)!r}") from None


def is_run(where) -> bool:
    """``where`` (a local folder or an object-store URL, see :mod:`dyntool.location`) is one run,
    not a folder of runs."""
    return open_backend(where).is_run()


def open_run(path: str | Path | Backend, root: str | Path | None = None) -> Run:
    """The run at ``path``: a local folder, ``s3://bucket/prefix/RUN`` or ``file:///path/RUN``
    (:mod:`dyntool.location`, read through :mod:`dyntool.storage`), or the run's backend itself
    (what :meth:`~dyntool.storage.Backend.runs` yields; ``root`` is then the backend's).  Every local
    file read must resolve inside ``root`` (default: the run directory itself; the app and ``ls``
    pass the runs folder).  Malformed files are reported in ``Run.problems``, never raised; a
    recording's chunks are checked on first use of ``Run.problems`` via :meth:`Run.check` (``corrupt``)."""
    backend = path if isinstance(path, Backend) else open_backend(location(path), root=root)
    _need_dir(backend.where, f"no run at {backend.where} (not a directory)")
    if not backend.is_run():
        raise RunError(f"{backend.path} is not a dyntool run (no meta.json or config.json)")
    return _read(backend)


def _read(backend: Backend) -> Run:
    """The run on ``backend``, known to be one (:func:`open_run` asked; a listing found it)."""
    p = backend.where
    if not backend.contained():
        raise RunError(f"{p} resolves outside {backend.root}; not read")
    problems: list[str] = []
    meta = check_meta(read_json(backend, "meta.json", problems), problems)
    if meta.get("status") == "running":     # still written: not from a listing made before its marker
        backend = backend.live()
    config = read_json(backend, "config.json", problems)
    notes = []
    # local folders only: in object storage the files' ages would cost a HEAD per file on every
    # open (the app re-opens live runs every few seconds), so a stale remote run is not noted
    if meta.get("status") == "running" and isinstance(p, Path) and _stale(p):
        notes.append("status is 'running' but nothing was written for 10 minutes (killed?)")
    return Run(p, config, meta, problems, notes=notes, backend=backend)


def open_remote_run(url) -> Run:
    """:func:`open_run` for an object-store URL (kept for callers of the old name)."""
    return open_run(URLPath(str(url)))


def study_summary(folder, problems: list[str] | None = None) -> dict:
    """The ``summary.json`` a study writes beside its runs (local or object storage), {} when there
    is none, it is a link, or it is not a JSON object: unreadable files are never raised here, but
    said in ``problems`` when given (a folder without one has no problem: not every folder is a study)."""
    problems = [] if problems is None else problems
    where = location(folder)
    try:               # a link is refused on a disk; asking an object store (which has none) is a request
        if isinstance(where, Path) and (where / "summary.json").is_symlink():
            problems.append("summary.json is a link; ignored")
            return {}
        raw = open_backend(where).get("summary.json", safeio.MAX_JSON_BYTES)
    except (OSError, ValueError) as e:
        problems.append(f"summary.json can't be read ({e})")
        return {}
    return {} if raw is None else json_object(raw, "summary.json", problems)


def _stale(p: Path, seconds: float = 600) -> bool:
    newest = max((f.stat().st_mtime for f in (p / "metrics.jsonl", p / "meta.json") if f.exists()), default=0)
    return time.time() - newest > seconds


def run_backends(runs_dir: str | Path, max_depth: int = 3, root: str | Path | None = None) -> list[Backend]:
    """The backends of the runs below ``runs_dir`` (study folders included), in name order, from
    one backend opened here and the child backends its listing yields (a disk: one listing per
    folder; an object store: one LIST of everything below, :meth:`~dyntool.storage.Backend.runs`); folders resolving outside ``root``
    (default ``runs_dir``) are skipped, folders named ``*.zarr`` or ``.*`` never entered."""
    start = location(runs_dir, "RUNS_DIR")
    _need_dir(start, f"runs directory {start} does not exist")
    top = open_backend(start, "RUNS_DIR", root=root)
    found = list(top.runs(max_depth))
    if not found and not top.exists():      # object stores have no empty folders: nothing is there
        raise RunError(f"runs directory {top.path} does not exist (nothing is stored under it)")
    return found


def find_runs(runs_dir: str | Path, max_depth: int = 3, root: str | Path | None = None) -> list[Path | URLPath]:
    """The locations of :func:`run_backends`, sorted by path, on either backend."""
    return [b.where for b in run_backends(runs_dir, max_depth, root)]


def list_runs(runs_dir: str | Path, max_depth: int = 3, root: str | Path | None = None) -> list[Run]:
    """Every run below ``runs_dir`` (runs inside study directories included), newest first.  A
    malformed run is listed with its problems, never raised; nothing outside ``root`` (default
    ``runs_dir``) is read.  Each run is read on the backend its listing yielded (never asked again
    whether it is a run)."""
    found = [_read(b) for b in run_backends(runs_dir, max_depth, root)]
    found.sort(key=lambda r: r.meta.get("created", ""), reverse=True)
    return found
