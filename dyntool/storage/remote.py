"""The object-store client: ``s3://bucket/prefix`` (and ``file:///path``) through `obstore
<https://developmind.github.io/obstore>`_, as GET / HEAD / PUT / LIST and a zarr store for a sub-path.

It knows nothing about runs or records (those are :class:`dyntool.storage.ObjectStoreBackend`,
the storage backend built on it, and :mod:`dyntool.record.reader`, which reads a record over it).
Credentials come from the standard AWS variables only (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, optional ``AWS_SESSION_TOKEN``, ``AWS_REGION``/``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL`` for S3-compatible servers); they are never written to a run, a log or an error
message.  Missing credentials, an unreachable endpoint or bucket: one-line :class:`RunError` (exit 2)
before anything is written; an endpoint lost for longer than the ride-out while a run is written:
one-line :class:`StorageError` (exit 1).
"""
from __future__ import annotations

import asyncio
import datetime as _dt
import os
import re
import time
from urllib.parse import urlparse

from zarr.storage import ObjectStore, WrapperStore

from ..errors import RunError, StorageError
from ..extras import need
from ..location import URLPath, join


def _need():
    need("obstore", "s3:// runs", RunError)


def short(e: BaseException) -> str:
    """An obstore error as one line: the S3 error's code and message first when the server sent
    them (an XML body: ``NoSuchBucket``, ``InvalidAccessKeyId``, ...), then the error's first line
    without that body and the request's timing."""
    text = str(e).strip()
    first = (text.splitlines() or [type(e).__name__])[0]
    first = re.sub(r" in [\d.]+[mµn]?s\b", "", first.split(": <?xml")[0])
    first = re.sub(r", after \d+ retries, max_retries: \d+, retry_timeout: \S+", "", first)   # ours is said
    code, msg = (re.search(rf"<{tag}>([^<]*)</{tag}>", text) for tag in ("Code", "Message"))
    if code:
        first = f"{code.group(1)}{': ' + msg.group(1) if msg else ''} ({first})"
    return first[:300]


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
    _reachable(u.netloc)
    return _s3_store(u.netloc, u.path.strip("/") or None, RIDE_OUT)


def _quick(url: str):
    """The store of ``url`` with the PROBE policy: for requests after the endpoint stayed down past
    the ride-out (a failed run's last status), so the one-line error is not delayed by minutes."""
    u = urlparse(url)
    return object_store(url) if u.scheme == "file" else _s3_store(u.netloc, u.path.strip("/") or None, PROBE)


# Once the endpoint has answered, a request that fails transiently (connection refused or reset,
# a timeout, a 5xx) is retried with exponential backoff for up to ride_out_seconds() (30 s unless
# DYNTOOL_S3_RIDE_OUT says otherwise), so a writer rides out a short outage (obstore's own 2
# retries were spent in 0.24 s); the first contact of a process is a quick PROBE instead, so a
# silent or absent endpoint is refused in seconds.  Where obstore gives up early (a connection cut
# mid-request), Remote._call and OneLineErrors ask again themselves until the same ride-out ends.
RIDE_OUT_ENV = "DYNTOOL_S3_RIDE_OUT"
RIDE_OUT_S = 30
RIDE_OUT = {"max_retries": 16, "retry_timeout": None, "init_backoff": 0.25, "max_backoff": 8,
            "connect_timeout": "5s", "timeout": "20s"}           # retry_timeout None: ride_out_seconds()
PROBE = {"max_retries": 1, "retry_timeout": 5, "init_backoff": 0.25, "max_backoff": 1,
         "connect_timeout": "4s", "timeout": "8s"}
_DOWN: set[str] = set()                 # endpoints that stayed down past the ride-out (quick from then on)


def ride_out_seconds() -> float:
    """How long a transient failure is retried: ``DYNTOOL_S3_RIDE_OUT`` seconds (0 to 3600),
    default :data:`RIDE_OUT_S`; a bad value is a one-line :class:`RunError`."""
    text = os.environ.get(RIDE_OUT_ENV, "").strip()
    if not text:
        return float(RIDE_OUT_S)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise RunError(f"{RIDE_OUT_ENV}={text!r}: give the seconds to retry an unreachable object store (0 to 3600)")
    return value


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


_ANSWERED: set[tuple] = set()           # (endpoint, bucket) that answered this process's probe


def _s3_store(bucket: str, prefix: str | None, policy: dict):
    from obstore.store import S3Store
    endpoint = _endpoint()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    td = _dt.timedelta
    wait = policy["retry_timeout"]
    retry = {"max_retries": policy["max_retries"], "retry_timeout": td(seconds=ride_out_seconds() if wait is None else wait),
             "backoff": {"init_backoff": td(seconds=policy["init_backoff"]),
                         "max_backoff": td(seconds=policy["max_backoff"]), "base": 2}}
    kw = {"endpoint": endpoint} if endpoint else {}
    return S3Store(bucket, prefix=prefix, region=region, retry_config=retry,
                   client_options={"allow_http": bool(endpoint and endpoint.startswith("http://")),
                                   "connect_timeout": policy["connect_timeout"], "timeout": policy["timeout"]}, **kw)


def _reachable(bucket: str) -> None:
    """One LIST of at most one key with the short PROBE policy, once per endpoint and bucket and
    process: an endpoint that refuses, or accepts and never answers, is a one-line RunError within
    about 10 s (the ride-out policy would wait a minute on it)."""
    where = (_endpoint(), bucket)
    if where in _ANSWERED:
        return
    import obstore
    try:
        next(iter(obstore.list(_s3_store(bucket, None, PROBE), None, chunk_size=1)), None)
    except Exception as e:
        if "<Code>" not in str(e):         # no S3 answer at all (an S3 error, e.g. NoSuchBucket, is
            raise RunError(f"s3://{bucket} can't be reached: {short(e)}") from None   # the caller's to say)
    _ANSWERED.add(where)


def _lost(e: BaseException) -> bool:
    """An obstore error without an S3 answer (refused, reset, timed out after the ride-out): the
    endpoint is down, not refusing this request (an S3 error body has ``<Code>``)."""
    return type(e).__module__.split(".")[0] == "obstore" and "<Code>" not in str(e)


def _again(e: BaseException, where: str, started: float, delay: float) -> bool:
    """Ask again after ``delay`` seconds: the endpoint is lost but the ride-out begun at
    ``started`` lasts (obstore gives up early on some failures, e.g. a connection cut mid-request)."""
    return where.startswith("s3://") and _lost(e) and (_endpoint() or "") not in _DOWN and \
        time.monotonic() - started + delay < ride_out_seconds()


def failure(e: BaseException, where: str, verb: str) -> Exception:
    """The one-line error for a failed request: :class:`StorageError` (exit 1; later requests of
    this process try once, quickly) when the endpoint stayed down past the ride-out, else
    :class:`RunError` (exit 2: the server refused it, e.g. ``AccessDenied``)."""
    if not (where.startswith("s3://") and _lost(e)):
        return RunError(f"{where} can't be {verb}: {short(e)}")
    endpoint = _endpoint() or ""
    tried = (f"still down after a ride-out of {ride_out_seconds():g} s" if endpoint in _DOWN
             else f"retried for {ride_out_seconds():g} s")
    _DOWN.add(endpoint)
    return StorageError(f"{where} can't be {verb}: {short(e)} ({tried})")


class Remote:
    """GET/HEAD/PUT/LIST of the objects below one URL, errors as one line (:func:`failure`)."""

    def __init__(self, url, create: bool = False):
        self.url = str(URLPath(url))
        self.create = create
        self._store = object_store(self.url, create)
        self._quick_store = None

    @property
    def store(self):
        """The ride-out store; once the endpoint stayed down past a ride-out, the quick one."""
        if (_endpoint() or "") not in _DOWN or not self.url.startswith("s3://"):
            return self._store
        if self._quick_store is None:
            self._quick_store = _quick(self.url)
        return self._quick_store

    def _call(self, request, where: str, verb: str, kept: tuple = ()):
        """``request(store)``; a failure as :func:`failure`'s one line, but for the ``kept``
        exception types, the caller's to answer (a missing object read, an existing one created)."""
        started, delay = time.monotonic(), 0.25
        while True:
            try:
                out = request(self.store)
                break
            except kept:
                raise
            except Exception as e:
                if not _again(e, where, started, delay):
                    raise failure(e, where, verb) from None
                time.sleep(delay)
                delay = min(2 * delay, 8)
        _DOWN.discard(_endpoint() or "")        # it answers: the next outage is ridden out again
        return out

    def get(self, key: str) -> bytes | None:
        import obstore
        try:
            return self._call(lambda s: bytes(obstore.get(s, key).bytes()), join(self.url, key), "read",
                              (FileNotFoundError,))
        except FileNotFoundError:
            return None

    def head(self, key: str) -> bool:
        """Whether the object ``key`` exists (its metadata only, never its bytes)."""
        import obstore
        try:
            self._call(lambda s: obstore.head(s, key), join(self.url, key), "read", (FileNotFoundError,))
            return True
        except FileNotFoundError:
            return False

    def put(self, key: str, data: bytes, create: bool = False) -> None:
        import obstore
        mode = "create" if create else "overwrite"
        try:
            self._call(lambda s: obstore.put(s, key, data, mode=mode), join(self.url, key), "written",
                       (FileExistsError,))
        except FileExistsError:
            raise RunError(f"run {self.url} already exists; choose another name "
                           "(existing runs are never overwritten)") from None

    def list(self, prefix: str = "", limit: int | None = None) -> dict[str, int]:
        """key -> size of every object below ``prefix`` (past ``limit`` objects: stopped there,
        the pages after it never asked for)."""
        import obstore

        def pages(store) -> dict[str, int]:
            out: dict[str, int] = {}
            for batch in obstore.list(store, prefix or None):
                out.update((o["path"], o["size"]) for o in batch)
                if limit is not None and len(out) > limit:
                    break
            return out
        return self._call(pages, self.url, "listed")

    def list_dir(self, prefix: str = "") -> tuple[list[str], list[str]]:
        """(sub-folders, objects) directly below ``prefix``: one delimited LIST, never a listing
        of every chunk below it."""
        import obstore
        got = self._call(lambda s: obstore.list_with_delimiter(s, prefix.strip("/") or None),
                         join(self.url, prefix), "listed")
        return ([d.rstrip("/").rsplit("/", 1)[-1] for d in got["common_prefixes"]],
                [o["path"].rsplit("/", 1)[-1] for o in got["objects"]])

    def zarr_store(self, sub: str, read_only: bool):
        """zarr's store over obstore for the group at ``sub``; a writer's turns a request that
        failed past the ride-out into one-line :class:`StorageError` (not a page of Rust debug)."""
        url = join(self.url, sub)
        store = ObjectStore(object_store(url, create=not read_only), read_only=read_only)
        return store if read_only else OneLineErrors(store, url)


class OneLineErrors(WrapperStore):
    """A recording writer's zarr store: a lost endpoint asked again while the ride-out lasts, then
    obstore's failure as :func:`failure`'s one line (not a page of Rust debug)."""

    def __init__(self, store, url: str = ""):
        super().__init__(store)
        self.url = url

    def _with_store(self, inner):
        return type(self)(inner, self.url)

    async def _do(self, verb: str, key: str, request):
        """``await request()``, asked again as :meth:`Remote._call` does; obstore's failure as one line."""
        where, started, delay = join(self.url, key), time.monotonic(), 0.25
        while True:
            try:
                return await request()
            except Exception as e:
                if type(e).__module__.split(".")[0] != "obstore":
                    raise
                if not _again(e, where, started, delay):
                    raise failure(e, where, verb) from None
                await asyncio.sleep(delay)
                delay = min(2 * delay, 8)

    async def get(self, key, prototype, byte_range=None):
        return await self._do("read", key, lambda: self._store.get(key, prototype, byte_range))

    async def exists(self, key):
        return await self._do("read", key, lambda: self._store.exists(key))

    async def set(self, key, value):
        return await self._do("written", key, lambda: self._store.set(key, value))

    async def set_if_not_exists(self, key, value):
        return await self._do("written", key, lambda: self._store.set_if_not_exists(key, value))

    async def delete(self, key):
        return await self._do("deleted", key, lambda: self._store.delete(key))
