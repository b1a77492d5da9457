"""The storage backend interface: what a run, its record and the output guard need from the place
a run lives, whether that is a local folder or an object-store prefix.

Everything above this layer (:mod:`dyntool.run`, :mod:`dyntool.run_writer`, :mod:`dyntool.paths`,
the trainer's checkpoints, the CLI and the app) speaks to a :class:`Backend`, and so does the record
below it, handed one (:func:`dyntool.record.ranks.open_record`,
:class:`dyntool.record.reader.RecordReader`, which never import it); only :mod:`.local` and
:mod:`.objects` know what a folder or an object store is,
and :func:`dyntool.storage.open_backend` picks one of them, once, from
:func:`dyntool.location.location`.  A change to where runs live touches those two modules only.

Keys are ``/``-separated and relative to the backend's own location (``meta.json``,
``record.zarr/zarr.json``); ``""`` is the location itself.

A backend writes a few **primitives** (:attr:`Backend.path`, :meth:`~Backend.get`,
:meth:`~Backend.put`, :meth:`~Backend.list`, :meth:`~Backend.delete`, :meth:`~Backend.child`,
:meth:`~Backend.zarr_store`, :meth:`~Backend.check_out`); everything else is derived from them here,
with the defaults of a place that has whole objects and no links or folders of its own (an object
store), and overridden where a place can do better or must do more (a disk streams a file, knows
links; an object store sizes and walks a prefix in one LIST, tells a file by one HEAD).
"""
from __future__ import annotations

import abc
import io
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, ContextManager, Iterator, Protocol

from .. import safeio
from ..errors import RunError
from ..location import URLPath

RUN_FILES = ("meta.json", "config.json")       # a folder holding either is a run
POLL_SECONDS = 3          # how often a watcher of object storage re-reads (see Backend.signature)
CREATED: list["Backend"] = []   # runs created by this process through Backend.create (deleted again on a rejection)


class Outside(ValueError):
    """A local key that resolves (through a symlink) outside the folder the reader was given: never
    read.  Object storage has no links, so only :class:`~dyntool.storage.local.LocalBackend` raises it."""


class LineWriter(Protocol):
    """What :meth:`Backend.appender` returns: ``write`` one line at a time, ``close`` at the end."""

    def write(self, line: str) -> Any: ...

    def close(self) -> None: ...


class BufferedLines:
    """An appended file where objects can't be appended to (metrics.jsonl): rows kept in memory,
    the whole object re-PUT at most every ``flush_seconds`` (and on close), so a kill -9 loses at
    most that many seconds of rows, never the record's committed steps."""

    def __init__(self, backend: "Backend", key: str, flush_seconds: float = 5.0):
        self.backend, self.key, self.every = backend, key, flush_seconds
        self.lines: list[str] = []
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def write(self, line: str) -> None:
        with self.lock:
            self.lines.append(line)
        if time.monotonic() - self.last >= self.every:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            data = "".join(self.lines).encode()
            self.last = time.monotonic()
        self.backend.put(self.key, data)

    def close(self) -> None:
        self.flush()


class Backend(abc.ABC):
    """One place a run (or a folder of runs) lives.  ``where``: a :class:`~pathlib.Path` or a
    :class:`~dyntool.location.URLPath`; ``path``: what writers expose as ``run.path`` (the
    ``Path``, or the URL as text, so nothing local is ever made from a URL)."""

    where: Path | URLPath
    root: Path | None = None
    """The folder no local read leaves (links resolving outside it are refused); None for an object
    store, whose keys have no links that could lead elsewhere."""

    # == the primitives: what every backend writes =============================================
    @property
    @abc.abstractmethod
    def path(self) -> Path | str: ...

    @abc.abstractmethod
    def get(self, key: str, cap: int | None = None) -> bytes | None:
        """The bytes of ``key`` (None: it does not exist); over ``cap`` bytes, not a regular file:
        :class:`dyntool.safeio.BadFile`; a local link leading outside: :class:`Outside`."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes, exclusive: bool = False, last_resort: bool = False) -> None:
        """Replace ``key`` whole: a reader sees the old bytes or the new, never part (``exclusive``:
        refuse with :class:`RunError` when it exists; ``last_resort``: on a full local disk, rewrite
        it in place)."""

    @abc.abstractmethod
    def list(self, key: str = "") -> tuple[list[str], list[str]]:
        """(sub-folders, files) directly below ``key``, names only: one request where it is one."""

    @abc.abstractmethod
    def delete(self, key: str = "") -> None:
        """Remove ``key`` and everything below it (``""``: the whole location)."""

    @abc.abstractmethod
    def child(self, name: str) -> "Backend":
        """The backend of ``name`` below this location (made without a request)."""

    @abc.abstractmethod
    def zarr_store(self, sub: str, mode: str = "r", specs: dict | None = None):
        """A zarr store for the group at ``sub`` (``mode`` ``"r"`` or ``"w"``).  ``specs``: the
        reader's array -> chunk geometry, filled in as it opens each array, for a store that bounds
        its reads by it (the local guarded store; an object is fetched whole by one GET)."""

    @abc.abstractmethod
    def check_out(self, what: str = "--out") -> Path | str:
        """Runs can be written here (reachable, writable, not inside a run); else a one-line
        :class:`RunError`/:class:`~dyntool.errors.ConfigError`, before anything is created."""

    # == objects, derived ======================================================================
    def has(self, key: str) -> bool:
        """``key`` is a stored file (default: listed in its folder; an object store: one HEAD)."""
        folder, _, name = key.rpartition("/")
        return bool(name) and name in self.list(folder)[1]

    def what_is(self, key: str) -> str:
        """``"file"``, ``"missing"``, ``"folder"``, ``"link"`` (a local symlink, never followed
        here) or ``"other"`` (a FIFO, a device): what a caller must refuse before reading."""
        if key and self.has(key):
            return "file"
        dirs, files = self.list(key)
        return "folder" if dirs or files else "missing"

    def exists(self, key: str = "") -> bool:
        """A file or a folder with something below it (an object store has no empty folders)."""
        return self.what_is(key) != "missing"

    def lines(self, key: str) -> Iterator[bytes | None]:
        """``key``'s lines as :func:`dyntool.safeio.lines_of` gives them (none when it is missing)."""
        yield from safeio.lines_of(io.BytesIO(self.get(key) or b""), key)

    def write_with(self, key: str, write: Callable[[Any], None]) -> None:
        """Replace ``key`` whole with what ``write(target)`` writes, for objects too big to build
        as bytes first (a checkpoint): ``target`` is an in-memory binary buffer (one PUT) or, on a
        disk, a local temp file's :class:`~pathlib.Path` (streamed, renamed over ``key`` only when
        ``write`` returns).  A failed ``write`` leaves the old ``key`` and no temp file."""
        buf = io.BytesIO()
        write(buf)
        self.put(key, buf.getvalue())

    def open_file(self, key: str) -> ContextManager[BinaryIO]:
        """``with backend.open_file(key) as f``: ``key`` as a binary file, read as it is consumed
        where the backend can (a disk); :class:`FileNotFoundError` when it is missing,
        :class:`dyntool.safeio.BadFile` when it is not a regular file (a FIFO never hangs)."""
        data = self.get(key)
        if data is None:
            raise FileNotFoundError(2, "No such file or directory", f"{self.path}/{key}")
        return io.BytesIO(data)

    def append(self, key: str, line: str) -> None:
        """Add one line to ``key`` (created if missing; one writer at a time, as a run has)."""
        self.put(key, (self.get(key) or b"") + line.encode())

    def appender(self, key: str) -> LineWriter:
        """A writer that appends lines to ``key`` for as long as a run lasts (metrics.jsonl)."""
        return BufferedLines(self, key)

    def walk(self, key: str, guarded: bool = True) -> tuple[set[str], set[str], set[str]]:
        """``(files, links out, odd)`` below ``key``, as keys relative to it: regular files; links
        resolving outside the root (``guarded``; not followed); entries that are neither file nor
        folder (a FIFO, a device).  Default: a LIST per folder, files only."""
        top = key.strip("/")
        found: set[str] = set()
        stack = [top]
        while stack:
            k = stack.pop()
            dirs, files = self.list(k)
            rel = k[len(top):].strip("/")
            found |= {f"{rel}/{f}" if rel else f for f in files}
            stack += [f"{k}/{d}" if k else d for d in dirs]
        return found, set(), set()

    def size(self) -> int:
        """Bytes stored below the location (on a disk: allocated blocks, as ``du`` counts them;
        default: the files' lengths, read one by one)."""
        return sum(len(self.get(k) or b"") for k in self.walk("")[0])

    # == the record ============================================================================
    def has_group(self, sub: str) -> bool:
        """A zarr group is stored at ``sub``, worth opening (a local link is: the reader refuses it
        when it leads out of the root)."""
        return self.has(f"{sub}/zarr.json")

    def frame_problem(self, key: str, trailer: int = 0) -> str | None:
        """What is wrong with the zstd frame (``trailer`` checksum bytes after it) stored at ``key``,
        told without decoding it; None when nothing is, or when telling would mean downloading it
        (an object store: a full check decodes every chunk instead)."""
        return None

    # == runs and folders of runs ==============================================================
    def is_run(self) -> bool:
        """The location holds ``meta.json`` or ``config.json`` (asked with :meth:`has`: in an
        object store a HEAD each, no LIST)."""
        return any(self.has(f) for f in RUN_FILES)

    def runs(self, max_depth: int = 3) -> Iterator["Backend"]:
        """Every run at or below this location, as child backends, in name order: one
        :meth:`list` per folder that is not a run; folders named ``*.zarr`` or ``.*`` never
        entered, folders leaving the root skipped, unreadable ones (permissions) skipped."""
        try:
            if not self.contained():
                return
            if self.is_run():
                yield self
                return
            dirs = self.list()[0] if max_depth > 0 else []
        except (OSError, ValueError):
            return
        for d in sorted(dirs):
            if not d.startswith(".") and not d.endswith(".zarr"):
                yield from self.child(d).runs(max_depth - 1)

    def live(self) -> "Backend":
        """This location, for a run that may still be written: a backend handed a listing by
        :meth:`runs` answers from it, and a run being written must be asked afresh (a chunk
        committed after the listing would read as missing).  Default: itself."""
        return self

    def create(self, name: str) -> "Backend":
        """A new run folder ``name`` below this one; :class:`~dyntool.errors.RunError` if it exists
        (existing runs are never written into)."""
        run = self.child(name)
        if run.is_run():
            raise RunError(f"run {run.path} already exists; choose another name "
                           "(existing runs are never overwritten)")
        CREATED.append(run)                  # deleted again if this command is rejected (exit 2)
        return run

    def contained(self, key: str = "") -> bool:
        """``key`` (``""``: the location) lies inside the root the reader was given (no link leads
        out of it; default: keys have no links)."""
        return True

    def below(self, rel: str) -> Path | URLPath:
        """The location ``rel`` names below this one, as a reader reaches it (a folder of runs the
        app is asked for): on a disk joined and resolved, links followed; by default joined, an
        absolute name or ``..`` refused (keys have no parent links).  :class:`Outside` when it
        leaves the location; ``OSError``/``ValueError`` when it is no usable path."""
        parts = [q for q in str(rel).split("/") if q not in ("", ".")]
        if str(rel).startswith("/") or ".." in parts:
            raise Outside(f"{rel} is outside {self.path}")
        where = self.where
        for q in parts:
            where = where / q
        return where

    def is_dir(self) -> bool:
        """The location can hold runs without a request to tell: an existing local directory;
        by default always (a prefix is not stored: whether anything is below one is :meth:`exists`)."""
        return True

    def signature(self, keys) -> tuple:
        """A cheap token that changes when any of ``keys`` may have: on a disk each file's
        ``(mtime_ns, size)`` (a stat each, nothing read; None for a missing one); by default, where
        a stat is a request, the clock in steps of ``POLL_SECONDS``, so a watcher re-reads at most
        that often."""
        return (int(time.time() // POLL_SECONDS),)

    # == where commands write ==================================================================
    plain_files = False
    """Tools that write ordinary files through the OS (matplotlib, netCDF, TensorBoard) can write
    here: a local folder; not an object store, which takes whole objects by PUT."""

    def ensure_dir(self) -> Path | str:
        """Ready to hold new runs, before any expensive setup: a local folder is made (parents too)
        and must be writable, else a one-line :class:`~dyntool.errors.RunError`; by default nothing
        is made (a prefix exists once an object is stored below it).  Returns :attr:`path`."""
        return self.path

    # == the output guard ======================================================================
    def mark(self) -> Any:
        """What exists now, for :meth:`clean_up` after a rejected command (default: the runs
        :meth:`create` made so far)."""
        return len(CREATED)

    def clean_up(self, mark: Any) -> None:
        """Remove what this command created here since ``mark`` and logged no metrics row."""
        for run in CREATED[mark:]:
            try:
                if not (run.get("metrics.jsonl") or b"").strip():
                    run.delete()
            except Exception:             # best effort: the rejection is what the user must see
                continue
