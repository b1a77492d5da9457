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
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO, Callable, ContextManager, Iterator, Protocol, runtime_checkable

from ..location import URLPath


class Outside(ValueError):
    """A local key that resolves (through a symlink) outside the folder the reader was given: never
    read.  Object storage has no links, so only :class:`~dyntool.storage.local.LocalBackend` raises it."""


class LineWriter(Protocol):
    """What :meth:`Backend.appender` returns: ``write`` one line at a time, ``close`` at the end."""

    def write(self, line: str) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """One place a run (or a folder of runs) lives.  ``where``: a :class:`~pathlib.Path` or a
    :class:`~dyntool.location.URLPath`; ``path``: what writers expose as ``run.path`` (the
    ``Path``, or the URL as text, so nothing local is ever made from a URL)."""

    where: Path | URLPath
    root: Path | None
    """The folder no local read leaves (links resolving outside it are refused); None for an object
    store, whose keys have no links that could lead elsewhere."""

    @property
    def path(self) -> Path | str: ...

    # -- objects -----------------------------------------------------------------------------
    def get(self, key: str, cap: int | None = None) -> bytes | None:
        """The bytes of ``key`` (None: it does not exist); over ``cap`` bytes, not a regular file:
        :class:`dyntool.safeio.BadFile`; a local link leading outside: :class:`Outside`."""

    def lines(self, key: str) -> Iterator[bytes | None]:
        """``key``'s lines as :func:`dyntool.safeio.lines_of` gives them (none when it is missing)."""

    def put(self, key: str, data: bytes, exclusive: bool = False, last_resort: bool = False) -> None:
        """Replace ``key`` whole: a reader sees the old bytes or the new, never part (``exclusive``:
        refuse when it exists; ``last_resort``: on a full local disk, rewrite it in place)."""

    def write_with(self, key: str, write: Callable[[Any], None]) -> None:
        """Replace ``key`` whole with what ``write(target)`` writes, for objects too big to build
        as bytes first (a checkpoint): ``target`` is a local temp file's :class:`~pathlib.Path`
        (streamed to disk, renamed over ``key`` only when ``write`` returns) or an in-memory
        binary buffer (one PUT).  A failed ``write`` leaves the old ``key`` and no temp file."""

    def open_file(self, key: str) -> ContextManager[BinaryIO]:
        """``with backend.open_file(key) as f``: ``key`` as a binary file, read as it is consumed
        where the backend can (a disk); :class:`FileNotFoundError` when it is missing,
        :class:`dyntool.safeio.BadFile` when it is not a regular file (a FIFO never hangs)."""

    def what_is(self, key: str) -> str:
        """``"file"``, ``"missing"``, ``"folder"``, ``"link"`` (a local symlink, never followed
        here) or ``"other"`` (a FIFO, a device): what a caller must refuse before reading."""

    def append(self, key: str, line: str) -> None:
        """Add one line to ``key`` (created if missing)."""

    def appender(self, key: str) -> LineWriter:
        """A writer that appends lines to ``key`` for as long as a run lasts (metrics.jsonl)."""

    def list(self, key: str = "") -> tuple[list[str], list[str]]:
        """(sub-folders, files) directly below ``key``, names only."""

    def exists(self, key: str = "") -> bool: ...

    def delete(self, key: str = "") -> None:
        """Remove ``key`` and everything below it (``""``: the whole location)."""

    def size(self) -> int:
        """Bytes stored below the location (on a disk: allocated blocks, as ``du`` counts them)."""

    # -- the record (what :class:`dyntool.record.reader.RecordReader` asks) -------------------
    def zarr_store(self, sub: str, mode: str = "r", specs: dict | None = None):
        """A zarr store for the group at ``sub`` (``mode`` ``"r"`` or ``"w"``).  ``specs``: the
        reader's array -> chunk geometry, filled in as it opens each array, for a store that bounds
        its reads by it (the local guarded store; an object is fetched whole by one GET)."""

    def has_group(self, sub: str) -> bool:
        """A zarr group is stored at ``sub``, worth opening (a local link is: the reader refuses it
        when it leads out of the root)."""

    def walk(self, key: str, guarded: bool = True) -> tuple[set[str], set[str], set[str]]:
        """``(files, links out, odd)`` below ``key``, as keys relative to it: regular files; links
        resolving outside the root (``guarded``; not followed); entries that are neither file nor
        folder (a FIFO, a device).  An object store has objects only: the last two are empty."""

    def frame_problem(self, key: str, trailer: int = 0) -> str | None:
        """What is wrong with the zstd frame (``trailer`` checksum bytes after it) stored at ``key``,
        told without decoding it; None when nothing is, or when telling would mean downloading it
        (an object store: a full check decodes every chunk instead)."""

    # -- runs and folders of runs ------------------------------------------------------------
    def child(self, name: str) -> "Backend": ...

    def create(self, name: str) -> "Backend":
        """A new run folder ``name`` below this one; :class:`~dyntool.errors.RunError` if it exists
        (existing runs are never written into)."""

    def is_run(self) -> bool:
        """The location holds ``meta.json`` or ``config.json``."""

    def contained(self, key: str = "") -> bool:
        """``key`` (``""``: the location) lies inside the root the reader was given (no link leads
        out of it)."""

    def below(self, rel: str) -> Path | URLPath:
        """The location ``rel`` names below this one, as a reader reaches it (a folder of runs the
        app is asked for): on a disk joined and resolved, links followed; in object storage joined,
        an absolute name or ``..`` refused (keys have no parent links).  :class:`Outside` when it
        leaves the location; ``OSError``/``ValueError`` when it is no usable path."""

    def is_dir(self) -> bool:
        """The location can hold runs without a request to tell: an existing local directory;
        always for an object store, whose prefixes are not stored (whether anything is below one
        is a LIST: :meth:`exists`)."""

    def signature(self, keys) -> tuple:
        """A cheap token that changes when any of ``keys`` may have: on a disk each file's
        ``(mtime_ns, size)`` (a stat each, nothing read; None for a missing one); in object
        storage, where a stat is a request, the clock in steps of ``POLL_SECONDS``, so a watcher
        re-reads at most that often."""

    # -- where commands write ----------------------------------------------------------------
    @property
    def plain_files(self) -> bool:
        """Tools that write ordinary files through the OS (matplotlib, netCDF, TensorBoard) can
        write here: a local folder; not an object store, which takes whole objects by PUT."""

    def ensure_dir(self) -> Path | str:
        """Ready to hold new runs, before any expensive setup: a local folder is made (parents too)
        and must be writable, else a one-line :class:`~dyntool.errors.RunError`; an object store
        needs nothing made (a prefix exists once an object is stored below it).  Returns
        :attr:`path`."""

    # -- the output guard --------------------------------------------------------------------
    def check_out(self, what: str = "--out") -> Path | str:
        """Runs can be written here; else a one-line error, before anything is created."""

    def mark(self) -> Any:
        """What exists now, for :meth:`clean_up` after a rejected command."""

    def clean_up(self, mark: Any) -> None:
        """Remove what this command created here since ``mark`` and logged no metrics row."""


RUN_FILES = ("meta.json", "config.json")       # a folder holding either is a run
POLL_SECONDS = 3          # how often a watcher of object storage re-reads (see Backend.signature)
