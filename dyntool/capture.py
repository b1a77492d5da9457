"""Capture U = ∂L/∂(per-head output) during one forward/backward, for any supported model.

Usage (the same for dyntool's modules, Hugging Face, TransformerLens and nanoGPT-style models)::

    with Capture(model, grad_scale=1 / accum_steps) as cap:
        loss = loss_fn(model(x))
        loss.backward()
    quantities = cap.compute()          # name -> tensor (L, nh, S, ...), see dyntool.quantities

Design (the PyTorch hook pitfalls TransformerLens and nnsight users hit):
- the model's attention reaches this class only through the observer contract of
  :mod:`dyntool.observe`; an adapter (:mod:`dyntool.adapters`, found automatically) wires it up
  on ``__enter__`` and unwires it on ``__exit__`` whatever happens;
- a *tensor* hook on the exact tensor the forward consumes (the per-head output), never module
  backward hooks;
- q, k, v are stashed detached; everything else is recomputed after backward from (q, k, v, U),
  the mask and the scale, so fused kernels record the same numbers as a materialised softmax;
- grouped-query attention is recorded per *query* head (k, v repeated; ``attrs["kv_head"]``
  says which k/v head each query head reads);
- query rows with no visible key (left padding) are treated as seeing every key, which is what
  an additive-mask softmax does;
- a hook that never fired (backward outside the ``with``, a compiled module, a layer skipped)
  raises :class:`CaptureError` instead of silently recording nothing;
- ``grad_scale`` is the factor the loss was multiplied by before ``backward`` (``1/accum`` for
  gradient accumulation, times the AMP loss scale); U is divided by it so it is unbiased;
- with a replacement backward (span variant) ``query_grad``/``key_grad`` are the gradients that
  really reached q and k (``attrs["qk_grads"] == "applied"``); ``score_grad`` stays the standard
  routing-law dS.
"""
from __future__ import annotations

import torch

from .observe import Observer, Site, expand_kv, kv_head_map
from .quantities import head_quantities


class CaptureError(RuntimeError):
    pass


class _Slot:
    __slots__ = ("q", "k", "v", "u", "ds", "dq", "dk", "allowed", "scale", "n_kv")

    def __init__(self):
        self.q = self.k = self.v = self.u = self.ds = self.dq = self.dk = self.allowed = None
        self.n_kv = None


class Capture(Observer):
    def __init__(self, model: torch.nn.Module, seqs: int | None = None, grad_scale: float = 1.0,
                 residual: bool = True, attention=None):
        from .adapters import AdapterError, find_adapter
        try:
            self.adapter = find_adapter(model, attention)
        except AdapterError as e:
            raise CaptureError(str(e)) from None
        self.sites: list[Site] = self.adapter.sites()
        if not self.sites:
            raise CaptureError(f"model has no attention modules to record ({self.adapter.name} adapter)")
        self.cores = getattr(self.adapter, "cores", [])     # dyntool's own modules, when those
        self.seqs, self.grad_scale, self.residual = seqs, float(grad_scale), residual
        self.slots: dict[Site, _Slot] = {}
        self._handles: list = []

    @property
    def attrs(self) -> dict:
        """Facts to store with the recording: adapter, implementation, GQA map, gradient source."""
        out = dict(self.adapter.attrs())
        kv = [s.n_kv for s in self.slots.values() if s.n_kv is not None]
        if kv:
            nh = next(iter(self.slots.values())).q.shape[1]
            out["kv_head"] = kv_head_map(nh, kv[0])
        return out

    # -- context management -------------------------------------------------------------
    def __enter__(self) -> "Capture":
        self.adapter.attach(self)
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.adapter.detach()

    # -- the observer contract (dyntool.observe), called during the forward ----------------
    def observe(self, site: Site, q, k, v, out, allowed, scale, heads_dim: int = 1,
                grads: str = "standard", scores=None) -> None:
        if site in self.slots:
            raise CaptureError("an attention module ran twice inside one Capture; capture one micro-step")
        if not out.requires_grad:
            raise CaptureError("attention output does not require grad: record inside a training step")
        sl = slice(None) if self.seqs is None else slice(0, self.seqs)
        nh = q.shape[1]
        slot = _Slot()
        slot.n_kv = k.shape[1] if k.shape[1] != nh else None
        slot.q = q[sl].detach()
        slot.k, slot.v = expand_kv(k[sl].detach(), nh), expand_kv(v[sl].detach(), nh)
        slot.scale = float(scale)
        allowed = allowed if allowed.dim() == 4 else allowed.unsqueeze(0)
        slot.allowed = allowed[sl] if allowed.shape[0] > 1 else allowed     # (S|1, nh|1, T, Tk)
        self.slots[site] = slot

        def on_u(grad, slot=slot, sl=sl, hd=heads_dim):
            g = grad[sl].detach()
            slot.u = g.transpose(1, 2) if hd == 2 else g     # (S, nh, T, d_v); stays on device
        self._handles.append(out.register_hook(on_u))
        if grads == "applied":
            for name, t in (("dq", q), ("dk", k)):
                if t.requires_grad:
                    def on_g(grad, slot=slot, sl=sl, name=name):
                        setattr(slot, name, grad[sl].detach())       # dk stays per kv head here
                    self._handles.append(t.register_hook(on_g))
        if scores is not None and self.residual and scores.requires_grad:
            def on_ds(grad, slot=slot, sl=sl):
                slot.ds = grad[sl].detach()
            self._handles.append(scores.register_hook(on_ds))

    # back-compat name used by older callers
    def stash(self, core, q, k, v, y, scores, scale) -> None:
        self.observe(core.site(), q, k, v, y, core.allowed(q.shape[-2], q.device).unsqueeze(0), scale,
                     scores=scores)

    # -- after backward -----------------------------------------------------------------
    def compute(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Quantities stacked over layers: matrices (L, nh, S, T, T), vectors (L, nh, S, T[, d]),
        per-head scalars (L, nh).  ``dtype`` defaults to float32 (float64 inputs stay float64)."""
        per_layer = []
        for site in self.sites:
            slot = self.slots.get(site)
            if slot is None:
                raise CaptureError(f"layer {site.layer}: attention did not run inside the Capture")
            if slot.u is None:
                raise CaptureError(f"layer {site.layer}: gradient hook never fired; call "
                                   "backward() inside the Capture and run recording steps uncompiled")
            per_layer.append(self._layer(slot, dtype))
        return {name: torch.stack([d[name] for d in per_layer]) for name in per_layer[0]}

    def _layer(self, slot: _Slot, dtype) -> dict[str, torch.Tensor]:
        dt = dtype or (torch.float64 if slot.q.dtype == torch.float64 else torch.float32)
        # (S, nh, T, d) → (nh, S, T, d): heads first so logit stats reduce over (S, T, T)
        q, k, v = (t.to(dt).transpose(0, 1) for t in (slot.q, slot.k, slot.v))
        u = slot.u.to(dt).transpose(0, 1) / self.grad_scale
        allowed = slot.allowed.transpose(0, 1)                             # (nh|1, S|1, T, Tk)
        empty = ~allowed.any(-1, keepdim=True)
        if empty.any():                   # a query with no visible key: softmax over all keys
            allowed = allowed | empty
        with torch.no_grad():
            qs = head_quantities(q, k, v, u, allowed, slot.scale)
            if slot.ds is not None:
                ds_auto = slot.ds.to(dt).transpose(0, 1) / self.grad_scale
                diff = (ds_auto - qs["score_grad"]).masked_fill(~allowed, 0.0)
                # relative, so it does not shrink with U: ‖autograd − closed form‖ / ‖autograd‖
                qs["routing_residual"] = (diff.flatten(1).norm(dim=1)
                                          / ds_auto.masked_fill(~allowed, 0.0).flatten(1).norm(dim=1).clamp_min(1e-300))
            if slot.dq is not None:       # span: the dQ/dK the backward really applied
                qs["query_grad"] = slot.dq.to(dt).transpose(0, 1) / self.grad_scale
            if slot.dk is not None:
                dk = slot.dk.to(dt) / self.grad_scale                      # (S, nh_kv, Tk, d)
                if slot.n_kv is not None:   # a kv head's gradient is shared by its query heads
                    dk = expand_kv(dk, q.shape[0])
                qs["key_grad"] = dk.transpose(0, 1)
        return qs
