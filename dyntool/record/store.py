"""One recorded array and the commit marker: what every reading of a recording is made of.

Readers never look past the group attribute ``steps_written`` (the commit marker the writer,
:mod:`.store_writer`, bumps only after the data has landed), so a live or killed run reads as the
steps it committed.  A missing, truncated or garbage chunk is a :class:`RecordError` naming the
array, never a raw codec error or zarr's silent fill value.  The reader of a whole recording, over
any storage backend, is :class:`dyntool.record.reader.RecordReader`; the guarded local store and
the geometry checks live in :mod:`.guarded`.
"""
from __future__ import annotations

import errno
import itertools
import math
from typing import Any

import numpy as np

from .. import safeio
from .guarded import RecordError, spec_of


class RecordedArray:
    """A lazy, read-only view of one recorded array, bounded by the commit marker.  A chunk that
    can't be read raises :class:`RecordError` naming the array (never a raw codec error)."""

    def __init__(self, name: str, z: Any, n: int, attrs: dict | None = None):
        self.name, self._z, self.n = name, z, n
        self.dims: tuple[str, ...] = tuple(z.metadata.dimension_names or ())
        self.attrs: dict = dict(z.attrs) if attrs is None else attrs
        self.dtype = z.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n, *self._z.shape[1:])

    def bounded(self, n: int) -> "RecordedArray":
        """The same array read up to ``n`` steps (a merged record's shortest rank)."""
        return RecordedArray(self.name, self._z, n, self.attrs)

    @property
    def ndim(self) -> int:
        return len(self._z.shape)

    def __len__(self) -> int:
        return self.n

    def _read(self, key):
        try:
            return self._z[key]
        except RecordError as e:
            raise RecordError(f"array {self.name}: {e}") from None
        except (RuntimeError, ValueError, MemoryError, OverflowError) as e:   # codec errors
            if "checksum do not match" in str(e):
                raise RecordError(f"array {self.name}: a chunk fails its checksum (CRC-32C): its bytes "
                                  "changed after they were written") from None
            raise RecordError(f"array {self.name}: a chunk can't be decoded ({e})") from None

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        if key and key[0] is Ellipsis:
            key = (slice(None),) + key
        first, rest = (key[0], key[1:]) if key else (slice(None), ())
        if isinstance(first, (int, np.integer)):
            i = int(first) + (self.n if first < 0 else 0)
            if not 0 <= i < self.n:
                raise IndexError(f"{self.name}: index {first} out of range for {self.n} recorded steps")
            first = i
        elif isinstance(first, slice):
            first = slice(*first.indices(self.n))
        else:
            idx = np.asarray(first).astype(np.int64)
            idx = np.where(idx < 0, idx + self.n, idx)
            if idx.size and (idx.min() < 0 or idx.max() >= self.n):
                raise IndexError(f"{self.name}: indices out of range for {self.n} recorded steps")
            return np.stack([self._read((int(i),) + rest) for i in idx]) if idx.size else \
                np.empty((0,) + self._z[(slice(0, 0),) + rest].shape[1:], dtype=self.dtype)
        return self._read((first,) + rest)

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out.astype(dtype) if dtype is not None else out

    def chunk_keys(self) -> list[tuple[tuple[int, ...], str]]:
        """(chunk coordinates, store key) of every chunk holding committed steps."""
        cs = self._z.metadata.chunk_grid.chunk_shape
        shape = self.shape
        ranges = [range(math.ceil(n / c)) for n, c in zip(shape, cs)]
        return [(c, f"{self.name}/{self._z.metadata.encode_chunk_key(c)}") for c in itertools.product(*ranges)]

    @property
    def checksummed(self) -> bool:
        """Whether each chunk carries a CRC-32C (the ``crc32c`` codec, in records since the
        hardening round)."""
        return any(type(c).__name__ == "Crc32cCodec" for c in self._z.metadata.codecs)

    def verify(self, full: bool, backend, key: str) -> list[str]:
        """Problems of the committed chunks, stored below ``key`` (the array's folder) of its
        storage ``backend``: missing, a link resolving outside the run, not a regular file, not a
        well-formed zstd frame (where the backend can tell without reading the chunk: a disk); with
        ``full``, every chunk is also decoded (and its checksum checked, where it has one)."""
        problems: list[str] = []
        spec = spec_of(self._z)
        cs = self._z.metadata.chunk_grid.chunk_shape
        files, outside, odd = backend.walk(key)
        for coords, ck in self.chunk_keys():
            rel = ck[len(self.name) + 1:]
            if rel in outside or (outside and any(rel.startswith(o + "/") for o in outside)):
                problems.append(f"array {self.name}: chunk {ck} resolves outside the run; not read")
                continue
            if rel in odd:
                problems.append(f"array {self.name}: chunk {ck} is not a regular file (a FIFO, device "
                                "or socket); not read")
                continue
            if rel not in files:
                problems.append(f"array {self.name}: chunk {ck} is missing (deleted?)")
                continue
            why = backend.frame_problem(f"{key}/{rel}", trailer=4 if spec.crc else 0) if spec.zstd else None
            if why is None and full:
                sel = tuple(slice(c * s, (c + 1) * s) for c, s in zip(coords, cs))
                if sel:
                    sel = (slice(sel[0].start, min(sel[0].stop, self.n)),) + sel[1:]
                try:
                    self[sel] if sel else self._read(())
                except RecordError as e:
                    why = str(e).removeprefix(f"array {self.name}: ")
            if why is not None:
                problems.append(f"array {self.name}: chunk {ck}: {why}")
        return problems

    def __repr__(self) -> str:
        dims = ", ".join(f"{d}={s}" for d, s in zip(self.dims, self.shape))
        return f"RecordedArray({self.name}: {dims}; {self.dtype})"


def read_marker(backend, sub: str) -> int:
    """The commit marker ``steps_written`` of the recording at ``sub`` of a storage ``backend``
    (:mod:`dyntool.storage`): the group's own metadata file only (no zarr machinery, no array
    opened — a live reader polls this); 0 when it is not a count.  Raises :class:`RecordError` when
    the metadata is missing, unreadable, or resolves outside the backend's root."""
    key = f"{sub}/zarr.json"
    if not backend.contained(key):
        raise RecordError(f"{key} resolves outside {backend.root}; not read")
    try:
        raw = backend.get(key, safeio.MAX_JSON_BYTES)
        if raw is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", key)
        attrs = safeio.loads(raw, "zarr.json").get("attributes", {})
    except (OSError, ValueError, AttributeError) as e:
        raise RecordError(f"record.zarr can't be read ({type(e).__name__}: {e})") from None
    return commit_marker(attrs if isinstance(attrs, dict) else {}, [])


def commit_marker(attrs: dict, problems: list[str]) -> int:
    m = attrs.get("steps_written", 0)
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        problems.append(f"record.zarr: the commit marker steps_written={m!r} is not a count; nothing read")
        return 0
    return m
