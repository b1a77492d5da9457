"""The object-store backend: a run is a prefix ``s3://bucket/prefix/RUN`` (or ``file:///path/RUN``)
reached through :class:`dyntool.storage.remote.Remote` (obstore).

An object is written by one PUT, visible whole or not at all, so every ``put`` is atomic as a
local rename is.  An object can't be appended to: the base's :class:`~.base.BufferedLines` keeps a
run's rows in memory and re-PUTs the whole object at most every few seconds.  Most of the
:class:`~.base.Backend` interface is the base's defaults (they are an object store's); what is
here are the primitives and what one request does better (a HEAD, one LIST of a whole prefix).

Choosing this backend makes no request and needs no credentials: the object store is reached on
first use (:attr:`ObjectStoreBackend.remote`), so what only asks what kind of place this is (a
command's ``--out`` refused for plain files, a watcher's signature) works offline.
"""
from __future__ import annotations

import functools

from .. import safeio
from ..errors import ConfigError, RunError
from ..location import URLPath, join
from .base import RUN_FILES, Backend
from .remote import Remote, failure, short

LISTED_MAX = 50_000     # objects one listing of a folder of runs reads (50 pages) before walking it instead


class ObjectStoreBackend(Backend):
    """The objects below one URL.  ``create``: a writer's (may make a ``file://`` folder)."""

    root = None                               # keys have no links that could lead out of a root
    walking = False                           # runs(): folder by folder, never one whole listing

    def __init__(self, where, create: bool = False, listed: dict[str, int] | None = None):
        self.where = URLPath(str(where))
        self.creates = create
        # a finished run found by a parent's runs(): its keys -> sizes from that one LIST, so what
        # is stored here (list, walk, has, size) is answered without a request (see live())
        self.listed = listed

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

    # -- the primitives ----------------------------------------------------------------------
    def get(self, key: str, cap: int | None = None) -> bytes | None:
        data = self.remote.get(key)
        if data is not None and cap is not None and len(data) > cap:
            raise safeio.BadFile(f"{key} is {len(data)} bytes, over the {cap}-byte limit for it; not read")
        return data

    def put(self, key: str, data: bytes, exclusive: bool = False, last_resort: bool = False) -> None:
        self.remote.put(key, data, create=exclusive)

    def list(self, key: str = "") -> tuple[list[str], list[str]]:
        if self.listed is None:
            return self.remote.list_dir(key)
        prefix = key.strip("/") + "/" if key.strip("/") else ""
        below = [k[len(prefix):].split("/", 1) for k in self.listed if k.startswith(prefix)]
        return sorted({b[0] for b in below if len(b) > 1}), sorted(b[0] for b in below if len(b) == 1)

    def delete(self, key: str = "") -> None:
        keys = list(self.remote.list(key))    # the remote first: it names the missing extra
        import obstore
        if keys:
            try:
                obstore.delete(self.remote.store, keys)
            except Exception as e:
                raise failure(e, join(self.remote.url, key), "deleted") from None

    def child(self, name: str) -> "ObjectStoreBackend":
        top = name.strip("/") + "/"
        sub = None if self.listed is None else {k[len(top):]: n for k, n in self.listed.items() if k.startswith(top)}
        child = ObjectStoreBackend(join(self.where.url, name), self.creates, sub)
        child.walking = self.walking
        return child

    def zarr_store(self, sub: str, mode: str = "r", specs: dict | None = None):
        # no specs: each chunk is one GET of a whole object, nothing to bound as a local read is
        return self.remote.zarr_store(sub, read_only=mode == "r")

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
            raise ConfigError(what, f"{self.where.url} is inside the run {run}; runs are never written "
                                    "into (pass the folder that holds the runs)")
        return self.where.url

    # -- what one request does better than the defaults --------------------------------------
    def has(self, key: str) -> bool:
        if self.listed is not None:
            return key in self.listed
        return bool(key) and self.remote.head(key)      # one HEAD, never the bytes (a checkpoint)

    def walk(self, key: str, guarded: bool = True) -> tuple[set[str], set[str], set[str]]:
        """One LIST of the objects below ``key`` (no links, no FIFOs in an object store)."""
        prefix = key.strip("/") + "/" if key.strip("/") else ""
        keys = self.listed if self.listed is not None else self.remote.list(key)
        return {k[len(prefix):] for k in keys if k.startswith(prefix)}, set(), set()

    def size(self) -> int:
        return sum((self.listed if self.listed is not None else self.remote.list()).values())

    def is_run(self) -> bool:
        """Asked once per backend (a HEAD or two): a run stays one, so the CLI's question and
        :func:`~dyntool.run.open_run`'s on the same backend cost one request."""
        if not getattr(self, "_run", False):
            self._run = super().is_run()
        return self._run

    def live(self) -> "ObjectStoreBackend":
        return self if self.listed is None else ObjectStoreBackend(self.where, self.creates)

    def runs(self, max_depth: int = 3):
        """The runs below, as the default walk finds them, from **one** LIST of every object below
        (paged by the server, 1000 objects a page) instead of a LIST per folder and per run; each
        run's backend is handed its part of that listing, so reading N finished runs (``ls``:
        sizes, every committed chunk there) asks no LIST per run.  Past :data:`LISTED_MAX` objects
        (big records) the default walk takes over: a LIST per folder, a HEAD per run."""
        if self.walking:
            yield from super().runs(max_depth)
            return
        sizes = self.remote.list(limit=LISTED_MAX)
        if len(sizes) > LISTED_MAX:
            walker = ObjectStoreBackend(self.where, self.creates)
            walker.walking = True                 # its children walk too: never one big listing each
            yield from walker.runs(max_depth)
            return
        found: set[tuple[str, ...]] = set()
        for key in sizes:
            folder, _, name = key.rpartition("/")
            parts = tuple(folder.split("/")) if folder else ()
            if name in RUN_FILES and len(parts) <= max_depth and \
                    not any(q.startswith(".") or q.endswith(".zarr") for q in parts):
                found.add(parts)
        tops = {p for p in found if not any(p[:i] in found for i in range(len(p)))}   # never inside a run
        listed: dict[tuple, dict[str, int]] = {p: {} for p in tops}
        for key, n in sizes.items():
            parts = key.split("/")
            run = next((tuple(parts[:i]) for i in range(len(parts)) if tuple(parts[:i]) in tops), None)
            if run is not None:
                listed[run]["/".join(parts[len(run):])] = n
        for parts in sorted(tops):
            yield ObjectStoreBackend(join(self.where.url, *parts), self.creates, listed[parts])

    def run_above(self) -> str | None:
        """The run this prefix lies in (itself included), or None: a HEAD of each prefix's
        ``meta.json``/``config.json`` from here up to the bucket (a new run written inside one,
        e.g. into its ``record.zarr/``, would make the healthy run unreadable)."""
        url = self.where
        top = URLPath(url.url[:url.root_len] + ("/" if url.url.startswith("file://") else ""))
        parts = [q for q in url.url[url.root_len:].split("/") if q]
        bucket = Remote(top.url, create=True)
        for i in range(len(parts), 0, -1):
            prefix = "/".join(parts[:i])
            if any(bucket.head(f"{prefix}/{f}") for f in RUN_FILES):
                return join(top.url, prefix)
        return None
