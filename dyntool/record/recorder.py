"""Glue between a captured step and the store: schedule, windows, pooling, dtype.

The training loop never sees this module: trainers call a callback, and the callback calls
``Recorder.wants(step)`` / ``Recorder.capture(...)`` / ``Recorder.record(step, quantities)``.
Simulations that compute the quantities in closed form call ``record`` directly with the same
names and (layer, head, seq, ...) layout.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable

import numpy as np
import torch

from ..capture import Capture
from . import names
from .policy import RecordConfig, schedule, windows
from .store import StoreWriter


def pool_blocks(x, block: int, visible=None):
    """THE block pooling of dyntool: mean over ``block × block`` tiles of the last two axes, over
    the *visible* entries only (``visible`` broadcastable to x, 1/True = unmasked; default all).
    Masked entries never enter a mean, whatever they hold (0, NaN, −inf); edge tiles average what
    they hold; a fully masked tile is NaN.  Accepts torch tensors or numpy arrays (returns the same
    kind), so the recorder, the sims (chunk by chunk: chunks of whole block rows give the same
    result), the app and the test fixtures all pool alike."""
    if isinstance(x, np.ndarray):
        vis = None if visible is None else torch.as_tensor(np.asarray(visible))
        return pool_blocks(torch.as_tensor(x), block, vis).numpy()
    T, Tk = x.shape[-2:]
    nq, nk = math.ceil(T / block), math.ceil(Tk / block)
    pad = (0, nk * block - Tk, 0, nq * block - T)
    vis = torch.ones(T, Tk, dtype=x.dtype, device=x.device) if visible is None else visible.to(x.dtype)
    vis = vis.expand_as(x) if vis.dim() == x.dim() else vis
    xs = torch.nn.functional.pad(torch.where(vis > 0, torch.nan_to_num(x), 0.0), pad)
    vs = torch.nn.functional.pad(vis, pad)
    tiles = xs.reshape(*xs.shape[:-2], nq, block, nk, block).sum(dim=(-3, -1))
    counts = vs.reshape(*vs.shape[:-2], nq, block, nk, block).sum(dim=(-3, -1))
    return tiles / counts


class Recorder:
    def __init__(self, store: StoreWriter, cfg: RecordConfig, max_steps: int, T: int):
        self.store, self.cfg = store, cfg
        self.steps = schedule(cfg, max_steps)
        self._wanted = set(int(s) for s in self.steps)
        (self.q0, self.q1), (self.k0, self.k1) = windows(cfg, T)
        self.T = T
        self.n_recorded = 0
        self.dtype = np.float16 if cfg.dtype == "float16" else np.float32
        for m in names.MATRICES:
            store.declare(m, attrs={"query_offset": self.q0, "key_offset": self.k0, "T": T})
        for m, pooled in names.POOLED.items():
            store.declare(pooled, attrs={"block": cfg.pool, "T": T})

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
            self.record(step, cap.compute(), extra)
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was_training)

    def record(self, step: int, quantities: dict, extra: dict | None = None, grad_scale: float = 1.0,
               reduced: bool = False) -> None:
        """Store one step.  ``quantities``: name -> (L, H, S, ...) tensors/arrays over full T.

        With ``reduced=True`` the producer has already cut the matrices to the window and put
        the pooled overviews under their ``*_pooled`` names (closed-form simulations do this
        chunk by chunk, never holding a T×T matrix).
        """
        out: dict[str, np.ndarray] = {}
        q = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)))
             for k, v in quantities.items()}
        visible = None
        if not reduced and self.cfg.pool > 0 and "scores" in q:
            visible = torch.isfinite(q["scores"]).float()       # masked scores are NaN
        for name in self.cfg.arrays:
            if name not in q:
                continue
            x = q[name].detach()
            if name in names.MATRICES:
                if self.cfg.pool > 0 and name in names.POOLED:
                    pooled = q.get(names.POOLED[name]) if reduced else \
                        pool_blocks(x.float(), self.cfg.pool, visible)
                    if pooled is not None:
                        out[names.POOLED[name]] = self._to_np(pooled, name)
                if not reduced:
                    x = x[..., self.q0:self.q1, self.k0:self.k1]
            out[name] = self._to_np(x, name)
        out["grad_scale"] = np.asarray(grad_scale, dtype=np.float32)
        for k, v in (extra or {}).items():
            out[k] = np.asarray(v, dtype=np.float32)
        self.store.append(int(step), out)
        self.n_recorded += 1

    def _to_np(self, x: torch.Tensor, name: str) -> np.ndarray:
        dt = np.float32 if name in names.FLOAT32_ALWAYS else self.dtype
        with np.errstate(over="ignore"):      # values past float16's range become inf, visibly
            return x.cpu().numpy().astype(dt, copy=False)

    def close(self) -> None:
        self.store.close()


@contextmanager
def maybe_capture(recorder: Recorder | None, model, step: int, grad_scale: float = 1.0):
    """Yield a Capture when ``recorder`` wants this step (training-batch recording), else None."""
    if recorder is None or not recorder.wants(step):
        yield None
        return
    with recorder.capture(model, grad_scale) as cap:
        yield cap
