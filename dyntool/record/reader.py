"""Reading a recording: one marker-bounded, read-only reader over any zarr store.

:class:`RecordReader` reads one zarr group (``record.zarr``, or one rank's ``record.rankN.zarr``)
of a run through the run's storage backend (:mod:`dyntool.storage`, duck-typed here: the record
sits below the backends and never imports them).  What differs between a folder and an object
store is asked of the backend, never branched on here: the zarr store to open
(``backend.zarr_store``: on a disk the guarded store of :mod:`.guarded`, which refuses links out
of the run and bounds every read by the array's declared geometry, handed here as ``specs``), the
folders to list (``backend.list``), whether a key stays inside the run (``backend.contained``),
and, for :meth:`RecordReader.verify`, the files below an array (``backend.walk``) and whether a
chunk is a whole zstd frame (``backend.frame_problem``).

Whatever can't be read as written goes to ``problems`` (one broken array never hides the rest);
``notes`` holds what is worth knowing but not damage (a record written without checksums).
"""
from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import numpy as np
import zarr
import zarr.core.sync

from .. import safeio
from ..errors import RunError
from .guarded import RecordError, check_array, spec_of
from .store import RecordedArray, commit_marker

DRAIN_S = 2.0


def _drain_reads(timeout: float = DRAIN_S) -> None:
    """Let reads still in flight on zarr's event loop end before the interpreter does.  A read
    that fails (a missing or damaged chunk) leaves its sibling chunk reads running; at exit
    zarr's own hook closes the loop under them ("Task was destroyed but it is pending!") or they
    ask the closed thread pool for a worker ("cannot schedule new futures after shutdown"),
    after the one-line error.  Bounded: what is left after ``timeout`` is cancelled."""
    loop = zarr.core.sync.loop[0]
    if loop is None or loop.is_closed() or not loop.is_running():
        return

    async def settle():
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        for t in done:                  # their errors are the reported one's siblings: retrieved, unsaid
            if not t.cancelled():
                t.exception()
    try:
        asyncio.run_coroutine_threadsafe(settle(), loop).result(timeout + 1)
    except Exception:                   # noqa: BLE001 - exiting anyway; nothing to add to the error
        pass


# before the thread pools shut down (threading's exit hooks run before atexit's, and the reads
# need a pool thread); a private hook of threading, as concurrent.futures itself uses
threading._register_atexit(_drain_reads)

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


def _why(e: BaseException) -> str:
    """An error of zarr or of an object store as one short line (an object store's message goes on
    for lines of request details after its first)."""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:200]}"


class RecordReader:
    """The recording at ``sub`` of a storage ``backend``, read-only, never past the commit marker.

    ``limit``: read at most this many steps, so a live reader labelled with marker M holds exactly
    M rows even if the writer committed more since.  Whatever can't be read as written goes to
    ``problems`` (arrays stay readable where they can be); ``notes`` holds what is worth knowing but
    not damage; ``refresh()`` re-reads the marker of a live run.  :func:`.ranks.open_record` opens
    one per rank."""

    def __init__(self, backend, sub: str, limit: int | None = None):
        self.backend, self.sub, self.limit = backend, sub, limit
        self.path = backend.where / sub
        self.refresh()

    def refresh(self) -> None:
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.unreadable: dict[str, str] = {}           # array (static/NAME too) -> why
        if not self.backend.contained(self.sub):
            raise RecordError(f"{self.path.name} resolves outside {self.backend.root}; not read")
        self._specs: dict = {}                         # array -> its chunks, for a store that bounds reads
        try:
            store = self.backend.zarr_store(self.sub, "r", self._specs)
            self.group = zarr.open_group(store=store, mode="r")
            attrs = dict(self.group.attrs)
            fmt = getattr(self.group.metadata, "zarr_format", 3)
        except RecordError as e:
            raise RecordError(f"record.zarr can't be read ({e})") from None
        except RunError:                           # the object store itself (credentials, network)
            raise
        except Exception as e:                     # zarr's own metadata errors, whatever their type
            raise RecordError(f"record.zarr can't be read ({_why(e)})") from None
        if fmt != 3:            # zarr also opens v2 (.zgroup), whose metadata lacks what is checked here
            raise RecordError(f"record.zarr is in zarr format {fmt}; dyntool records (and reads) zarr "
                              "format 3 only (docs/FORMAT.md)")
        self.attrs = _clean_group_attrs(attrs, self.problems)
        marker = commit_marker(self.attrs, self.problems)
        self._cache: dict[str, RecordedArray] = {}
        self._z: dict[str, Any] = {}
        self._attrs: dict[str, dict] = {}
        for name in self._listed(self.sub, "static"):  # listed, not group.array_keys(): one bad member breaks that
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
        for name in self._listed(f"{self.sub}/static"):
            z = self._open(f"static/{name}", None)
            if z is not None:
                self._static[name] = z
        plain = [n for n, z in [*self._z.items(), *self._static.items()] if not spec_of(z).crc]
        if plain:
            self.notes.append(f"record.zarr: not checksummed ({len(plain)} array(s) written without per-chunk "
                              "CRC-32C, by an older dyntool): `check` decodes their chunks but can't "
                              "detect a changed byte that still decodes")

    def _listed(self, key: str, *skip: str) -> list[str]:
        """The array folders directly below ``key`` (none when it is missing, not a folder, or
        resolves outside the run); half-written ``*.partial`` folders and ``skip`` left out."""
        if not self.backend.contained(key):
            return []
        try:
            dirs = self.backend.list(key)[0]
        except (NotADirectoryError, FileNotFoundError):
            return []
        return sorted(d for d in dirs if d not in skip and not d.endswith(".partial"))

    def _fail(self, name: str, why: str) -> None:
        self.unreadable[name] = why
        self.problems.append(why)

    def _open(self, name: str, marker: int | None):
        """Open one array (``static/NAME`` too) and check its declared geometry; None if unusable."""
        where = f"array {name}"
        key = f"{self.sub}/{name}"
        try:
            z = self.group[name]
            if not hasattr(z, "shape") or not hasattr(z.metadata, "chunk_grid"):
                raise TypeError("not an array")
            if getattr(z.metadata, "zarr_format", 3) != 3:
                raise TypeError(f"zarr format {z.metadata.zarr_format}, not 3")
            if marker is not None and len(z.shape) == 0:
                raise TypeError("no step axis")
            rows = (marker if marker is not None else (z.shape[0] if z.shape else 0))
            why = check_array(where, z, rows, lambda: self.backend.walk(key, guarded=False)[0])
        except KeyError:                           # zarr found no zarr.json for it
            why = f"{where}: its metadata (zarr.json) is missing; not readable"
        except RecordError as e:
            why = f"{where}: its metadata can't be read ({e})"
        except RunError:
            raise
        except Exception as e:                     # zarr's parse errors come in many types
            why = f"{where}: its metadata can't be read ({_why(e)})"
        if why is not None:
            self._fail(name, why)
            return None
        self._attrs[name] = _clean_attrs(where, dict(z.attrs), self.problems)
        self._specs[name] = spec_of(z)
        return z

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
            out += self[name].verify(full, self.backend, f"{self.sub}/{name}")
        for name, z in self._static.items():
            if len(z.shape) == 0:
                if full:
                    try:
                        self.static(name)
                    except RecordError as e:
                        out.append(str(e))
                continue
            arr = RecordedArray(f"static/{name}", z, z.shape[0], self._attrs.get(f"static/{name}"))
            out += arr.verify(full, self.backend, f"{self.sub}/static/{name}")
        return out
