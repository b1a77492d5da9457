"""The object-store backend: ``s3://bucket/prefix`` (and ``file:///path``) through `obstore
<https://developmind.github.io/obstore>`_, as GET / PUT / LIST and a zarr store for a sub-path.

It knows nothing about runs or records (those are :class:`dyntool.storage.ObjectStoreBackend`,
the storage backend built on it, and :mod:`dyntool.record.reader`, which reads a record over it).  Credentials come from the standard AWS variables only
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optional ``AWS_SESSION_TOKEN``,
``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for S3-compatible servers); they are
never written to a run, a log or an error message.  Missing credentials, an unreachable endpoint
or bucket: one-line :class:`RunError` (exit 2) before anything is written.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
from urllib.parse import urlparse

from ..errors import RunError
from ..location import URLPath, join


def _need():
    from ..extras import need
    need("obstore", "s3:// runs", RunError)


def short(e: BaseException) -> str:
    """An obstore error as one line: the S3 error's code and message first when the server sent
    them (an XML body: ``NoSuchBucket``, ``InvalidAccessKeyId``, ...), then the error's first line
    without that body and the request's timing."""
    text = str(e).strip()
    first = (text.splitlines() or [type(e).__name__])[0]
    first = re.sub(r" in [\d.]+[mµn]?s\b", "", first.split(": <?xml")[0])
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


# Once the endpoint has answered, a request that fails transiently (connection refused or reset,
# a timeout, a 5xx) is retried with exponential backoff for up to RIDE_OUT_S seconds, so a writer
# rides out a short outage (obstore's own 2 retries were spent in 0.24 s); the first contact of a
# process is a quick PROBE instead, so a silent or absent endpoint is refused in seconds.
RIDE_OUT_S = 60
RIDE_OUT = {"max_retries": 16, "retry_timeout": RIDE_OUT_S, "init_backoff": 0.25, "max_backoff": 8,
            "connect_timeout": "5s", "timeout": "20s"}
PROBE = {"max_retries": 1, "retry_timeout": 5, "init_backoff": 0.25, "max_backoff": 1,
         "connect_timeout": "4s", "timeout": "8s"}
_ANSWERED: set[tuple] = set()           # (endpoint, bucket) that answered this process's probe


def _s3_store(bucket: str, prefix: str | None, policy: dict):
    from obstore.store import S3Store
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    td = _dt.timedelta
    retry = {"max_retries": policy["max_retries"], "retry_timeout": td(seconds=policy["retry_timeout"]),
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
    where = (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"), bucket)
    if where in _ANSWERED:
        return
    import obstore
    try:
        next(iter(obstore.list(_s3_store(bucket, None, PROBE), None, chunk_size=1)), None)
    except Exception as e:
        if "<Code>" not in str(e):         # no S3 answer at all (an S3 error, e.g. NoSuchBucket, is
            raise RunError(f"s3://{bucket} can't be reached: {short(e)}") from None   # the caller's to say)
    _ANSWERED.add(where)


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
            raise RunError(f"{join(self.url, key)} can't be read: {short(e)}") from None

    def head(self, key: str) -> bool:
        """Whether the object ``key`` exists (its metadata only, never its bytes)."""
        import obstore
        try:
            obstore.head(self.store, key)
            return True
        except FileNotFoundError:
            return False
        except Exception as e:
            raise RunError(f"{join(self.url, key)} can't be read: {short(e)}") from None

    def put(self, key: str, data: bytes, create: bool = False) -> None:
        import obstore
        try:
            obstore.put(self.store, key, data, mode="create" if create else "overwrite")
        except FileExistsError:
            raise RunError(f"run {self.url} already exists; choose another name "
                           "(existing runs are never overwritten)") from None
        except Exception as e:
            raise RunError(f"{join(self.url, key)} can't be written: {short(e)}") from None

    def list(self, prefix: str = "") -> dict[str, int]:
        """key -> size of every object below ``prefix``."""
        import obstore
        try:
            return {o["path"]: o["size"] for batch in obstore.list(self.store, prefix or None)
                    for o in batch}
        except Exception as e:
            raise RunError(f"{self.url} can't be listed: {short(e)}") from None

    def list_dir(self, prefix: str = "") -> tuple[list[str], list[str]]:
        """(sub-folders, objects) directly below ``prefix``: one delimited LIST, never a listing
        of every chunk below it."""
        import obstore
        try:
            got = obstore.list_with_delimiter(self.store, prefix.strip("/") or None)
        except Exception as e:
            raise RunError(f"{join(self.url, prefix)} can't be listed: {short(e)}") from None
        return ([d.rstrip("/").rsplit("/", 1)[-1] for d in got["common_prefixes"]],
                [o["path"].rsplit("/", 1)[-1] for o in got["objects"]])

    def zarr_store(self, sub: str, read_only: bool):
        from zarr.storage import ObjectStore
        return ObjectStore(object_store(join(self.url, sub), create=not read_only), read_only=read_only)


