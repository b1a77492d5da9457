"""Reading a recording: a marker-bounded, read-only view of ``record.zarr`` and its integrity checks.

Readers never look past the group attribute ``steps_written`` (the commit marker the writer,
:mod:`.store_writer`, bumps only after the data has landed), so a live or killed run reads as the
steps it committed.  Every file read must resolve inside the run (:class:`GuardedStore`); a
missing, truncated or garbage chunk is a :class:`RecordError` naming the array, never a raw codec
error or zarr's silent fill value.  The guarded store and the geometry checks live in
:mod:`.guarded`.
"""
from __future__ import annotations

import itertools
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from .. import safeio
from .guarded import GuardedStore, RecordError, chunk_files, spec_of, check_array, zstd_frame_ok  # noqa: F401 (re-exported)


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

    def verify(self, full: bool = False, root: Path | None = None) -> list[str]:
        """Problems of the committed chunks: missing, outside the run, not a well-formed zstd frame;
        with ``full``, every chunk is also decoded (and its checksum checked, where it has one)."""
        problems: list[str] = []
        base = Path(self._z.store.root) / self.name
        codecs = [type(c).__name__ for c in self._z.metadata.codecs]
        crc = bool(codecs) and codecs[-1] == "Crc32cCodec"
        zstd = "ZstdCodec" in codecs and (codecs.index("ZstdCodec") == len(codecs) - 1 - crc)
        cs = self._z.metadata.chunk_grid.chunk_shape
        odd: set[str] = set()
        files, outside = chunk_files(base, root, odd)
        for coords, key in self.chunk_keys():
            rel = key[len(self.name) + 1:]
            if rel in outside or (outside and any(rel.startswith(o + "/") for o in outside)):
                problems.append(f"array {self.name}: chunk {key} resolves outside the run; not read")
                continue
            if rel in odd:
                problems.append(f"array {self.name}: chunk {key} is not a regular file (a FIFO, device "
                                "or socket); not read")
                continue
            if rel not in files:
                problems.append(f"array {self.name}: chunk {key} is missing (deleted?)")
                continue
            why = zstd_frame_ok(base / rel, trailer=4 if crc else 0) if zstd else None
            if why is None and full:
                sel = tuple(slice(c * s, (c + 1) * s) for c, s in zip(coords, cs))
                if sel:
                    sel = (slice(sel[0].start, min(sel[0].stop, self.n)),) + sel[1:]
                try:
                    self[sel] if sel else self._read(())
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
    if not safeio.inside(meta, root):
        raise RecordError(f"{path.name}/zarr.json resolves outside {root}; not read")
    try:
        attrs = safeio.read_json(meta).get("attributes", {})
    except (OSError, ValueError, AttributeError) as e:
        raise RecordError(f"record.zarr can't be read ({type(e).__name__}: {e})") from None
    return commit_marker(attrs if isinstance(attrs, dict) else {}, [])


def commit_marker(attrs: dict, problems: list[str]) -> int:
    m = attrs.get("steps_written", 0)
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        problems.append(f"record.zarr: the commit marker steps_written={m!r} is not a count; nothing read")
        return 0
    return m


_INT_ATTRS = ("query_offset", "key_offset", "T", "block", "layer", "head")


def _clean_attrs(where: str, attrs: Any, problems: list[str]) -> dict:
    """Array attributes the tools compute with must be non-negative integers; others are dropped
    (reported) so a crafted value can't break a reader."""
    if not isinstance(attrs, dict):
        return {}
    out = dict(attrs)
    for k in _INT_ATTRS:
        v = out.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**53):
            problems.append(f"{where}: attribute {k}={str(v)[:40]!r} is not a non-negative integer; ignored")
            del out[k]
    return out


def _clean_group_attrs(attrs: dict, problems: list[str]) -> dict:
    out = dict(attrs)
    for k in ("probe_tokens", "tokens"):
        v = out.get(k)
        if v is None:
            continue
        flat = all(isinstance(t, (str, int)) for t in v) if isinstance(v, list) else False
        nested = isinstance(v, list) and all(isinstance(r, list) and all(isinstance(t, (str, int)) for t in r)
                                             for r in v)
        if not (flat or nested):
            problems.append(f"record.zarr: attribute {k} is not a list of tokens; ignored")
            del out[k]
    return out


class StoreReader:
    """Opens ``record.zarr`` read-only and never reads past the commit marker.

    ``root``: every file read must resolve inside it (default: the run directory).  ``limit``: read
    at most this many steps, so a live reader labelled with marker M holds exactly M rows even if
    the writer committed more since.  Whatever can't be read as written goes to ``problems``
    (arrays stay readable where they can be); ``notes`` holds what is worth knowing but not damage
    (a record written without checksums); ``refresh()`` re-reads the marker of a live run."""

    def __init__(self, path: str | Path, root: str | Path | None = None, limit: int | None = None):
        self.path = Path(path)
        self.root = Path(os.path.realpath(root if root is not None else self.path.parent))
        self.limit = limit
        self.refresh()

    def refresh(self) -> None:
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.unreadable: dict[str, str] = {}           # array (static/NAME too) -> why
        if not safeio.inside(self.path, self.root):
            raise RecordError(f"{self.path.name} resolves outside {self.root}; not read")
        self._store = GuardedStore(self.path, self.root)
        try:
            self.group = zarr.open_group(store=self._store, mode="r")
            attrs = dict(self.group.attrs)
        except RecordError as e:
            raise RecordError(f"record.zarr can't be read ({e})") from None
        except Exception as e:                     # zarr's own metadata errors, whatever their type
            raise RecordError(f"record.zarr can't be read ({type(e).__name__}: {str(e)[:200]})") from None
        self.attrs = _clean_group_attrs(attrs, self.problems)
        marker = commit_marker(self.attrs, self.problems)
        self._cache: dict[str, RecordedArray] = {}
        self._z: dict[str, Any] = {}
        self._attrs: dict[str, dict] = {}
        for name in self._listed():
            z = self._open(name, marker)
            if z is not None:
                self._z[name] = z
        have = min((z.shape[0] for z in self._z.values()), default=marker)
        if marker > have:
            short = sorted(n for n, z in self._z.items() if z.shape[0] < marker)
            which = "the arrays hold" if len(short) == len(self._z) else f"{', '.join(short[:4])} hold"
            self.problems.append(f"record.zarr: the commit marker says {marker} steps but {which} only "
                                 f"{have}; reading {have}")
        self.marker = marker
        self.steps_written = min(marker, have, limit) if (limit := self.limit) is not None else min(marker, have)
        self._static: dict[str, Any] = {}
        for name in self._static_listed():
            z = self._open(f"static/{name}", None)
            if z is not None:
                self._static[name] = z
        plain = [n for n, z in [*self._z.items(), *self._static.items()] if not spec_of(z).crc]
        if plain:
            self.notes.append(f"record.zarr: not checksummed ({len(plain)} array(s) written without per-chunk "
                              "CRC-32C, by an older dyntool): `check` decodes their chunks but can't "
                              "detect a changed byte that still decodes")

    def _fail(self, name: str, why: str) -> None:
        self.unreadable[name] = why
        self.problems.append(why)

    def _open(self, name: str, marker: int | None):
        """Open one array (``static/NAME`` too) and check its declared geometry; None if unusable."""
        where = f"array {name}"
        if not (self.path / name / "zarr.json").exists():
            self._fail(name, f"{where}: its metadata (zarr.json) is missing; not readable")
            return None
        try:
            z = self.group[name]
            if not hasattr(z, "shape") or not hasattr(z.metadata, "chunk_grid"):
                raise TypeError("not an array")
            if marker is not None and len(z.shape) == 0:
                raise TypeError("no step axis")
            rows = (marker if marker is not None else (z.shape[0] if z.shape else 0))
            why = check_array(where, z, rows, self.path / name)
        except RecordError as e:
            why = f"{where}: its metadata can't be read ({e})"
        except Exception as e:                     # zarr's parse errors come in many types
            why = f"{where}: its metadata can't be read ({type(e).__name__}: {str(e)[:200]})"
        if why is not None:
            self._fail(name, why)
            return None
        self._attrs[name] = _clean_attrs(where, dict(z.attrs), self.problems)
        self._store.specs[name] = spec_of(z)
        return z

    def _listed(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir()
                      if p.is_dir() and p.name != "static" and not p.name.endswith(".partial"))

    def _static_listed(self) -> list[str]:
        d = self.path / "static"
        if not d.is_dir() or not safeio.inside(d, self.root):
            return []
        return sorted(p.name for p in d.iterdir() if p.is_dir())

    def names(self) -> list[str]:
        """Names of the readable arrays (one broken array never hides the rest)."""
        return sorted(self._z)

    def __getitem__(self, name: str) -> RecordedArray:
        if name not in self._cache:
            if name not in self._z:
                raise RecordError(f"array {name} is not readable in this recording")
            self._cache[name] = RecordedArray(name, self._z[name], self.steps_written, self._attrs.get(name))
        return self._cache[name]

    def arrays(self) -> dict[str, RecordedArray]:
        return {n: self[n] for n in self.names()}

    def static_names(self) -> list[str]:
        """Names of the readable ``static/`` arrays (unreadable ones are in ``problems``)."""
        return sorted(self._static)

    def static_array(self, name: str) -> Any:
        """The (checked) zarr array ``static/NAME``."""
        if name not in self._static:
            raise RecordError(f"static/{name} is not readable in this recording")
        return self._static[name]

    def static_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the ``static/`` arrays (metadata only)."""
        return {k: tuple(z.shape) for k, z in self._static.items()}

    def static(self, name: str) -> np.ndarray:
        """A per-run array without a step axis (``static/NAME``), read whole (refused when it would
        not fit in memory)."""
        z = self.static_array(name)
        need = math.prod(z.shape) * max(1, int(z.dtype.itemsize or 1))
        why = safeio.memory_problem(need)
        if why:
            raise RecordError(f"static/{name}: {why}")
        try:
            return z[...]
        except RecordError as e:
            raise RecordError(f"static/{name}: {e}") from None
        except (RuntimeError, ValueError, MemoryError) as e:
            raise RecordError(f"static/{name}: can't be decoded ({e})") from None

    def verify(self, full: bool = False) -> list[str]:
        """Every problem of this recording: the ones found on opening plus each committed chunk
        checked (``full``: decoded too, checksums checked), ``static/`` arrays included.  Reads no
        chunk when ``full`` is false."""
        out = list(self.problems)
        for name in self.names():
            out += self[name].verify(full, self.root)
        for name, z in self._static.items():
            if len(z.shape) == 0:
                if full:
                    try:
                        self.static(name)
                    except RecordError as e:
                        out.append(str(e))
                continue
            out += RecordedArray(f"static/{name}", z, z.shape[0], self._attrs.get(f"static/{name}")).verify(
                full, self.root)
        return out
