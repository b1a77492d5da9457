"""Runs in object storage: ``s3://bucket/prefix/RUN`` (and ``file:///path/RUN``), written and read
through `obstore <https://developmind.github.io/obstore>`_ and zarr's ``ObjectStore``.

Same layout and guarantees as a local run (docs/FORMAT.md): every object is written by one PUT,
which an object store makes visible whole or not at all, so ``meta.json``/``config.json`` are
replaced atomically; zarr chunks land before the commit marker ``steps_written`` (one PUT of the
group's ``zarr.json``); a reader never reads past the marker.  Differences: ``metrics.jsonl`` can't
be appended to, so it is re-PUT whole at most every ``flush_seconds`` (and at the end): a kill -9
loses at most that many seconds of metrics rows, never the record's committed steps; a run is
never overwritten (``config.json`` is PUT with ``mode="create"``).

Credentials come from the standard AWS variables only (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, optional ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL`` for S3-compatible servers); they are never written to a run, a log or an
error message.  Missing credentials, an unreachable endpoint or bucket: one-line :class:`RunError`
(exit 2) before anything is written.
"""
from __future__ import annotations

import datetime as _dt
import io
import json
import os
import threading
import time
from urllib.parse import urlparse

from .. import safeio
from ..errors import RunError
from ..location import SCHEMES, URLPath, is_url, join  # noqa: F401  (is_url, join: re-exported)
from .ranks import RECORD_DIR, RankedStore, rank_dir


def _need():
    from ..extras import need
    need("obstore", "s3:// runs", RunError)


def _short(e: BaseException) -> str:
    """An obstore error as one line (its first), without anything but the message."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def object_store(url: str, create: bool = False):
    """An obstore store rooted at ``url`` (s3:// or file://).  ``create``: a writer's, which may
    make a ``file://`` folder; a reader never creates one (a missing one is a one-line error)."""
    _need()
    u = urlparse(url)
    if u.scheme == "file":
        from obstore.store import LocalStore
        if create:
            os.makedirs(u.path, exist_ok=True)
        elif not os.path.isdir(u.path):
            raise RunError(f"{url} does not exist (no such folder)")
        return LocalStore(u.path)
    if u.scheme != "s3" or not u.netloc:
        raise RunError(f"not an object-store URL: {url!r} (use s3://bucket/prefix or file:///path)")
    missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not os.environ.get(k)]
    if missing:
        raise RunError(f"no AWS credentials for {url}: set {' and '.join(missing)} "
                       "(and AWS_ENDPOINT_URL for an S3-compatible server)")
    from obstore.store import S3Store
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    td = _dt.timedelta
    retry = {"max_retries": 2, "retry_timeout": td(seconds=10),
             "backoff": {"init_backoff": td(seconds=0.1), "max_backoff": td(seconds=1), "base": 2}}
    kw = {"endpoint": endpoint} if endpoint else {}
    return S3Store(u.netloc, prefix=u.path.strip("/") or None, region=region, retry_config=retry,
                   client_options={"allow_http": bool(endpoint and endpoint.startswith("http://")),
                                   "connect_timeout": "5s", "timeout": "30s"}, **kw)


class Remote:
    """GET/PUT/LIST of the objects below one URL, errors as one-line :class:`RunError`."""

    def __init__(self, url, create: bool = False):
        self.url = str(URLPath(url))
        self.create = create
        self.store = object_store(self.url, create)

    def get(self, key: str) -> bytes | None:
        import obstore
        try:
            return bytes(obstore.get(self.store, key).bytes())
        except FileNotFoundError:
            return None
        except Exception as e:
            raise RunError(f"{join(self.url, key)} can't be read: {_short(e)}") from None

    def put(self, key: str, data: bytes, create: bool = False) -> None:
        import obstore
        try:
            obstore.put(self.store, key, data, mode="create" if create else "overwrite")
        except FileExistsError:
            raise RunError(f"run {self.url} already exists; choose another name "
                           "(existing runs are never overwritten)") from None
        except Exception as e:
            raise RunError(f"{join(self.url, key)} can't be written: {_short(e)}") from None

    def list(self, prefix: str = "") -> dict[str, int]:
        """key -> size of every object below ``prefix``."""
        import obstore
        try:
            return {o["path"]: o["size"] for batch in obstore.list(self.store, prefix or None)
                    for o in batch}
        except Exception as e:
            raise RunError(f"{self.url} can't be listed: {_short(e)}") from None

    def list_dir(self, prefix: str = "") -> tuple[list[str], list[str]]:
        """(sub-folders, objects) directly below ``prefix``: one delimited LIST, never a listing
        of every chunk below it."""
        import obstore
        try:
            got = obstore.list_with_delimiter(self.store, prefix.strip("/") or None)
        except Exception as e:
            raise RunError(f"{join(self.url, prefix)} can't be listed: {_short(e)}") from None
        return ([d.rstrip("/").rsplit("/", 1)[-1] for d in got["common_prefixes"]],
                [o["path"].rsplit("/", 1)[-1] for o in got["objects"]])

    def zarr_store(self, sub: str, read_only: bool):
        from zarr.storage import ObjectStore
        return ObjectStore(object_store(join(self.url, sub), create=not read_only), read_only=read_only)


# -- writing -----------------------------------------------------------------------------------

class _Metrics:
    """metrics.jsonl in object storage: rows kept in memory, the whole object re-PUT at most every
    ``flush_seconds`` (and on close)."""

    def __init__(self, remote: Remote, flush_seconds: float = 5.0):
        self.remote, self.every, self.lines, self.last = remote, flush_seconds, [], time.monotonic()
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
        self.remote.put("metrics.jsonl", data)

    def close(self) -> None:
        self.flush()


def create_run(out_url: str, kind: str, config: dict, name: str | None = None, **kw):
    """A :class:`dyntool.run_writer.RunWriter` whose run lives at ``out_url/NAME``."""
    from ..run_writer import RunWriter
    import secrets

    class RemoteRunWriter(RunWriter):
        def __init__(self, remote: Remote, meta: dict):
            self.path, self.remote, self.meta = remote.url, remote, meta
            self._metrics = _Metrics(remote)
            self.store = None
            self._old_handlers = {}

        def open_store(self, chunk_steps: int = 16, flush_seconds: float = 30.0, attrs: dict | None = None,
                       rank: int = 0):
            from .store_writer import StoreWriter
            self.store = StoreWriter(self.remote.zarr_store(rank_dir(rank), read_only=False),
                                     chunk_steps, flush_seconds, attrs)
            return self.store

        def update_meta(self, _final_status: bool = False, **kv) -> None:
            from ..run_writer import _jsonable, _now
            self.meta.update(kv, updated=_now())
            self.remote.put("meta.json", json.dumps(_jsonable(self.meta), indent=2).encode())

    from ..run_writer import _jsonable, _now, environment
    run_id = name or f"{kind}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    remote = Remote(join(out_url, run_id), create=True)
    if remote.get("meta.json") is not None:
        raise RunError(f"run {remote.url} already exists; choose another name (existing runs are never overwritten)")
    remote.put("config.json", json.dumps(_jsonable(config), indent=2).encode(), create=True)
    from .remote_train import CREATED
    CREATED.append(remote)                   # deleted again if this command is rejected (exit 2)
    meta = {"id": run_id, "kind": kind, "status": "running", "created": _now(), "updated": _now(),
            "seeds": list(kw.get("seeds") or []), "tags": list(kw.get("tags") or []),
            "device": kw.get("device", "cpu"), **environment(), **(kw.get("extra_meta") or {})}
    w = RemoteRunWriter(remote, meta)
    w.update_meta()
    return w


# -- reading -----------------------------------------------------------------------------------

class RemoteStoreReader:
    """A marker-bounded, read-only recording in object storage (the API of
    :class:`~dyntool.record.store.StoreReader` that the tools use)."""

    def __init__(self, remote: Remote, sub: str = RECORD_DIR, limit: int | None = None):
        self.remote, self.sub, self.limit = remote, sub, limit
        self.path, self.root = join(remote.url, sub), remote.url
        self.refresh()

    def refresh(self) -> None:
        import zarr
        from .guarded import check_array
        from .store import RecordError, _marker
        self.problems: list[str] = []
        self.notes: list[str] = []
        try:
            self.group = zarr.open_group(store=self.remote.zarr_store(self.sub, read_only=True), mode="r")
        except RunError:
            raise
        except Exception as e:
            raise RecordError(f"{self.sub} can't be read ({type(e).__name__}: {_short(e)})") from None
        self.attrs = dict(self.group.attrs)
        self.marker = _marker(self.attrs, self.problems)
        self.unreadable: dict[str, str] = {}           # array -> why (as the local reader's)
        self._z = {}
        listed = [d for d in self.remote.list_dir(self.sub)[0] if d != "static" and not d.endswith(".partial")]
        for name in sorted(listed):          # listed, not group.array_keys(): one bad member breaks that
            try:
                z = self.group[name]
                if not hasattr(z, "shape"):
                    raise TypeError("not an array")
                why = check_array(f"array {name}", z, self.marker,
                                  lambda name=name: self.remote.list(f"{self.sub}/{name}"))
            except RunError:
                raise
            except Exception as e:
                why = f"array {name}: its metadata can't be read ({_short(e)})"
            if why is None:
                self._z[name] = z
            else:
                self.unreadable[name] = why
                self.problems.append(why)
        have = min((z.shape[0] for z in self._z.values()), default=self.marker)
        if self.marker > have:
            self.problems.append(f"{self.sub}: the commit marker says {self.marker} steps but the arrays "
                                 f"hold only {have}; reading {have}")
        n = min(self.marker, have)
        self.steps_written = n if self.limit is None else min(n, self.limit)
        self._cache = {}

    def names(self) -> list[str]:
        return sorted(self._z)

    def __getitem__(self, name: str):
        from .store import RecordedArray, RecordError
        if name not in self._z:
            raise RecordError(f"array {name} is not readable in this recording")
        if name not in self._cache:
            self._cache[name] = RecordedArray(name, self._z[name], self.steps_written)
        return self._cache[name]

    def arrays(self) -> dict:
        return {n: self[n] for n in self.names()}

    def static_names(self) -> list[str]:
        try:
            return sorted(self.group["static"].array_keys())
        except KeyError:
            return []

    def static_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the ``static/`` arrays (metadata only), as the local reader's."""
        return {n: tuple(self.group["static"][n].shape) for n in self.static_names()}

    def static(self, name: str):
        return self.group["static"][name][...]

    def verify(self, full: bool = False) -> list[str]:
        """Every committed chunk exists (one LIST); ``full``: each is also decoded."""
        from .store import RecordError
        out = list(self.problems)
        have = set(self.remote.list(self.sub))
        for name in self.names():
            arr = self[name]
            cs = arr._z.metadata.chunk_grid.chunk_shape
            for coords, key in arr.chunk_keys():
                if f"{self.sub}/{key}" not in have:
                    out.append(f"array {name}: chunk {key} is missing (deleted?)")
                elif full:
                    sel = tuple(slice(c * s, (c + 1) * s) for c, s in zip(coords, cs))
                    sel = (slice(sel[0].start, min(sel[0].stop, arr.n)),) + sel[1:]
                    try:
                        arr[sel]
                    except RecordError as e:
                        out.append(f"array {name}: chunk {key}: {e}")
        return out


def open_remote_record(remote: Remote, limit: int | None = None):
    """One rank's recording, or every rank's merged (:mod:`.ranks`); None when there is none."""
    if remote.get(f"{RECORD_DIR}/zarr.json") is None:
        return None
    main = RemoteStoreReader(remote, RECORD_DIR, limit)
    world = main.attrs.get("world_size", 1)
    if not isinstance(world, int) or isinstance(world, bool) or world <= 1:
        return main
    from .store import RecordError
    ranks = [main]
    for r in range(1, world):                # as the local reader (ranks.open_record) words it
        if remote.get(f"{rank_dir(r)}/zarr.json") is None:
            why = "it is missing"
        else:
            try:
                ranks.append(RemoteStoreReader(remote, rank_dir(r), limit))
                continue
            except RecordError as e:
                why = str(e).split(" (GroupNotFound")[0]
        return RankedStore([main], [f"rank {r}'s recording {rank_dir(r)} can't be read ({why}); "
                                    "showing rank 0's sequences only"])
    return RankedStore(ranks)


def open_remote_run(url: str):
    """:func:`dyntool.open_run` for an object-store URL: the same :class:`~dyntool.run.Run` API."""
    from ..run import Run, _check_meta, json_object, metric_rows, orphan_ranks

    class RemoteRun(Run):
        def __post_init__(self):
            self.root = None

        @property
        def id(self) -> str:
            return self.meta.get("id") or self.path.name

        @property
        def store(self):
            if self._store is None:
                from .store import RecordError
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

        def refresh(self):
            fresh = open_remote_run(str(self.path))
            self.meta, self.config, self._problems = fresh.meta, fresh.config, fresh._problems
            self._store, self._metrics, self._checked = None, None, False
            return self

        def size_bytes(self) -> int:
            return sum(self.remote.list().values())

    remote = Remote(url)
    problems: list[str] = []
    raw = {k: remote.get(k) for k in ("meta.json", "config.json")}
    if all(v is None for v in raw.values()):
        raise RunError(f"{url} is not a dyntool run (no meta.json or config.json)")
    meta, config = (json_object(raw[k], k, problems) for k in ("meta.json", "config.json"))
    run = RemoteRun(URLPath(remote.url), config, _check_meta(meta, problems), problems)
    run.remote = remote
    return run


RUN_FILES = ("meta.json", "config.json")


def is_remote_run(url) -> bool:
    """A run folder in object storage (it holds meta.json or config.json)."""
    return any(f in RUN_FILES for f in Remote(url).list_dir()[1])


def find_remote_runs(url, max_depth: int = 3) -> list[URLPath]:
    """Run folders at or below ``url`` (studies included), sorted; one delimited LIST per folder
    visited, folders named ``*.zarr`` or ``.*`` never entered (the same walk as a local folder)."""
    remote = Remote(url)
    found: list[URLPath] = []

    def walk(prefix: str, depth: int) -> None:
        dirs, files = remote.list_dir(prefix)
        if any(f in RUN_FILES for f in files):
            found.append(URLPath(join(remote.url, prefix)))
            return
        if depth >= max_depth:
            return
        for d in sorted(dirs):
            if not d.startswith(".") and not d.endswith(".zarr"):
                walk(f"{prefix}/{d}".strip("/"), depth + 1)

    dirs, files = remote.list_dir()
    if not dirs and not files:              # object stores have no empty folders: nothing is there
        raise RunError(f"runs directory {remote.url} does not exist (nothing is stored under it)")
    walk("", 0)
    return found


def read_remote_json(url, name: str) -> bytes | None:
    """The raw bytes of ``url/name`` (e.g. a study's summary.json), None if absent."""
    return Remote(url).get(name)

