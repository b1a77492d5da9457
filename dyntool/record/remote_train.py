"""Training runs in object storage (``dyntool train --out s3://bucket/prefix``): what a local run
gets from :mod:`dyntool.paths` and the checkpoint file, for a URL (the run itself is written by
:mod:`.remote`).

- :func:`check_out`: credentials, endpoint and bucket answer (one LIST of at most one key below
  the prefix) before anything is created; else one-line :class:`RunError` (exit 2).
- :func:`cleanup_on_reject`: a run this command created and then rejected with exit 2 (e.g. a
  recording over its disk budget) is deleted again unless it logged a metrics row, as
  :func:`dyntool.paths.cleanup_on_reject` does locally: no half-written run is left behind.
- :func:`put_checkpoint` / :func:`get_checkpoint`: ``RUN/checkpoint.pt`` as one PUT (an object is
  visible whole or not at all, so a kill -9 keeps the previous checkpoint) and one GET;
  ``--resume s3://…/RUN`` resumes from it into a new run beside it.
"""
from __future__ import annotations

import contextlib
import io

from ..errors import DyntoolError, RunError
from ..extras import need
from ..location import is_url, join
from .object_store import CREATED, Remote, short
CHECKPOINT = "checkpoint.pt"


def check_out(url: str) -> str:
    """``url`` is an object-store prefix this process can list (credentials, endpoint, bucket)."""
    obstore = need("obstore", "s3:// runs", RunError)
    r = Remote(url, create=True)
    try:
        next(iter(obstore.list(r.store, None, chunk_size=1)), None)
    except Exception as e:
        raise RunError(f"--out {url} can't be reached: {short(e)}") from None
    return url


def delete_run(remote: Remote) -> None:
    import obstore
    keys = list(remote.list())
    if keys:
        obstore.delete(remote.store, keys)


@contextlib.contextmanager
def cleanup_on_reject(url: str):
    """Delete the runs this command created under ``url`` when it ends with an exit-2 error and
    they logged no metrics row."""
    before = len(CREATED)
    try:
        yield
    except DyntoolError as e:
        if e.exit_code == 2:
            for r in CREATED[before:]:
                with contextlib.suppress(Exception):
                    if not (r.get("metrics.jsonl") or b"").strip():
                        delete_run(r)
        raise


def parent(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def exists(url: str) -> bool:
    r = Remote(url)
    return r.get("meta.json") is not None or r.get("config.json") is not None


def put_checkpoint(run_url: str, obj: dict) -> None:
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    Remote(run_url, create=True).put(CHECKPOINT, buf.getvalue())


def get_checkpoint(run_url: str):
    """The checkpoint's bytes as a file object, or None when the run has none."""
    data = Remote(run_url).get(CHECKPOINT)
    return None if data is None else io.BytesIO(data)


def get_json(run_url: str, key: str):
    import json
    raw = Remote(run_url).get(key)
    if raw is None:
        raise RunError(f"cannot resume {run_url}: {join(run_url, key)} is missing")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise RunError(f"cannot resume {run_url}: {key} can't be read ({e})") from None


__all__ = ["check_out", "cleanup_on_reject", "put_checkpoint", "get_checkpoint", "get_json", "parent",
           "exists", "is_url", "CREATED"]
