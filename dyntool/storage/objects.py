"""The object-store backend: a run is a prefix ``s3://bucket/prefix/RUN`` (or ``file:///path/RUN``)
reached through :class:`dyntool.storage.remote.Remote` (obstore).

An object is written by one PUT, visible whole or not at all, so every ``put`` is atomic as a
local rename is.  An object can't be appended to: :class:`ObjectLines` keeps a run's rows in memory
and re-PUTs the whole object at most every few seconds.  Runs this process creates are remembered
(:data:`CREATED`) so a command rejected with exit 2 deletes them again, as a local run folder is.

Choosing this backend makes no request and needs no credentials: the object store is reached on
first use (:attr:`ObjectStoreBackend.remote`), so what only asks what kind of place this is (a
command's ``--out`` refused for plain files, a watcher's signature) works offline.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import io
import threading
import time
from typing import Iterator

from .. import safeio
from ..errors import RunError
from ..location import URLPath, join
from .remote import Remote, short
from .base import POLL_SECONDS, RUN_FILES, Outside

CREATED: list["ObjectStoreBackend"] = []   # runs created by this process (deleted again on a rejection)


class ObjectLines:
    """An appended object (metrics.jsonl): rows kept in memory, the whole object re-PUT at most
    every ``flush_seconds`` (and on close), so a kill -9 loses at most that many seconds of rows,
    never the record's committed steps."""

    def __init__(self, remote: Remote, key: str, flush_seconds: float = 5.0):
        self.remote, self.key, self.every = remote, key, flush_seconds
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
        self.remote.put(self.key, data)

    def close(self) -> None:
        self.flush()


class ObjectStoreBackend:
    """The objects below one URL.  ``create``: a writer's (may make a ``file://`` folder)."""

    root = None                               # keys have no links that could lead out of a root

    def __init__(self, where, create: bool = False):
        self.where = URLPath(str(where))
        self.creates = create

    @functools.cached_property
    def remote(self) -> Remote:
        """The object store, reached on first use (missing credentials, a reader's missing
        ``file://`` folder: a one-line :class:`RunError` then)."""
        return Remote(self.where.url, create=self.creates)

    def __repr__(self) -> str:
        return f"ObjectStoreBackend({self.where.url!r})"

    @property
    def path(self) -> str:
        return self.where.url

    # -- objects -----------------------------------------------------------------------------
    def get(self, key: str, cap: int | None = None) -> bytes | None:
        data = self.remote.get(key)
        if data is not None and cap is not None and len(data) > cap:
            raise safeio.BadFile(f"{key} is {len(data)} bytes, over the {cap}-byte limit for it; not read")
        return data

    def lines(self, key: str) -> Iterator[bytes | None]:
        yield from safeio.lines_of(io.BytesIO(self.remote.get(key) or b""), key)

    def put(self, key: str, data: bytes, exclusive: bool = False, last_resort: bool = False) -> None:
        self.remote.put(key, data, create=exclusive)

    def write_with(self, key: str, write) -> None:
        buf = io.BytesIO()                   # an object is one PUT: built whole in memory first
        write(buf)
        self.remote.put(key, buf.getvalue())

    @contextlib.contextmanager
    def open_file(self, key: str):
        data = self.remote.get(key)
        if data is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", join(self.remote.url, key))
        yield io.BytesIO(data)

    def what_is(self, key: str) -> str:
        """One HEAD for an object; a LIST only when there is none (object stores have no links
        and no FIFOs, so only "file", "folder" or "missing")."""
        if key and self.remote.head(key):
            return "file"
        dirs, files = self.remote.list_dir(key)
        return "folder" if dirs or files else "missing"

    def append(self, key: str, line: str) -> None:
        """GET and PUT back with the line added (one writer at a time, as a run has)."""
        self.remote.put(key, (self.remote.get(key) or b"") + line.encode())

    def appender(self, key: str) -> ObjectLines:
        return ObjectLines(self.remote, key)

    def list(self, key: str = "") -> tuple[list[str], list[str]]:
        return self.remote.list_dir(key)

    def exists(self, key: str = "") -> bool:
        """A prefix with objects below it (object stores have no empty folders), or an object
        ``key`` (one HEAD: a checkpoint is never downloaded to be found)."""
        dirs, files = self.remote.list_dir(key)
        return bool(dirs or files) or (bool(key) and self.remote.head(key))

    def delete(self, key: str = "") -> None:
        keys = list(self.remote.list(key))    # the remote first: it names the missing extra
        import obstore
        if keys:
            try:
                obstore.delete(self.remote.store, keys)
            except Exception as e:
                raise RunError(f"{join(self.remote.url, key)} can't be deleted: {short(e)}") from None

    def size(self) -> int:
        return sum(self.remote.list().values())

    # -- the record --------------------------------------------------------------------------
    def zarr_store(self, sub: str, mode: str = "r", specs: dict | None = None):
        # no specs: each chunk is one GET of a whole object, nothing to bound as a local read is
        return self.remote.zarr_store(sub, read_only=mode == "r")

    def has_group(self, sub: str) -> bool:
        return self.remote.head(f"{sub}/zarr.json")     # one HEAD: the reader GETs it itself

    def walk(self, key: str, guarded: bool = True) -> tuple[set[str], set[str], set[str]]:
        """One LIST of the objects below ``key`` (no links, no FIFOs in an object store)."""
        prefix = key.strip("/") + "/"
        return {k[len(prefix):] for k in self.remote.list(key) if k.startswith(prefix)}, set(), set()

    def frame_problem(self, key: str, trailer: int = 0) -> str | None:
        return None                           # telling would download every chunk: `check` decodes them

    # -- runs and folders of runs ------------------------------------------------------------
    def child(self, name: str) -> "ObjectStoreBackend":
        return ObjectStoreBackend(join(self.where.url, name), self.creates)

    def create(self, name: str) -> "ObjectStoreBackend":
        run = ObjectStoreBackend(join(self.where.url, name), create=True)
        if run.remote.head("meta.json"):
            raise RunError(f"run {run.remote.url} already exists; choose another name "
                           "(existing runs are never overwritten)")
        CREATED.append(run)                  # deleted again if this command is rejected (exit 2)
        return run

    def is_run(self) -> bool:
        return any(f in RUN_FILES for f in self.remote.list_dir()[1])

    def contained(self, key: str = "") -> bool:
        return True                           # keys have no links that could lead elsewhere

    def below(self, rel: str) -> URLPath:
        parts = [q for q in str(rel).split("/") if q not in ("", ".")]
        if str(rel).startswith("/") or ".." in parts:
            raise Outside(f"{rel} is outside {self.where.url}")
        return URLPath(join(self.where.url, *parts))

    def is_dir(self) -> bool:
        return True                           # a prefix is not stored: only a LIST could tell

    def signature(self, keys) -> tuple:
        return (int(time.time() // POLL_SECONDS),)

    # -- where commands write ----------------------------------------------------------------
    plain_files = False

    def ensure_dir(self) -> str:
        return self.path                      # nothing to make: a file:// folder comes with its first run

    # -- the output guard --------------------------------------------------------------------
    def check_out(self, what: str = "--out") -> str:
        """Credentials, endpoint and bucket answer (one LIST of at most one key) before anything
        is created; else one-line :class:`RunError` (exit 2)."""
        r = Remote(self.where.url, create=True)   # first: without obstore it names the extra to install
        import obstore
        try:
            next(iter(obstore.list(r.store, None, chunk_size=1)), None)
        except Exception as e:
            raise RunError(f"{what} {self.where.url} can't be reached: {short(e)}") from None
        run = self.run_above()
        if run is not None:
            from ..errors import ConfigError
            raise ConfigError(what, f"{self.where.url} is inside the run {run}; runs are never written "
                                    "into (pass the folder that holds the runs)")
        return self.where.url

    def run_above(self) -> str | None:
        """The run this prefix lies in (itself included), or None: a HEAD of each prefix's
        ``meta.json``/``config.json`` from here up to the bucket (a new run written inside one,
        e.g. into its ``record.zarr/``, would make the healthy run unreadable)."""
        url = self.where
        top = URLPath(url.url[:url._root_len] + ("/" if url.url.startswith("file://") else ""))
        parts = [q for q in url.url[url._root_len:].split("/") if q]
        bucket = Remote(top.url, create=True)
        for i in range(len(parts), 0, -1):
            prefix = "/".join(parts[:i])
            if any(bucket.head(f"{prefix}/{f}") for f in RUN_FILES):
                return join(top.url, prefix)
        return None

    def mark(self) -> int:
        return len(CREATED)

    def clean_up(self, mark: int) -> None:
        """Delete the runs created since ``mark`` that logged no metrics row."""
        for run in CREATED[mark:]:
            try:
                if not (run.remote.get("metrics.jsonl") or b"").strip():
                    run.delete()
            except Exception:             # best effort: the rejection is what the user must see
                continue
