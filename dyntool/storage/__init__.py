"""Where a run's bytes live, behind one interface (:class:`~.base.Backend`):

- :class:`~.local.LocalBackend`: a folder (safeio reads, atomic writes, the guarded zarr store);
- :class:`~.objects.ObjectStoreBackend`: an ``s3://`` or ``file://`` prefix (obstore).

:func:`open_backend` chooses between them once, from :func:`dyntool.location.location`; the record
(:func:`dyntool.record.ranks.open_record`), :class:`dyntool.run.Run`,
:class:`dyntool.run_writer.RunWriter`, the output guard (:mod:`dyntool.paths`) and the trainer's
checkpoints are built on what it returns, and never ask which one it is.
"""
from __future__ import annotations

from pathlib import Path

from ..location import URLPath, is_url, location
from .base import Backend, LineWriter, Outside
from .local import LocalBackend
from .objects import ObjectStoreBackend


def open_backend(where, what: str = "RUN", root: Path | str | None = None,
                 create: bool = False) -> LocalBackend | ObjectStoreBackend:
    """The backend for ``where`` (a path, ``s3://bucket/prefix``, ``file:///path``, a
    :class:`~pathlib.Path` or :class:`~dyntool.location.URLPath`).  ``root``: a local reader never
    follows a link outside it (default: ``where`` itself); ``create``: a writer's object store, which
    may make a ``file://`` folder (a reader never does)."""
    loc = location(where, what)
    if is_url(loc):
        return ObjectStoreBackend(loc, create=create)
    return LocalBackend(loc, root)


def open_parent(where, what: str = "RUN", root: Path | str | None = None,
                create: bool = False) -> tuple[LocalBackend | ObjectStoreBackend, str]:
    """``(backend of where's folder, where's name)``: one file named by its full location (a
    checkpoint ``RUN/checkpoint.pt`` on a disk or in a bucket) reached through its folder's
    backend, so callers never split a URL or a path themselves."""
    loc = location(where, what)
    return open_backend(loc.parent, what, root, create), loc.name


__all__ = ["Backend", "LineWriter", "LocalBackend", "ObjectStoreBackend", "Outside", "URLPath", "open_backend",
           "open_parent"]
