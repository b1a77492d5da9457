"""Runs in object storage, read: ``s3://bucket/prefix/RUN`` (and ``file:///path/RUN``), through
the object-store backend (:mod:`dyntool.record.object_store`) and zarr's ``ObjectStore``.

Same layout and guarantees as a local run (docs/FORMAT.md): every object is written by one PUT,
which an object store makes visible whole or not at all, so ``meta.json``/``config.json`` are
replaced atomically; zarr chunks land before the commit marker ``steps_written`` (one PUT of the
group's ``zarr.json``); a reader never reads past the marker.  It is what
:meth:`dyntool.storage.ObjectStoreBackend.reader` opens for :func:`.ranks.open_record`.
"""
from __future__ import annotations

from ..errors import RunError
from ..location import join
from .object_store import Remote, short
from .ranks import RECORD_DIR


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
        from .store import RecordError, commit_marker
        self.problems: list[str] = []
        self.notes: list[str] = []
        try:
            self.group = zarr.open_group(store=self.remote.zarr_store(self.sub, read_only=True), mode="r")
        except RunError:
            raise
        except Exception as e:
            raise RecordError(f"{self.sub} can't be read ({type(e).__name__}: {short(e)})") from None
        self.attrs = dict(self.group.attrs)
        self.marker = commit_marker(self.attrs, self.problems)
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
                why = f"array {name}: its metadata can't be read ({short(e)})"
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
