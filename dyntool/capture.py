"""The recording seam: capture U = ∂L/∂(per-head output) during one forward/backward.

Usage::

    with Capture(model, grad_scale=1 / accum_steps) as cap:
        loss = loss_fn(model(x))
        loss.backward()
    quantities = cap.compute()          # name -> tensor (L, nh, S, ...), see dyntool.quantities

Design (anchors.md §2.3–2.4, §5):
- a *tensor* hook on the exact tensor the forward consumes (the per-head output ``y`` of
  ``AttentionCore.attend``), never module backward hooks; hooks are removed in ``__exit__``
  whatever happens, so a failed step never leaves hooks behind;
- q, k, v are stashed detached; everything else is recomputed after backward from (q, k, v, U)
  and the module's mask, so the fused SDPA path records the same numbers as the manual path;
- a hook that never fired (backward outside the ``with``, a compiled module, a layer skipped)
  raises :class:`CaptureError` instead of silently recording nothing;
- ``grad_scale`` is the factor the loss was multiplied by before ``backward`` (``1/accum`` for
  gradient accumulation, times the AMP loss scale); U is divided by it so it is unbiased.
"""
from __future__ import annotations

import torch

from .attention import AttentionCore, attention_cores
from .quantities import head_quantities


class CaptureError(RuntimeError):
    pass


class _Slot:
    __slots__ = ("q", "k", "v", "u", "ds", "allowed", "scale", "layer")

    def __init__(self):
        self.q = self.k = self.v = self.u = self.ds = self.allowed = None


class Capture:
    def __init__(self, model: torch.nn.Module, seqs: int | None = None, grad_scale: float = 1.0,
                 residual: bool = True):
        self.cores = attention_cores(model)
        if not self.cores:
            raise CaptureError("model has no dyntool attention modules to record")
        self.seqs, self.grad_scale, self.residual = seqs, float(grad_scale), residual
        self.slots: dict[int, _Slot] = {}
        self._handles: list = []

    # -- context management -------------------------------------------------------------
    def __enter__(self) -> "Capture":
        for core in self.cores:
            core._capture = self
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for core in self.cores:
            core._capture = None

    # -- called from AttentionCore.attend during the forward ------------------------------
    def stash(self, core: AttentionCore, q, k, v, y, scores, scale: float) -> None:
        key = id(core)
        if key in self.slots:
            raise CaptureError("an attention module ran twice inside one Capture; capture one micro-step")
        sl = slice(None) if self.seqs is None else slice(0, self.seqs)
        slot = _Slot()
        slot.q, slot.k, slot.v = q[sl].detach(), k[sl].detach(), v[sl].detach()
        slot.scale = scale
        slot.allowed = core.allowed(q.shape[-2], q.device)
        self.slots[key] = slot
        if not y.requires_grad:
            raise CaptureError("attention output does not require grad: record inside a training step")

        def on_u(grad, slot=slot, sl=sl):
            slot.u = grad[sl].detach()          # keep on device; moved to host after backward
        self._handles.append(y.register_hook(on_u))
        if scores is not None and self.residual and scores.requires_grad:
            def on_ds(grad, slot=slot, sl=sl):
                slot.ds = grad[sl].detach()
            self._handles.append(scores.register_hook(on_ds))

    # -- after backward -----------------------------------------------------------------
    def compute(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Quantities stacked over layers: matrices (L, nh, S, T, T), vectors (L, nh, S, T[, d]),
        per-head scalars (L, nh).  ``dtype`` defaults to float32 (float64 inputs stay float64)."""
        per_layer = []
        for core in self.cores:
            slot = self.slots.get(id(core))
            if slot is None:
                raise CaptureError(f"layer {core.layer_index}: attention did not run inside the Capture")
            if slot.u is None:
                raise CaptureError(f"layer {core.layer_index}: gradient hook never fired; call "
                                   "backward() inside the Capture and run recording steps uncompiled")
            per_layer.append(self._layer(slot, dtype))
        out = {name: torch.stack([d[name] for d in per_layer]) for name in per_layer[0]}
        return out

    def _layer(self, slot: _Slot, dtype) -> dict[str, torch.Tensor]:
        dt = dtype or (torch.float64 if slot.q.dtype == torch.float64 else torch.float32)
        # (S, nh, T, d) → (nh, S, T, d): heads first so logit stats reduce over (S, T, T)
        q, k, v = (t.to(dt).transpose(0, 1) for t in (slot.q, slot.k, slot.v))
        u = slot.u.to(dt).transpose(0, 1) / self.grad_scale
        allowed = slot.allowed.unsqueeze(1)                                # (nh|1, 1, T, T)
        with torch.no_grad():
            qs = head_quantities(q, k, v, u, allowed, slot.scale)
            if slot.ds is not None:
                ds_auto = slot.ds.to(dt).transpose(0, 1) / self.grad_scale
                diff = (ds_auto - qs["score_grad"]).masked_fill(~allowed, 0.0)
                # relative, so it does not shrink with U: ‖autograd − closed form‖ / ‖autograd‖
                qs["routing_residual"] = (diff.flatten(1).norm(dim=1)
                                          / ds_auto.masked_fill(~allowed, 0.0).flatten(1).norm(dim=1).clamp_min(1e-300))
        return qs
