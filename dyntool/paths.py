"""The one guard for where commands write: run names, output folders, and cleanup on rejection.

Every command that writes (``sim``, ``train``, ``study``, ``figures``) checks its ``--name`` and
``--out`` here *before* anything is created, and runs inside :func:`cleanup_on_reject`, so input
that is rejected later (a config error found while building the model, say) leaves no directory
behind.  Existing runs are never written into: an ``--out`` inside a run is refused.  What "created"
and "writable" mean for a folder or an object store is the storage backend's (:mod:`dyntool.storage`).
"""
from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from .errors import ConfigError, DyntoolError, RunError
from .storage import open_backend
from .storage.local import inside_run  # noqa: F401  (re-exported: the run a folder lies in)


def check_name(name: str | None, what: str = "--name") -> None:
    """A run/study name is one path component: no separators, no ``..``, nothing hidden."""
    if name is None:
        return
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    if (not name.strip() or name in (".", "..") or name.startswith(".") or "\0" in name
            or any(s in name for s in seps)):
        raise ConfigError(what, f"{name!r} must be a plain directory name (no path separators, "
                                "no leading '.', no '..'); use --out for the parent folder")


def check_out(out: str | Path, what: str = "--out") -> Path | str:
    """``out`` can be created (or exists) and is writable, and is not inside a run; an object-store
    URL (``s3://``, ``file://``) answers a LIST instead.  Creates nothing.  What is checked is the
    storage backend's (:meth:`dyntool.storage.Backend.check_out`)."""
    if not str(out).strip():
        raise ConfigError(what, "is empty; give a folder (\".\" for the current one)")
    return open_backend(out, what, create=True).check_out(what)


@contextlib.contextmanager
def cleanup_on_reject(out: str | Path | None):
    """On a rejected input (exit 2), or a full disk, remove what this command created under ``out``.

    Only what did not exist when the command started goes (the backend decides:
    :meth:`dyntool.storage.Backend.mark` / ``clean_up``): the new ``out`` folder itself (and parents
    it made), new runs in it.  Runs that were already there are never touched, and neither is
    anything that recorded a metrics row (a run that failed late keeps what it wrote).
    """
    if out is None:
        yield
        return
    backend = open_backend(out, "--out", create=True)
    mark = backend.mark()
    try:
        yield
    except DyntoolError as e:
        if e.exit_code == 2:
            backend.clean_up(mark)
        raise
    except Exception as e:
        full = disk_full(e)
        if full is None:
            raise
        backend.clean_up(mark)                # a run that recorded rows keeps them
        raise full from None


def _in_chain(e: BaseException | None, match) -> BaseException | None:
    """The first exception in ``e``'s cause/context chain that ``match`` accepts (loops cut)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if match(e):
            return e
        e = e.__cause__ or e.__context__
    return None


def out_of_gpu_memory(e: BaseException) -> RunError | None:
    """A one-line error for a device out of memory (``torch.OutOfMemoryError``: CUDA, also when
    wrapped), or None for anything else.  Not an internal error: the model, batch or recording
    does not fit beside what else holds the device."""
    oom = _in_chain(e, lambda x: type(x).__name__ == "OutOfMemoryError" and type(x).__module__.startswith("torch"))
    if oom is None:
        return None
    what = str(oom).split(". ")[0].strip() or "out of memory"
    return RunError(f"the GPU ran out of memory ({what}); lower data.batch_size, data.block_size or "
                    "record.seqs, or run fewer processes on the GPU (what was recorded so far is kept)")


def disk_full(e: BaseException) -> RunError | None:
    """A one-line error for a full disk or quota (also when wrapped, e.g. by the recording
    writer), or None for anything else."""
    full = _in_chain(e, lambda x: isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT))
    if full is None:
        return None
    where = f": {full.filename}" if getattr(full, "filename", None) else ""
    return RunError(f"the disk is full ({full.strerror or 'no space left on device'}{where}); "
                    "free space and run again (a run keeps the steps it recorded; one that recorded none "
                    "is removed)")
