"""Replace a file so that a reader sees its old content or its new one, never half a file.

Every writer of a file that must survive a kill or a full disk (meta.json, checkpoints, the token
cache, figures) goes through :func:`replacing`: write to a unique temp file beside the target,
then ``os.replace`` it over the target (atomic on POSIX).  On any failure the temp file is removed,
so no 0-byte ``*.tmp`` is left behind and the target keeps its previous content.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: str | os.PathLike, unique: bool = False) -> Iterator[Path]:
    """Yield a temp path beside ``path`` (``NAME.tmp``; ``unique``: a fresh name, for files that
    several processes may write at once, like the shared token cache); when the block ends without
    error it replaces ``path``."""
    path = Path(path)
    if unique:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        tmp = Path(name)
        os.chmod(tmp, 0o644)              # mkstemp makes 0600; none of these files is secret
    else:
        tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_bytes(path: str | os.PathLike, data: bytes, fsync: bool = False, unique: bool = False) -> None:
    """``path`` gets ``data`` atomically; ``fsync`` also forces it to disk before the rename."""
    with replacing(path, unique) as tmp, open(tmp, "wb") as fh:
        fh.write(data)
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())
