"""Reading a recording: a marker-bounded, read-only view of ``record.zarr`` and its integrity checks.

Readers never look past the group attribute ``steps_written`` (the commit marker the writer,
:mod:`.store_writer`, bumps only after the data has landed), so a live or killed run reads as the
steps it committed.  Every file read must resolve inside the run (:class:`GuardedStore`); a
missing, truncated or garbage chunk is a :class:`RecordError` naming the array, never a raw codec
error or zarr's silent fill value.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.storage import LocalStore

from ..errors import RunError


class RecordError(RunError):
    """A recording that can't be read as written: a missing, truncated or garbage chunk, a
    chunk or metadata file that resolves outside the run, a commit marker past the data."""


_CHUNK_KEY = re.compile(r"(^|/)c(/\d+)+$")        # zarr v3 default chunk keys: NAME/c/0/1/...


def _inside(path: str | Path, root: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(root)


class GuardedStore(LocalStore):
    """A read-only local store that refuses keys resolving outside ``allowed`` (symlinked files or
    folders) and reports a missing *chunk* instead of zarr's silent fill value.

    The reader only ever asks for chunks below the commit marker, so a chunk that is absent there
    was deleted (the writer stores every chunk, ``write_empty_chunks``)."""

    def __init__(self, root: Path, allowed: Path):
        super().__init__(root, read_only=True)
        self.allowed = allowed

    async def get(self, key, prototype=None, byte_range=None):
        if not _inside(self.root / key, self.allowed):
            raise RecordError(f"{key} resolves outside {self.allowed}; not read")
        out = await super().get(key, prototype, byte_range)
        if out is None and _CHUNK_KEY.search(key):
            raise RecordError(f"chunk {key} is missing (deleted?)")
        return out

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        for key, _ in key_ranges:
            if not _inside(self.root / key, self.allowed):
                raise RecordError(f"{key} resolves outside {self.allowed}; not read")
        return await super().get_partial_values(prototype, key_ranges)


def zstd_frame_ok(path: str | Path, size: int | None = None) -> str | None:
    """Structural check of a zstd-compressed chunk without decompressing: the magic number, then
    every block header up to the last block must lie inside the file and end exactly at its end
    (a truncated or overwritten chunk fails).  Returns what is wrong, or None."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size if size is None else size
        buf = f.read(size if size <= 1 << 16 else 18)       # small chunks: parse in memory

        def at(off: int, n: int) -> bytes:
            if off + n <= len(buf):
                return buf[off:off + n]
            f.seek(off)
            return f.read(n)
        head = buf[:18]
        if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
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


def _files(base: Path, root: Path | None) -> tuple[set[str], set[str]]:
    """Keys of the regular files below ``base``, and of the symlinks resolving outside ``root``
    (one scandir per folder, no stat: zarr nests one folder per chunk axis, so this is the cost)."""
    files: set[str] = set()
    outside: set[str] = set()

    def walk(d: str, prefix: str) -> None:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            key = prefix + e.name
            if e.is_symlink():
                if root is not None and not _inside(e.path, root):
                    outside.add(key)
                    continue
                if os.path.isfile(e.path):
                    files.add(key)
                elif os.path.isdir(e.path):
                    walk(e.path, key + "/")
            elif e.is_dir(follow_symlinks=False):
                walk(e.path, key + "/")
            elif e.is_file(follow_symlinks=False):
                files.add(key)

    walk(str(base), "")
    return files, outside


class RecordedArray:
    """A lazy, read-only view of one recorded array, bounded by the commit marker.  A chunk that
    can't be read raises :class:`RecordError` naming the array (never a raw codec error)."""

    def __init__(self, name: str, z: Any, n: int):
        self.name, self._z, self.n = name, z, n
        self.dims: tuple[str, ...] = tuple(z.metadata.dimension_names or ())
        self.attrs: dict = dict(z.attrs)
        self.dtype = z.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.n, *self._z.shape[1:])

    @property
    def ndim(self) -> int:
        return len(self._z.shape)

    @property
    def nbytes_on_disk(self) -> int:
        return _dir_size(Path(self._z.store.root) / self.name) if hasattr(self._z.store, "root") else 0

    def __len__(self) -> int:
        return self.n

    def _read(self, key):
        try:
            return self._z[key]
        except RecordError as e:
            raise RecordError(f"array {self.name}: {e}") from None
        except (RuntimeError, ValueError) as e:      # codec errors (zstd, reshape of a short chunk)
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

    def verify(self, full: bool = False, root: Path | None = None) -> list[str]:
        """Problems of the committed chunks: missing, outside the run, not a well-formed zstd frame;
        with ``full``, every chunk is also decoded."""
        problems: list[str] = []
        base = Path(self._z.store.root) / self.name
        zstd = any(type(c).__name__ == "ZstdCodec" for c in self._z.metadata.codecs)
        cs = self._z.metadata.chunk_grid.chunk_shape
        files, outside = _files(base, root)
        for coords, key in self.chunk_keys():
            rel = key.split("/", 1)[1]
            if rel in outside or (outside and any(rel.startswith(o + "/") for o in outside)):
                problems.append(f"array {self.name}: chunk {key} resolves outside the run; not read")
                continue
            if rel not in files:
                problems.append(f"array {self.name}: chunk {key} is missing (deleted?)")
                continue
            why = zstd_frame_ok(base / rel) if zstd else None
            if why is None and full:
                sel = tuple(slice(c * s, (c + 1) * s) for c, s in zip(coords, cs))
                sel = (slice(sel[0].start, min(sel[0].stop, self.n)),) + sel[1:]
                try:
                    self[sel]
                except RecordError as e:
                    why = str(e).removeprefix(f"array {self.name}: ")
            if why is not None:
                problems.append(f"array {self.name}: chunk {key}: {why}")
        return problems

    def __repr__(self) -> str:
        dims = ", ".join(f"{d}={s}" for d, s in zip(self.dims, self.shape))
        return f"RecordedArray({self.name}: {dims}; {self.dtype})"


def read_marker(path: str | Path, root: str | Path | None = None) -> int:
    """The commit marker ``steps_written`` of the recording at ``path``: the group's own metadata
    file only (no zarr machinery, no array opened — a live reader polls this); 0 when it is not a
    count.  Raises :class:`RecordError` when the metadata is missing, unreadable, or resolves
    outside ``root`` (default: the run directory)."""
    path = Path(path)
    root = Path(os.path.realpath(root if root is not None else path.parent))
    meta = path / "zarr.json"
    if not _inside(meta, root):
        raise RecordError(f"{path.name}/zarr.json resolves outside {root}; not read")
    try:
        attrs = json.loads(meta.read_text()).get("attributes", {})
    except (OSError, ValueError, AttributeError) as e:
        raise RecordError(f"record.zarr can't be read ({type(e).__name__}: {e})") from None
    return _marker(attrs if isinstance(attrs, dict) else {}, [])


def _marker(attrs: dict, problems: list[str]) -> int:
    m = attrs.get("steps_written", 0)
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        problems.append(f"record.zarr: the commit marker steps_written={m!r} is not a count; nothing read")
        return 0
    return m


class StoreReader:
    """Opens ``record.zarr`` read-only and never reads past the commit marker.

    ``root``: every file read must resolve inside it (default: the run directory).  ``limit``: read
    at most this many steps, so a live reader labelled with marker M holds exactly M rows even if
    the writer committed more since.  Whatever can't be read as written goes to ``problems``
    (arrays stay readable where they can be); ``refresh()`` re-reads the marker of a live run."""

    def __init__(self, path: str | Path, root: str | Path | None = None, limit: int | None = None):
        self.path = Path(path)
        self.root = Path(os.path.realpath(root if root is not None else self.path.parent))
        self.limit = limit
        self.refresh()

    def refresh(self) -> None:
        self.problems: list[str] = []
        if not _inside(self.path, self.root):
            raise RecordError(f"{self.path.name} resolves outside {self.root}; not read")
        try:
            self.group = zarr.open_group(store=GuardedStore(self.path, self.root), mode="r")
        except (RecordError, ValueError, KeyError, TypeError, OSError, FileNotFoundError) as e:
            raise RecordError(f"record.zarr can't be read ({type(e).__name__}: {e})") from None
        self.attrs = dict(self.group.attrs)
        marker = _marker(self.attrs, self.problems)
        self._cache: dict[str, RecordedArray] = {}
        self._z: dict[str, Any] = {}
        for name in self._listed():
            if not (self.path / name / "zarr.json").exists():
                self.problems.append(f"array {name}: its metadata (zarr.json) is missing; not readable")
                continue
            try:
                self._z[name] = self.group[name]
            except (RecordError, ValueError, KeyError, TypeError) as e:
                self.problems.append(f"array {name}: its metadata can't be read ({type(e).__name__}: {e})")
        have = min((z.shape[0] for z in self._z.values()), default=marker)
        if marker > have:
            short = sorted(n for n, z in self._z.items() if z.shape[0] < marker)
            which = "the arrays hold" if len(short) == len(self._z) else f"{', '.join(short[:4])} hold"
            self.problems.append(f"record.zarr: the commit marker says {marker} steps but {which} only "
                                 f"{have}; reading {have}")
        self.marker = marker
        self.steps_written = min(marker, have, limit) if (limit := self.limit) is not None else min(marker, have)

    def _listed(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir()
                      if p.is_dir() and p.name != "static" and not p.name.endswith(".partial"))

    def names(self) -> list[str]:
        """Names of the readable arrays (one broken array never hides the rest)."""
        return sorted(self._z)

    def __getitem__(self, name: str) -> RecordedArray:
        if name not in self._cache:
            if name not in self._z:
                raise RecordError(f"array {name} is not readable in this recording")
            self._cache[name] = RecordedArray(name, self._z[name], self.steps_written)
        return self._cache[name]

    def arrays(self) -> dict[str, RecordedArray]:
        return {n: self[n] for n in self.names()}

    def static_names(self) -> list[str]:
        d = self.path / "static"
        return sorted(p.name for p in d.iterdir() if (p / "zarr.json").exists()) if d.is_dir() else []

    def static_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the ``static/`` arrays (metadata only)."""
        try:
            return {k: tuple(self.group["static"][k].shape) for k in self.static_names()}
        except (KeyError, ValueError, TypeError) as e:
            raise RecordError(f"static arrays: metadata can't be read ({type(e).__name__}: {e})") from None

    def static(self, name: str) -> np.ndarray:
        """A per-run array without a step axis (``static/NAME``), read whole."""
        try:
            return self.group["static"][name][...]
        except RecordError as e:
            raise RecordError(f"static/{name}: {e}") from None
        except (RuntimeError, ValueError) as e:
            raise RecordError(f"static/{name}: can't be decoded ({e})") from None

    def verify(self, full: bool = False) -> list[str]:
        """Every problem of this recording: the ones found on opening plus each committed chunk
        checked (``full``: decoded too).  Reads no chunk when ``full`` is false."""
        out = list(self.problems)
        for name in self.names():
            out += self[name].verify(full, self.root)
        return out


def _dir_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            pass
    return total
