"""The one guard for where commands write: run names, output folders, and cleanup on rejection.

Every command that writes (``sim``, ``train``, ``study``, ``figures``) checks its ``--name`` and
``--out`` here *before* anything is created, and runs inside :func:`cleanup_on_reject`, so input
that is rejected later (a config error found while building the model, say) leaves no directory
behind.  Existing runs are never written into: an ``--out`` inside a run is refused.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from pathlib import Path

from .errors import ConfigError, DyntoolError, RunError


def check_name(name: str | None, what: str = "--name") -> None:
    """A run/study name is one path component: no separators, no ``..``, nothing hidden."""
    if name is None:
        return
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    if (not name.strip() or name in (".", "..") or name.startswith(".") or "\0" in name
            or any(s in name for s in seps)):
        raise ConfigError(what, f"{name!r} must be a plain directory name (no path separators, "
                                "no leading '.', no '..'); use --out for the parent folder")


def inside_run(p: Path) -> Path | None:
    from .run import is_run_dir
    for q in [p, *p.parents]:
        if q.exists() and is_run_dir(q):
            return q
    return None


def check_out(out: str | Path, what: str = "--out") -> Path:
    """``out`` can be created (or exists) and is writable, and is not inside a run. Creates nothing.
    An object-store URL (``s3://``, ``file://``) must answer a LIST instead (:mod:`.record.remote_train`)."""
    from .location import is_url, location
    if not str(out).strip():
        raise ConfigError(what, "is empty; give a folder (\".\" for the current one)")
    p = location(out, what)
    if is_url(p):
        from .record.remote_train import check_out as check_url
        return check_url(str(p))
    if "\0" in str(p):
        raise ConfigError(what, "contains a NUL byte")
    if any(len(os.fsencode(part)) > 255 for part in p.parts):    # NAME_MAX: stat() itself would fail
        raise ConfigError(what, "has a folder name longer than the file system allows (255 bytes)")
    run = inside_run(p.absolute())
    if run is not None:
        raise ConfigError(what, f"{p} is inside the run {run}; runs are never written into "
                                "(pass the folder that holds the runs)")
    anchor = p.absolute()
    while not anchor.exists():                       # nearest existing ancestor
        if anchor.is_symlink():                      # a dangling link: mkdir would fail on it
            raise RunError(f"output directory {p} can't be created: {anchor} is a broken symlink")
        anchor = anchor.parent
    if not anchor.is_dir():
        raise RunError(f"output directory {p} can't be created: {anchor} is not a directory")
    try:                                             # os.access lies for root and read-only mounts
        tempfile.TemporaryDirectory(dir=anchor, prefix=".dyntool-probe-").cleanup()
    except OSError as e:
        verb = "is not writable" if anchor == p.absolute() else f"can't be created in {anchor}"
        raise RunError(f"output directory {p} {verb}: {e.strerror or e}") from None
    return p


@contextlib.contextmanager
def cleanup_on_reject(out: str | Path | None):
    """On a rejected input (exit 2), remove what this command created under ``out``.

    Only directories that did not exist when the command started and were created after it
    started are removed: the new ``out`` folder itself (and parents it made) or new entries in it.
    Runs that were already there are never touched, and neither is anything that recorded a
    metrics row (a run that failed late keeps what it wrote).
    """
    if out is None:
        yield
        return
    from .location import is_url
    if is_url(out):
        from .record.remote_train import cleanup_on_reject as cleanup_url
        with cleanup_url(out):
            yield
        return
    p = Path(out).absolute()
    start = time.time() - 1
    created = [q for q in [p, *p.parents] if not q.exists()]          # deepest first
    before = set(os.listdir(p)) if p.is_dir() else set()
    try:
        yield
    except DyntoolError as e:
        if e.exit_code == 2:
            _remove_new(p, created, before, start)
        raise
    except Exception as e:
        full = disk_full(e)
        if full is None:
            raise
        _remove_new(p, created, before, start)         # a run that recorded rows keeps them
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
                    "free space and run again (what was recorded so far is kept)")


def _has_records(q: Path) -> bool:
    return any(m.stat().st_size > 0 for m in q.rglob("metrics.jsonl"))


def _remove_new(p: Path, created: list[Path], before: set[str], start: float) -> None:
    with contextlib.suppress(OSError):
        if created:
            top = created[-1]                       # the shallowest folder this command made
            if top.exists() and top.stat().st_ctime >= start and not _has_records(top):
                shutil.rmtree(top)
            return
        for name in set(os.listdir(p)) - before:
            q = p / name
            if q.is_dir() and not q.is_symlink() and q.stat().st_ctime >= start and not _has_records(q):
                shutil.rmtree(q)
