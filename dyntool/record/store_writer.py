"""Writing a recording: a buffered background writer of zarr v3 arrays (the reader is :mod:`.store`).

Layout: one zarr v3 group ``record.zarr`` per run.  Every array has a leading ``step`` axis and
``dimension_names``; the array ``step`` holds the training step of each recorded index.

Concurrency contract: zarr's ``append``/``resize`` updates an array's shape
*before* its data lands, so a reader trusting ``shape[0]`` can see fill values.  The writer
therefore writes data for all arrays first and only then bumps the group attribute
``steps_written``; readers never read past it.  Floats use NaN as the fill value so a bug shows.
Writes happen on one background thread in whole chunks along ``step``; a ``kill -9`` leaves
everything up to the last bumped marker readable (zarr ≥ 3.1.3 writes chunks atomically).
Buffered steps are handed over when a chunk is full or, by a timer thread, at most
``flush_seconds`` after they were appended, so the last recorded step of a run that then goes
quiet (or is killed) is on disk after ``flush_seconds``.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec, ZstdCodec

from ..errors import StorageError
from . import names

FORMAT = "dyntool-record"
FORMAT_VERSION = 1
TARGET_CHUNK_BYTES = 4 << 20
# every chunk: zstd, then a CRC-32C of the compressed bytes (``dyntool check`` verifies it)
COMPRESSORS = (ZstdCodec(level=0, checksum=False), Crc32cCodec())


def chunk_shape(per_step: tuple[int, ...], itemsize: int, chunk_steps: int,
                target: int = TARGET_CHUNK_BYTES) -> tuple[int, ...]:
    """Chunks of ~``target`` bytes: split the leading (layer, head, seq) axes to 1 while a
    single step is too big, so reading one head's T×T slice touches one small chunk; then put
    up to ``chunk_steps`` steps in a chunk."""
    inner = list(per_step)
    n_lead = max(0, len(inner) - 2)
    for ax in range(n_lead):
        if math.prod(inner) * itemsize <= target:
            break
        inner[ax] = 1
    per = max(1, math.prod(inner) * itemsize)
    steps = int(max(1, min(chunk_steps, target // per)))
    return (steps, *inner)


def _new_array(group, name: str, **kw) -> Any:
    """``group.create_array``, undone when it fails: a full disk between the array's folder and
    its ``zarr.json`` left a folder without metadata, and readers then called the whole record
    corrupt; without it the record reads as it was before the failure (up to its last commit)."""
    try:
        return group.create_array(name, **kw)
    except BaseException:
        try:
            del group[name]                # its folder (or prefix), however far it got
        except Exception:                  # noqa: BLE001 - the creation's own error is the one to report
            pass
        raise


class StoreWriter:
    def __init__(self, path: str | Path, chunk_steps: int = 16, flush_seconds: float = 30.0,
                 attrs: dict[str, Any] | None = None):
        self.chunk_steps, self.flush_seconds = int(chunk_steps), float(flush_seconds)
        if isinstance(path, (str, Path)):
            self.path = Path(path)
            self.group = zarr.open_group(str(self.path), mode="w-")
        else:                                  # a zarr Store, e.g. object storage (remote.py)
            self.path = None
            self.group = zarr.open_group(store=path, mode="w-")
        self.group.attrs.update({"format": FORMAT, "format_version": FORMAT_VERSION,
                                 "steps_written": 0, **(attrs or {})})
        self._arrays: dict[str, Any] = {}
        self._specs: dict[str, tuple] | None = None      # name -> (per-step shape, dtype)
        self._array_attrs: dict[str, dict] = {}
        self._dims: dict[str, tuple[str, ...]] = {}
        self._buffer: list[dict[str, np.ndarray]] = []
        self._ready: list = []             # the buffered steps' events (device copies in flight)
        self._n_submitted = 0
        self._last_step: int | None = None
        self._last_flush = self._first_buffered = time.monotonic()
        self._queue: queue.Queue = queue.Queue(maxsize=4)   # bounded: backpressure on slow disks
        self._error: BaseException | None = None
        self._lock = threading.Lock()                      # buffer: appends vs the flush timer
        self._rows_slot = threading.Semaphore(1)           # one held step of streamed rows queued
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._worker, name="dyntool-writer", daemon=True)
        self._thread.start()
        self._timer = None
        if self.flush_seconds > 0 and math.isfinite(self.flush_seconds):
            self._timer = threading.Thread(target=self._flush_timer, name="dyntool-flush", daemon=True)
            self._timer.start()

    # -- public API ---------------------------------------------------------------------
    def declare(self, name: str, dims: tuple[str, ...] | None = None, attrs: dict | None = None):
        """Optionally set dimension names / attributes of an array before its first append."""
        if dims is not None:
            self._dims[name] = tuple(dims)
        if attrs:
            self._array_attrs.setdefault(name, {}).update(attrs)

    def append(self, step: int, arrays: dict[str, np.ndarray], ready=None) -> None:
        """Buffer one step's arrays.  ``ready``: an event (anything with ``synchronize()``, e.g. a
        ``torch.cuda.Event``) after which the arrays' contents are there (pinned buffers a GPU copies
        into without the caller waiting); the writer thread waits on it before it reads them."""
        self._raise_if_failed()
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"recorded steps must increase: {step} after {self._last_step}")
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        spec = {k: (v.shape, v.dtype) for k, v in arrays.items()}
        if self._specs is None:
            self._specs = spec
        elif spec != self._specs:
            diff = sorted(set(spec.items()) ^ set(self._specs.items()))
            raise ValueError(f"step {step}: recorded arrays differ from the first step's: {diff[:3]}")
        with self._lock:
            if not self._buffer:
                self._first_buffered = time.monotonic()
            self._buffer.append({names.STEP: np.asarray(step, dtype=np.int64), **arrays})
            if ready is not None:
                self._ready.append(ready)
            self._last_step = step
            if len(self._buffer) >= self.chunk_steps or \
                    time.monotonic() - self._last_flush > self.flush_seconds:
                self._submit()

    def flush(self) -> None:
        """Hand buffered steps to the writer thread and wait until they are committed."""
        with self._lock:
            self._submit()
        self._queue.join()
        self._raise_if_failed()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._closed.set()
            if self._timer is not None:
                self._timer.join(timeout=60)
            self._queue.put(None)
            self._thread.join(timeout=60)

    @property
    def steps_committed(self) -> int:
        """Steps handed to the writer thread (all committed once :meth:`close` returned cleanly)."""
        return self._n_submitted

    def write_static(self, name: str, data: np.ndarray, dims: tuple[str, ...]) -> None:
        """A per-run array with no step axis (e.g. targets, Bayes entropy per position),
        stored under ``static/``.  Written synchronously: call it before training starts."""
        data = np.asarray(data)
        if len(dims) != data.ndim:
            raise ValueError(f"static/{name}: {len(dims)} dimension names for {data.ndim} axes")
        grp = self.group.require_group("static")
        arr = _new_array(grp, name, shape=data.shape, dtype=data.dtype, dimension_names=list(dims),
                         compressors=COMPRESSORS, config={"write_empty_chunks": True})
        arr[...] = data

    def write_rows(self, name: str, index: int, where: tuple, data: np.ndarray, per_step: tuple[int, ...],
                   chunks: tuple[int, ...], _on_writer: bool = False) -> None:
        """Write ``data`` into row ``index`` (at ``where`` inside it) of a *streamed* array, now,
        on the caller's thread: the full tier's matrices, query-row block by block, so no step
        of them is ever held whole.  Call it for row ``steps_buffered`` before that step's
        :meth:`append`: the commit marker then covers it like any other array (a row written
        for a step that never got appended is past the marker, and is overwritten by the next)."""
        if not _on_writer:
            self._raise_if_failed()
        arr = self._arrays.get(name)
        if arr is None:
            data = np.asarray(data)
            arr = self._arrays[name] = _new_array(
                self.group, name, shape=(0, *per_step), dtype=data.dtype, chunks=(1, *chunks), fill_value=np.nan,
                dimension_names=list(self._dims.get(name) or names.dims(name)), compressors=COMPRESSORS,
                attributes=self._array_attrs.get(name, {}), config={"write_empty_chunks": True})
        if arr.shape[0] <= index:
            arr.resize((index + 1, *arr.shape[1:]))
        arr[(index, *where)] = data

    def write_rows_later(self, index: int, items: list[tuple], ready=None) -> None:
        """:meth:`write_rows` of one step's matrices, ``items`` = [(name, where, data, per_step,
        chunks), ...], done by the writer thread (zarr's encoding off the training thread), after
        ``ready`` (see :meth:`append`).  At most one such step waits in the queue: the call blocks
        while the previous one is still being written, so the host holds at most two steps (the one
        queued, the one being built)."""
        self._raise_if_failed()
        self._rows_slot.acquire()
        self._queue.put(("rows", index, items, ready))

    @property
    def steps_buffered(self) -> int:
        return self._n_submitted + len(self._buffer)

    # -- internals ----------------------------------------------------------------------
    def _raise_if_failed(self):
        e = self._error
        if e is None:
            return
        if isinstance(e, StorageError):    # the storage's one line (an object store that stayed down)
            raise StorageError(f"recording writer failed: {e}; what was committed before is kept") from e
        raise RuntimeError(f"recording writer failed: {e}") from e

    def _flush_timer(self) -> None:
        """Submit rows that have waited ``flush_seconds`` even when no further append comes."""
        tick = min(max(self.flush_seconds / 4, 0.01), 1.0)
        while not self._closed.wait(tick):
            if self._buffer and time.monotonic() - self._first_buffered >= self.flush_seconds:
                with self._lock:
                    if self._buffer and self._error is None:
                        self._submit()

    def _submit(self) -> None:
        """Queue the buffered rows (call with ``self._lock`` held)."""
        self._last_flush = time.monotonic()
        if not self._buffer:
            return
        n0, rows, ready = self._n_submitted, self._buffer, self._ready
        # clear the buffer only once the job is queued: a KeyboardInterrupt arriving while
        # put() blocks must not drop rows (re-submitting the same rows at n0 is idempotent).
        # The rows are stacked by the writer thread, after their copies arrived (``ready``)
        self._queue.put((n0, rows, ready))
        self._buffer, self._ready = [], []
        self._n_submitted += len(rows)

    def _worker(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._error is None and job[0] == "rows":
                    if job[3] is not None:
                        job[3].synchronize()              # the device's copies into the buffers
                    for item in job[2]:
                        self.write_rows(item[0], job[1], *item[1:], _on_writer=True)
                elif self._error is None:
                    n0, rows, ready = job
                    for event in ready:
                        event.synchronize()
                    self._write(n0, {k: np.stack([r[k] for r in rows]) for k in rows[0]})
            except BaseException as e:    # surfaced on the next append/flush
                self._error = e
            finally:
                if job is not None and job[0] == "rows":
                    self._rows_slot.release()
                self._queue.task_done()

    def _create(self, name: str, data: np.ndarray) -> Any:
        per_step, dtype = data.shape[1:], data.dtype
        dims = self._dims.get(name) or names.dims(name)
        if len(dims) != data.ndim:
            dims = (names.STEP,) + tuple(f"dim_{i}" for i in range(1, data.ndim))
        fill = np.nan if np.issubdtype(dtype, np.floating) else 0
        arr = _new_array(
            self.group, name, shape=(0, *per_step), dtype=dtype,
            chunks=chunk_shape(per_step, dtype.itemsize, self.chunk_steps),
            fill_value=fill, dimension_names=list(dims), compressors=COMPRESSORS,
            attributes=self._array_attrs.get(name, {}),
            config={"write_empty_chunks": True})   # every committed chunk exists: a missing one was deleted
        return arr

    def _write(self, n0: int, stacked: dict[str, np.ndarray]) -> None:
        n1 = n0 + len(stacked[names.STEP])
        for name, data in stacked.items():
            arr = self._arrays.get(name)
            if arr is None:
                arr = self._arrays[name] = self._create(name, data)
            if arr.shape[0] < n1:
                arr.resize((n1, *arr.shape[1:]))
            arr[n0:n1] = data
        # the commit marker goes last: readers never look past it
        self.group.attrs.update({"steps_written": n1, "updated": time.time()})
