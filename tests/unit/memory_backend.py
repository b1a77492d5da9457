"""A storage backend of nothing but :class:`~dyntool.storage.base.Backend`'s eight primitives,
over a dict: what the base's derived defaults give a new backend for free (tests/unit/test_storage.py
runs the conformance suite on it; docs/architecture.md, "How to add a backend")."""
from __future__ import annotations

from dyntool import safeio
from dyntool.errors import RunError
from dyntool.location import URLPath, join
from dyntool.storage import Backend


class MemoryBackend(Backend):
    """The primitives only, over one dict shared by a location and its children: a new backend
    writes no more than this (docs/architecture.md, "How to add a backend")."""

    def __init__(self, where: str = "mem://x", objects: dict | None = None):
        self.where, self.objects = URLPath(where.replace("mem://", "s3://")), {} if objects is None else objects

    @property
    def path(self) -> str:
        return self.where.url

    def _key(self, key: str) -> str:
        return join(self.where.url, key)

    def get(self, key, cap=None):
        data = self.objects.get(self._key(key))
        data = data.to_bytes() if data is not None and not isinstance(data, bytes) else data   # zarr's Buffer
        if data is not None and cap is not None and len(data) > cap:
            raise safeio.BadFile(f"{key} is over the {cap}-byte limit for it; not read")
        return data

    def put(self, key, data, exclusive=False, last_resort=False):
        if exclusive and self._key(key) in self.objects:
            raise RunError(f"{self._key(key)} already exists")
        self.objects[self._key(key)] = bytes(data)

    def list(self, key=""):
        top = self._key(key) + "/"
        below = [k[len(top):].split("/") for k in self.objects if k.startswith(top)]
        return sorted({p[0] for p in below if len(p) > 1}), sorted(p[0] for p in below if len(p) == 1)

    def delete(self, key=""):
        gone = self._key(key)
        for k in [k for k in self.objects if k == gone or k.startswith(gone + "/")]:
            del self.objects[k]

    def child(self, name):
        return MemoryBackend(self._key(name), self.objects)

    def zarr_store(self, sub, mode="r", specs=None):
        from zarr.storage import MemoryStore
        return MemoryStore(_Prefixed(self.objects, self._key(sub)), read_only=mode == "r")

    def check_out(self, what="--out"):
        return self.path


class _Prefixed(dict):
    """zarr's MemoryStore keys below one prefix of the backend's dict (a view, not a copy)."""

    def __init__(self, objects, prefix):
        super().__init__()
        self.objects, self.prefix = objects, prefix + "/"

    def __getitem__(self, k):
        return self.objects[self.prefix + k]

    def __setitem__(self, k, v):
        self.objects[self.prefix + k] = v

    def __delitem__(self, k):
        del self.objects[self.prefix + k]

    def __contains__(self, k):
        return self.prefix + k in self.objects

    def get(self, k, default=None):
        return self.objects.get(self.prefix + k, default)

    def __iter__(self):
        return (k[len(self.prefix):] for k in list(self.objects) if k.startswith(self.prefix))

    def keys(self):
        return list(iter(self))

    def __len__(self):
        return len(self.keys())
