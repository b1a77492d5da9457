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
- every capture checks itself during the forward (:mod:`dyntool.selfcheck`): α V must reproduce
  the output the model produced, or the layer is refused with a one-line reason before any
  backward; score modifiers the producer reports (``bias``, ``softcap``, ``sinks``) are recorded
  exactly, ones it does not are caught there;
- query rows with no visible key (left padding) follow the attention's own semantics, read off
  its output by the self-check: α = 0 and no gradient (SDPA), or uniform over every key
  (an additive-mask softmax);
- sites of different shapes (encoder self-, decoder self- and cross-attention) are stacked
  padded to one square size N: padded α/B/A/dS entries are 0, padded scores and vectors NaN;
  ``attrs["sites"]`` says which layer index is which site and its (T, Tk);
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

from .adapters import AdapterError, find_adapter
from .errors import CaptureError  # noqa: F401  (dyntool.capture.CaptureError: public, defined there)
from .observe import Observer, Site, expand_kv, kv_head_map
from .quantities import compute_dtype, head_quantities
from .record import names
from .selfcheck import SelfCheckError, verify


class _Slot:
    __slots__ = ("q", "k", "v", "u", "ds", "dq", "dk", "allowed", "scale", "n_kv", "bias", "softcap",
                 "sinks", "uniform_rows", "no_qk")

    def __init__(self):
        self.q = self.k = self.v = self.u = self.ds = self.dq = self.dk = self.allowed = None
        self.n_kv = self.bias = self.softcap = self.sinks = self.uniform_rows = None
        self.no_qk = False


class Capture(Observer):
    # takes grads="unavailable": q, k unknown (zeros, the scores passed whole as ``bias``), so
    # queries, keys, dQ, dK and the τ q·k statistics are recorded as NaN (the dataflow adapter)
    qk_optional = True

    def __init__(self, model: torch.nn.Module, seqs: int | None = None, grad_scale: float = 1.0,
                 residual: bool = True, attention=None):
        try:
            self.adapter = find_adapter(model, attention)
        except AdapterError as e:
            raise CaptureError(str(e)) from None
        self.sites: list[Site] = self.adapter.sites()
        if not self.sites:
            raise CaptureError(f"model has no attention modules to record ({self.adapter.name} adapter)")
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
        if self.slots:
            out["sites"] = [{"index": i, "name": s.name, "kind": s.kind, "stack": s.stack, "label": s.label,
                             "T": int(self.slots[s].q.shape[-2]), "Tk": int(self.slots[s].k.shape[-2])}
                            for i, s in enumerate(self.sites) if s in self.slots]
        mods = sorted({m for sl in self.slots.values() for m, on in
                       (("bias", sl.bias is not None), ("softcap", bool(sl.softcap)), ("sinks", sl.sinks is not None))
                       if on})
        if mods:
            out["score_modifiers"] = mods
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
                grads: str = "standard", scores=None, bias=None, softcap=None, sinks=None,
                out_map=None, grad_map=None, out_batch_dim: int = 0) -> None:
        """``out_map``/``grad_map``: for attention that never exposes its per-head output (torch's
        ``nn.MultiheadAttention`` returns ``out_proj(o)`` only), ``out`` is a linear image of it:
        ``out_map(o)`` (o: (S, nh, T, d_v)) gives ``out`` narrowed to the S recorded sequences along
        ``out_batch_dim``, and ``grad_map(∂L/∂out)`` gives U (B, nh, T, d_v) by the chain rule."""
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
        if bias is not None:
            bias = bias.detach()
            bias = bias if bias.dim() == 4 else bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
            slot.bias = bias[sl] if bias.shape[0] > 1 else bias             # (S|1, nh|1, T|1, Tk)
        slot.softcap = float(softcap) if softcap else None
        slot.no_qk = grads == "unavailable"
        if sinks is not None:
            slot.sinks = sinks.detach().reshape(1, -1, 1, 1)                # (1, nh, 1, 1)
        if out_map is None:
            o = out[sl].detach()
            o = o.transpose(1, 2) if heads_dim == 2 else o                  # (S, nh, T, d_v)
        else:
            o = out.detach().narrow(out_batch_dim, 0, slot.q.shape[0])     # in out's own layout
        try:
            slot.uniform_rows = verify(slot.q, slot.k, slot.v, o, slot.allowed, slot.scale, slot.bias,
                                       slot.softcap, slot.sinks, what=site_where(site), out_map=out_map)
        except SelfCheckError as e:
            raise CaptureError(str(e)) from None
        self.slots[site] = slot

        def on_u(grad, slot=slot, sl=sl, hd=heads_dim):
            if grad_map is not None:
                slot.u = grad_map(grad.detach())[sl]
                return
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

    # -- after backward -----------------------------------------------------------------
    def compute(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Quantities stacked over sites: matrices (L, nh, S, N, N), vectors (L, nh, S, N[, d]),
        per-head scalars (L, nh).  N = T when every site has the same (T, Tk); otherwise (an
        encoder–decoder) every site is padded to the largest length, see ``attrs["sites"]``.
        ``dtype`` defaults to float32 (float64 inputs stay float64)."""
        per_layer = []
        for site in self.sites:
            slot = self.slots.get(site)
            if slot is None:
                raise CaptureError(f"{site_where(site)}: attention did not run inside the Capture (its forward "
                                   "was not called, or ran outside the `with` block)")
            if slot.u is None:
                raise CaptureError(f"{site_where(site)}: gradient hook never fired; call "
                                   "backward() inside the Capture and run recording steps uncompiled")
            per_layer.append(self._layer(slot, dtype))
        shapes = {(d["attn"].shape[-2], d["attn"].shape[-1]) for d in per_layer}
        if len(shapes) > 1:
            n = max(max(s) for s in shapes)
            per_layer = [{k: pad_to(k, x, n) for k, x in d.items()} for d in per_layer]
        keys = [k for k in per_layer[0] if all(k in d for d in per_layer)]
        return {name: torch.stack([d[name] for d in per_layer]) for name in keys}

    def _layer(self, slot: _Slot, dtype) -> dict[str, torch.Tensor]:
        dt = dtype or compute_dtype(slot.q.dtype)
        # (S, nh, T, d) → (nh, S, T, d): heads first so logit stats reduce over (S, T, T)
        q, k, v = (t.to(dt).transpose(0, 1) for t in (slot.q, slot.k, slot.v))
        u = slot.u.to(dt).transpose(0, 1) / self.grad_scale
        allowed = slot.allowed.transpose(0, 1)                             # (nh|1, S|1, T, Tk)
        heads_first = lambda t: None if t is None else t.transpose(0, 1)   # noqa: E731
        bias = heads_first(slot.bias)
        with torch.no_grad():
            qs = head_quantities(q, k, v, u, allowed, slot.scale, bias=None if bias is None else bias.to(dt),
                                 softcap=slot.softcap, sinks=heads_first(slot.sinks),
                                 uniform_rows=heads_first(slot.uniform_rows))
            if slot.ds is not None:
                ds_auto = slot.ds.to(dt).transpose(0, 1) / self.grad_scale
                seen = allowed if slot.uniform_rows is None else allowed | heads_first(slot.uniform_rows)
                diff = (ds_auto - qs["score_grad"]).masked_fill(~seen, 0.0)
                # relative, so it does not shrink with U: ‖autograd − closed form‖ / ‖autograd‖
                qs["routing_residual"] = (diff.flatten(1).norm(dim=1)
                                          / ds_auto.masked_fill(~seen, 0.0).flatten(1).norm(dim=1).clamp_min(1e-300))
            if slot.dq is not None:       # span: the dQ/dK the backward really applied
                qs["query_grad"] = slot.dq.to(dt).transpose(0, 1) / self.grad_scale
            if slot.dk is not None:
                dk = slot.dk.to(dt) / self.grad_scale                      # (S, nh_kv, Tk, d)
                if slot.n_kv is not None:   # a kv head's gradient is shared by its query heads
                    dk = expand_kv(dk, q.shape[0])
                qs["key_grad"] = dk.transpose(0, 1)
            if slot.no_qk:
                for name in ("queries", "keys", "query_grad", "key_grad", "logit_max", "logit_norm"):
                    qs[name] = torch.full_like(qs[name], float("nan"))
        return qs


def site_where(site: Site) -> str:
    """How an error names a site: ``layer 3 (model.decoder.layers.1.encoder_attn, BartAttention)``."""
    what = ", ".join(x for x in (site.name, site.label) if x)
    return f"layer {site.layer}" + (f" ({what})" if what else "")


# padded entries of stacked sites: masked-looking (0) for the matrices, missing (NaN) elsewhere
_ZERO_PAD = ("attn", "compat", "advantage", "score_grad")


def pad_to(name: str, x: torch.Tensor, n: int) -> torch.Tensor:
    """Pad the query/key axes of one site's ``name`` (nh, S, ...) to length ``n``."""
    dims = names.DIMS.get(name, ())[3:]                 # after (layer, head, seq)
    if not any(d in ("query", "key") for d in dims):
        return x
    pad: list[int] = []
    for axis, d in reversed(list(enumerate(dims))):
        size = x.shape[2 + axis]
        pad += [0, n - size] if d in ("query", "key") else [0, 0]
    value = 0.0 if name in _ZERO_PAD else float("nan")
    return torch.nn.functional.pad(x, pad, value=value)
