"""Glue between a captured step and the store: schedule, crops, pooling, dtype.

The training loop never sees this module: trainers call a callback, and the callback calls
``Recorder.wants(step)`` / ``Recorder.capture(...)`` / ``Recorder.record(step, quantities)``.
Simulations that compute the quantities in closed form call ``write`` with the same names and
(layer, head, seq, ...) layout, already cut to the crop and pooled (chunk by chunk).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .capture import Capture
from .cheap_stats import block_budget_mib
from .errors import ConfigError
from .record import names
from .record.policy import RecordConfig, crops, schedule, storage_dtype
from .record.pooling import pool_blocks
from .record.selection import Selection, resolve
from .record.store_writer import TARGET_CHUNK_BYTES, StoreWriter
from .stream import LIVE, rows_per_block, size, stream

HOST_BUFFER_MIB = 256     # a streamed step's matrices up to this size are written in one zarr call each


def _to_host_later(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, np.ndarray], object | None]:
    """Device tensors as host arrays and the event after which their contents are there: on a GPU
    pinned buffers, every copy queued without waiting and one event recorded after them (the
    writer thread waits on it before it encodes: the training thread never does); on the CPU,
    views and no event.  Each array keeps its pinned buffer alive (``Tensor.numpy`` holds it)."""
    first = next(iter(tensors.values()), None)
    if first is None or first.device.type != "cuda":
        return {k: t.numpy() for k, t in tensors.items()}, None
    host = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for k, t in tensors.items()}
    for k, t in tensors.items():
        host[k].copy_(t, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(first.device))
    return {k: h.numpy() for k, h in host.items()}, ready


def plan(cfg: RecordConfig, cap: Capture, n_keys: int) -> tuple[Selection, tuple[int, int] | None]:
    """``(selection, stream)`` for a capture: the heads ``record.heads`` picks, and ``(rows per
    block, rows per chunk)`` when the full tier is streamed, None when it is computed dense (as
    always before streaming existed).  It streams when the selection is not every head, or when
    ``compute()`` (every head's matrices at once) would not fit ``record.max_block_mib``.
    ``n_keys``: the stored key crop's length.  A selection outside the model or a budget too
    small for one row block is a ConfigError (callers ask before creating anything)."""
    slot = next(iter(cap.slots.values()), None)
    if slot is None:
        raise ConfigError("record.heads", "the capture saw no attention")
    L, (S, nh), N = len(cap.sites), slot.q.shape[:2], size(cap)
    sel = resolve(cfg.heads, L, nh)
    item = 8 if slot.q.dtype == torch.float64 else 4
    budget = block_budget_mib(cfg.max_block_mib, slot.q.device)
    dense = (5 * L + LIVE) * nh * S * N * N * item          # stacked matrices + one layer's work
    if sel.everything and dense <= budget * 2**20:
        return sel, None
    rows = rows_per_block(S, N, item, budget, cfg.pool or 1)
    if rows < 1:
        raise ConfigError("record.max_block_mib", f"{budget:g} MiB is too small for one query-row "
                          f"block of the full tier ({S}×{max(cfg.pool, 1)}×{N} scores)")
    chunk = max(1, min(rows, TARGET_CHUNK_BYTES // (n_keys * 4)))   # ~4 MB chunks along query rows
    # blocks of whole chunks fill them without a read-modify-write (pooled blocks start at 0 instead)
    return sel, (rows if cfg.pool else rows // chunk * chunk, chunk)


class Recorder:
    def __init__(self, store: StoreWriter, cfg: RecordConfig, max_steps: int, T: int):
        self.store, self.cfg = store, cfg
        self.steps = schedule(cfg, max_steps)
        self._wanted = set(int(s) for s in self.steps)
        (self.q0, self.q1), (self.k0, self.k1) = crops(cfg, T)
        self.T = T
        self.n_recorded = 0
        self.dtype = np.float16 if cfg.dtype == "float16" else np.float32
        for m in names.MATRICES:
            store.declare(m, attrs={"query_offset": self.q0, "key_offset": self.k0, "T": T})
        for m, pooled in names.POOLED.items():
            store.declare(pooled, attrs={"block": cfg.pool, "T": T})
        self.sel: Selection | None = None       # set by the first capture: its layers × heads
        self._stream: tuple[int, int] | None = None    # (rows per block, rows per chunk) when streamed

    def wants(self, step: int) -> bool:
        return step in self._wanted

    def capture(self, model: torch.nn.Module, grad_scale: float = 1.0) -> Capture:
        """A Capture for a training-batch step (use around one micro-step's forward+backward)."""
        return Capture(model, seqs=self.cfg.seqs, grad_scale=grad_scale)

    def record_probe(self, model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor],
                     step: int, extra: dict | None = None) -> None:
        """One extra forward/backward on the probe batch, no optimizer step, grads cleared.

        Call it *before* the step's own forward so the recorded parameters are the ones the
        step's loss is evaluated at.
        """
        was_training = model.training
        try:
            with self.capture(model) as cap:
                loss_fn(model).backward()
            self.record_capture(step, cap, extra)
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was_training)

    def plan(self, cap: Capture) -> Selection:
        """At the first capture: which heads are recorded and whether the full tier is streamed
        (:func:`plan`)."""
        if self.sel is None:
            self.sel, self._stream = plan(self.cfg, cap, self.k1 - self.k0)
        return self.sel

    def selection_attrs(self, cap: Capture, attrs: dict | None = None) -> dict:
        """Record attributes for a selection (``layers``, ``heads``; ``sites`` cut to the
        selected layers); ``attrs`` (e.g. ``cap.attrs``) are returned with them."""
        sel, out = self.plan(cap), dict(attrs or {})
        if not sel.everything:
            out.update(sel.attrs())
            if isinstance(out.get("sites"), list):
                out["sites"] = [out["sites"][l] for l in sel.layers]
        return out

    def record_capture(self, step: int, cap: Capture, extra: dict | None = None,
                       grad_scale: float = 1.0) -> dict:
        """Store one captured step, dense or streamed (:meth:`plan`).  Returns the quantities
        other than the T×T matrices (dense: all of them), laid out (layer, head, ...) as stored."""
        first = self.sel is None
        sel = self.plan(cap)
        if self._stream is None:
            qs = cap.compute()
            self.record(step, qs, extra, grad_scale)
            return qs
        if first and not sel.everything:       # before the first append: the writer thread is idle
            self.store.group.attrs.update(self.selection_attrs(cap))
        rows, chunk = self._stream
        n, S = self.store.steps_buffered, next(iter(cap.slots.values())).q.shape[0]
        nq, nk = self.q1 - self.q0, self.k1 - self.k0
        shape = (len(sel.layers), sel.slots, S, nq, nk)

        mats = [m for m in names.MATRICES if m in self.cfg.arrays]
        # a step whose matrices fit HOST_BUFFER_MIB is gathered where it is computed (a GPU), cast
        # to the storage dtype there, copied to the host once and encoded by the writer thread,
        # one zarr call per matrix; a larger one is written block by block as it is computed.
        # Why: block by block, a recorded step of the gpu preset (320 writes, each a device sync
        # and an encode on the training thread) cost 1.4 s on an H100 against 17 ms for a plain one
        held = sum(self._np_dtype(m)().itemsize for m in mats) * math.prod(shape) <= HOST_BUFFER_MIB * 2**20
        device = next(iter(cap.slots.values())).q.device
        buf = {m: torch.full(shape, float("nan"), dtype=self._torch_dtype(m), device=device)
               for m in mats} if held else None

        def emit(li, si, r0, r1, blocks):
            where = (li, si, slice(None), slice(r0 - self.q0, r1 - self.q0))
            for m, x in blocks.items():
                if buf is not None:
                    buf[m][where] = x[..., self.k0:self.k1]             # cast on the device
                else:
                    self.store.write_rows(m, n, where, self._to_np(x[..., self.k0:self.k1], m), shape,
                                          (1, 1, 1, chunk, nk))
        small = stream(cap, sel, emit, rows=rows, crop=(self.q0, self.q1), matrices=mats, pool=self.cfg.pool,
                       max_block_mib=block_budget_mib(self.cfg.max_block_mib, device))   # a layer's heads together
        if buf is not None:
            host, ready = _to_host_later(buf)                          # one copy, no wait here
            self.store.write_rows_later(n, [(m, (slice(None),) * 4, host[m], shape, (1, 1, 1, chunk, nk))
                                            for m in mats], ready=ready)
        self.write(step, small, extra, grad_scale)
        return small

    def head_values(self, table) -> list[tuple[int, int, float]]:
        """``(model layer, model head, value)`` for a stored (layer, head) table, empty slots left out."""
        sel = self.sel
        out = []
        for li, row in enumerate(table):
            for si, v in enumerate(row):
                if sel is None:
                    out.append((li, si, v))
                elif si < len(sel.heads[li]):
                    out.append((sel.layers[li], sel.heads[li][si], v))
        return out

    def record(self, step: int, quantities: dict, extra: dict | None = None, grad_scale: float = 1.0) -> None:
        """Store one step from full-T quantities: name -> (L, H, S, ...) tensors/arrays over all T
        positions (what :meth:`Capture.compute` returns).  = :meth:`write` of :meth:`reduce`."""
        self.write(step, self.reduce(quantities), extra, grad_scale)

    def reduce(self, quantities: dict) -> dict[str, torch.Tensor]:
        """Full T×T matrices -> their query/key crop plus, with ``pool > 0``, the block-pooled
        overview under the ``*_pooled`` name (mean over visible entries; masked scores are NaN)."""
        q = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)))
             for k, v in quantities.items()}
        visible = torch.isfinite(q["scores"]).float() if self.cfg.pool > 0 and "scores" in q else None
        out = {}
        for name, x in q.items():
            x = x.detach()
            if name in names.MATRICES:
                if self.cfg.pool > 0 and name in names.POOLED and name in self.cfg.arrays:
                    out[names.POOLED[name]] = pool_blocks(x.float(), self.cfg.pool, visible)
                x = x[..., self.q0:self.q1, self.k0:self.k1]
            out[name] = x
        return out

    def write(self, step: int, arrays: dict, extra: dict | None = None, grad_scale: float = 1.0) -> None:
        """Store arrays already in their recorded shape (crop-cut matrices, ``*_pooled``
        overviews): what :meth:`reduce` returns, or what a closed-form simulation produces chunk
        by chunk without ever holding a T×T matrix.  Keeps the names in ``cfg.arrays`` (and their
        pooled overviews) in the storage dtype; ``extra`` scalars (e.g. diagnostics) in float32."""
        out: dict[str, np.ndarray] = {}
        on_gpu: dict[str, torch.Tensor] = {}      # cast there, copied to the host in one go below
        for name in self.cfg.arrays:
            pooled = names.POOLED.get(name)
            for key, present in ((pooled, self.cfg.pool > 0 and pooled in arrays), (name, name in arrays)):
                if not present:
                    continue
                x = arrays[key]
                if isinstance(x, torch.Tensor) and x.device.type == "cuda":
                    on_gpu[key] = x.detach().to(self._torch_dtype(name))
                else:
                    out[key] = self._to_np(x, name)
        host, ready = _to_host_later(on_gpu) if on_gpu else ({}, None)
        out.update(host)
        out["grad_scale"] = np.asarray(grad_scale, dtype=np.float32)
        with np.errstate(over="ignore"):      # a diverging run's diagnostics become inf, visibly
            for k, v in (extra or {}).items():
                out[k] = np.asarray(v, dtype=np.float32)
        self.store.append(int(step), out, ready=ready)
        self.n_recorded += 1

    def _torch_dtype(self, name: str) -> torch.dtype:
        return torch.float16 if storage_dtype(self.cfg, name) == "float16" else torch.float32

    def _np_dtype(self, name: str):
        return np.float16 if storage_dtype(self.cfg, name) == "float16" else np.float32

    def _to_np(self, x: torch.Tensor, name: str) -> np.ndarray:
        with np.errstate(over="ignore"):      # values past float16's range become inf, visibly
            return x.cpu().numpy().astype(self._np_dtype(name), copy=False)

    def close(self) -> None:
        self.store.close()
