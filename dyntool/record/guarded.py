"""The guarded local store under a run's recording: every key read must resolve inside the run,
chunk files are read with a size bound from the array's declared geometry, zstd frames and crc32c
trailers are checked before a codec sees them, and a declared geometry that would allocate too
much (or far more chunks than files exist) is refused first.  The local storage backend
(:meth:`dyntool.storage.LocalBackend.zarr_store`) hands it to the one record reader
(:class:`dyntool.record.reader.RecordReader`).
"""
from __future__ import annotations

import asyncio
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore

from .. import safeio
from ..errors import RunError


class RecordError(RunError):
    """A recording that can't be read as written: a missing, truncated or garbage chunk, a
    chunk or metadata file that resolves outside the run, a commit marker past the data."""


_CHUNK_KEY = re.compile(r"(^|/)c(/\d+)+$")        # zarr v3 default chunk keys: NAME/c/0/1/...
_META_NAMES = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")
MAX_NDIM = 32
MAX_CHUNK_RAW = 1 << 30          # bytes of one decoded chunk (the writer aims at 4 MB)
MAX_CHUNKS = 1 << 24             # chunks of one array, never listed beyond this
COUNT_FILES_ABOVE = 1 << 16      # an array declaring more committed chunks has its files counted
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _encoded_bound(raw: int) -> int:
    """The most bytes a chunk of ``raw`` decoded bytes can take on disk (zstd bound + checksum)."""
    return raw + raw // 128 + (64 << 10)


class _ChunkSpec:
    """What the reader knows about one array's chunks, checked before any chunk is read."""

    def __init__(self, raw: int, zstd: bool, crc: bool):
        self.raw, self.zstd, self.crc = raw, zstd, crc
        self.cap = _encoded_bound(raw)


def frame_content_size(buf: bytes) -> int | None:
    """The decoded size a zstd frame header declares (None: not declared or not a frame)."""
    if len(buf) < 6 or buf[:4] != _ZSTD_MAGIC:
        return None
    fhd = buf[4]
    single, did, fcs_flag = (fhd >> 5) & 1, fhd & 3, fhd >> 6
    fcs = {0: single, 1: 2, 2: 4, 3: 8}[fcs_flag]
    if fcs == 0:
        return None
    off = 5 + (0 if single else 1) + (0, 1, 2, 4)[did]
    raw = buf[off:off + fcs]
    if len(raw) < fcs:
        return None
    v = int.from_bytes(raw, "little")
    return v + 256 if fcs == 2 else v


class GuardedStore(LocalStore):
    """A read-only local store that refuses keys resolving outside ``allowed`` (symlinked files or
    folders) and reports a missing *chunk* instead of zarr's silent fill value.

    Every file is read through :mod:`dyntool.safeio`: a regular file only (a FIFO or device is
    refused, never waited on), metadata JSON at most ``safeio.MAX_JSON_BYTES`` and nested at most
    ``safeio.MAX_DEPTH``; a chunk no bigger than its array's declared chunk can be once encoded,
    and a zstd frame declaring more decoded bytes than the chunk holds is refused before zarr
    allocates for it.  The reader only ever asks for chunks below the commit marker, so a chunk
    that is absent there was deleted (the writer stores every chunk, ``write_empty_chunks``)."""

    def __init__(self, root: Path, allowed: Path, specs: dict | None = None):
        super().__init__(root, read_only=True)
        self.allowed = allowed
        # array path in the store -> its chunks: filled in by the reader as it opens each array
        self.specs: dict[str, _ChunkSpec] = {} if specs is None else specs

    def _spec(self, key: str) -> _ChunkSpec | None:
        m = _CHUNK_KEY.search(key)
        return self.specs.get(key[:m.start()]) if m else None

    def _read(self, key: str) -> bytes | None:
        path = self.root / key
        name = key.rsplit("/", 1)[-1]
        meta = name in _META_NAMES
        spec = None if meta else self._spec(key)
        cap = safeio.MAX_JSON_BYTES if meta else spec.cap if spec else _encoded_bound(MAX_CHUNK_RAW)
        try:
            data = safeio.read_bytes(path, cap, key)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except safeio.BadFile as e:
            if os.path.isdir(path):                    # zarr probes keys that may be folders
                return None
            raise RecordError(str(e)) from None
        except OSError as e:
            raise RecordError(f"{key} can't be read ({e.strerror or e})") from None
        if meta:
            try:
                safeio.loads(data, key)
            except safeio.BadFile as e:
                raise RecordError(str(e)) from None
        elif spec is not None and spec.zstd:
            frame = data[:-4] if spec.crc else data
            declared = frame_content_size(frame)
            if declared is not None and declared > spec.raw:
                raise RecordError(f"chunk {key} declares {declared} decoded bytes, more than the "
                                  f"{spec.raw} its array's chunk holds (garbage)")
        return data

    async def get(self, key, prototype=None, byte_range=None):
        if not safeio.inside(self.root / key, self.allowed):
            raise RecordError(f"{key} resolves outside {self.allowed}; not read")
        if byte_range is not None:                     # sharded stores only: not written by dyntool
            try:
                safeio.check_regular(self.root / key, key)
            except FileNotFoundError:
                return None
            except safeio.BadFile as e:
                raise RecordError(str(e)) from None
            return await super().get(key, prototype, byte_range)
        data = await asyncio.to_thread(self._read, key)
        if data is None:
            if _CHUNK_KEY.search(key):
                raise RecordError(f"chunk {key} is missing (deleted?)")
            return None
        return (prototype or default_buffer_prototype()).buffer.from_bytes(data)

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        for key, _ in key_ranges:
            if not safeio.inside(self.root / key, self.allowed):
                raise RecordError(f"{key} resolves outside {self.allowed}; not read")
            try:
                safeio.check_regular(self.root / key, key)
            except FileNotFoundError:
                pass
            except safeio.BadFile as e:
                raise RecordError(str(e)) from None
        return await super().get_partial_values(prototype, key_ranges)


def zstd_frame_ok(path: str | Path, size: int | None = None, trailer: int = 0) -> str | None:
    """Structural check of a zstd-compressed chunk without decompressing: the magic number, then
    every block header up to the last block must lie inside the file and end exactly ``trailer``
    bytes (a checksum) before its end (a truncated or overwritten chunk fails).  Returns what is
    wrong, or None."""
    try:
        with safeio.open_regular(path) as (f, fsize):
            return _frame_ok(f, (fsize if size is None else size) - trailer)
    except safeio.BadFile as e:
        return str(e)


def _frame_ok(f, size: int) -> str | None:
    if size < 0:
        return f"truncated ({size} bytes)"
    buf = f.read(size if size <= 1 << 16 else 18)       # small chunks: parse in memory

    def at(off: int, n: int) -> bytes:
        if off + n <= len(buf):
            return buf[off:off + n]
        f.seek(off)
        return f.read(n)
    head = buf[:18]
    if len(head) < 6 or head[:4] != _ZSTD_MAGIC:
        return "not a zstd frame (garbage)"
    fhd = head[4]
    single, checksum, did = (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    fcs = {0: single, 1: 2, 2: 4, 3: 8}[fhd >> 6]
    off = 5 + (0 if single else 1) + (0, 1, 2, 4)[did] + fcs
    while True:
        h = at(off, 3)
        if len(h) < 3:
            return f"truncated ({size} bytes)"
        v = int.from_bytes(h, "little")
        last, btype, bsize = v & 1, (v >> 1) & 3, v >> 3
        if btype == 3:
            return "corrupt block header (garbage)"
        off += 3 + (1 if btype == 1 else bsize)
        if last:
            break
    end = off + 4 * checksum
    if end != size:
        return f"truncated ({size} bytes, the frame needs {end})" if end > size else \
            f"trailing garbage ({size - end} bytes after the frame)"
    return None


def chunk_files(base: Path, root: Path | None, odd: set[str] | None = None) -> tuple[set[str], set[str]]:
    """Keys of the regular files below ``base``, and of the symlinks resolving outside ``root``;
    entries that are neither files nor folders (FIFOs, devices, sockets) go to ``odd`` (one
    scandir per folder, no stat: zarr nests one folder per chunk axis, so this is the cost)."""
    files: set[str] = set()
    outside: set[str] = set()
    odd = set() if odd is None else odd
    seen: set[tuple[int, int]] = set()     # folders walked: a symlink loop is walked once

    def walk(d: str, prefix: str) -> None:
        try:
            st = os.stat(d)
            if (st.st_dev, st.st_ino) in seen:
                return
            seen.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            key = prefix + e.name
            if e.is_symlink():
                if root is not None and not safeio.inside(e.path, root):
                    outside.add(key)
                    continue
                if os.path.isfile(e.path):
                    files.add(key)
                elif os.path.isdir(e.path):
                    walk(e.path, key + "/")
                elif os.path.exists(e.path):
                    odd.add(key)
            elif e.is_dir(follow_symlinks=False):
                walk(e.path, key + "/")
            elif e.is_file(follow_symlinks=False):
                files.add(key)
            else:
                odd.add(key)

    walk(str(base), "")
    return files, outside


def check_array(where: str, z: Any, rows: int, keys: Callable[[], Iterable[str]]) -> str | None:
    """What is wrong with an array's declared geometry, before anything is allocated for it: its
    dimensions, a decoded chunk over ``MAX_CHUNK_RAW`` bytes, more committed chunks than
    ``MAX_CHUNKS``, or (for a big declaration) many more chunks than files that exist.  ``keys``:
    returns the keys of the files below the array (called only for a big declaration)."""
    shape = tuple(int(n) for n in z.shape)
    grid = z.metadata.chunk_grid
    cs = tuple(int(c) for c in getattr(grid, "chunk_shape", ()) or ())
    if len(shape) > MAX_NDIM:
        return f"{where}: {len(shape)} dimensions (at most {MAX_NDIM}); not read"
    if len(cs) != len(shape) or any(c < 1 for c in cs) or any(n < 0 for n in shape):
        return f"{where}: chunk grid {cs} does not fit the shape {list(shape)}; not read"
    itemsize = max(1, int(getattr(z.dtype, "itemsize", 1) or 1))
    raw = math.prod(cs) * itemsize
    if raw > MAX_CHUNK_RAW:
        return (f"{where}: declares chunks of {raw} bytes (shape {list(shape)}, chunks {list(cs)}), "
                f"over the {MAX_CHUNK_RAW}-byte limit; not read")
    counted = (min(rows, shape[0]),) + shape[1:] if shape else ()
    nchunks = math.prod(math.ceil(n / c) for n, c in zip(counted, cs))
    if nchunks > MAX_CHUNKS:
        return (f"{where}: declares shape {list(shape)} = {nchunks} chunks of {list(cs)}, over the "
                f"{MAX_CHUNKS}-chunk limit; not read")
    declared = math.prod(counted) * itemsize
    if nchunks > 1024 or declared > (256 << 20):
        have = sum(1 for k in keys() if _CHUNK_KEY.search(k))
        if have < nchunks / 2:
            return (f"{where}: declares shape {list(shape)} = {nchunks} chunks ({declared} bytes) but only "
                    f"{have} chunk files exist; not read")
    return None


def spec_of(z: Any) -> _ChunkSpec:
    codecs = [type(c).__name__ for c in z.metadata.codecs]
    crc = bool(codecs) and codecs[-1] == "Crc32cCodec"
    zstd = "ZstdCodec" in codecs and codecs.index("ZstdCodec") == len(codecs) - 1 - crc
    cs = z.metadata.chunk_grid.chunk_shape
    return _ChunkSpec(math.prod(cs) * max(1, int(z.dtype.itemsize or 1)), zstd, crc)
