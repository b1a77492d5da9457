"""The observer contract: what any attention implementation hands dyntool on a recording step.

One call per layer and forward, from inside the attention (dyntool's ``AttentionCore``, or an
adapter in :mod:`dyntool.adapters` for Hugging Face, nanoGPT-style SDPA modules, TransformerLens)::

    observer.observe(site, q, k, v, out, allowed, scale)

- ``site``: :class:`Site`, the layer index (orders layers in recordings) and a label.
- ``q`` (B, nh, T, d_k): queries per *query* head, after RoPE / QK-norm, before the softmax.
- ``k`` (B, nh_kv, Tk, d_k), ``v`` (B, nh_kv, Tk, d_v): per key/value head; with grouped-query
  attention ``nh_kv`` divides ``nh`` and query head ``h`` reads k/v head ``h // (nh / nh_kv)``
  (the ``repeat_kv`` convention of Hugging Face and TransformerLens).
- ``out``: the per-head output tensor the forward consumes next (``Σ_j α_ij v_j``), laid out
  (B, nh, T, d_v) or, with ``heads_dim=2``, (B, T, nh, d_v).  The observer puts a *tensor* hook
  on it to receive ``U = ∂L/∂out`` (never module backward hooks: they fire at the wrong time for this).
- ``allowed``: boolean, True = attend, broadcastable to (B, nh, T, Tk): causal, padding and
  sliding-window masks all end up here (:func:`allowed_from` converts the usual forms).
- ``scale``: the factor on ``q·k`` (``1/sqrt(d_k)`` unless the model says otherwise).
- score modifiers (optional, keyword): ``bias`` an additive float bias broadcastable to
  (B, nh, T, Tk) (ALiBi, T5's relative-position bias, the finite part of a float mask),
  ``softcap`` a float c (scores ``c·tanh(τ q·k / c)``), ``sinks`` a (nh,) tensor of sink logits
  (one extra logit per row in the softmax's denominator).  A modifier the producer does not pass
  is caught by the observer's self-check (:class:`dyntool.capture.Capture`), never recorded wrong.
- ``grads`` (optional): ``"standard"`` when the backward is autograd's own; ``"applied"`` when
  the implementation rescales dQ/dK in its backward (the span variant) and the observer should
  record the gradients that really reach q and k (tensor hooks on ``q`` and ``k``).

Everything else (α, B, the advantages, dS, dQ, dK, entropies, logit statistics) is computed by
:mod:`dyntool.quantities` from these tensors.  Producers call observers only while one is
attached, so a non-recording step runs the fused path untouched.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Site:
    """One attention layer: ``layer`` orders recordings; ``key`` tells sites apart (module id).

    ``kind``: ``"self"`` or ``"cross"`` (queries from one sequence, keys/values from another, as
    in encoder–decoders); ``stack``: ``"encoder"``, ``"decoder"`` or ``""``; ``name``: the module's
    path in the model (``model.decoder.layers.0.encoder_attn``)."""
    layer: int
    key: int = 0
    label: str = ""
    kind: str = "self"
    stack: str = ""
    name: str = ""


class Observer:
    """Base class: override :meth:`observe`."""

    def observe(self, site: Site, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor, allowed: torch.Tensor, scale: float, heads_dim: int = 1,
                grads: str = "standard", scores: torch.Tensor | None = None, **modifiers) -> None:
        raise NotImplementedError

    def observe_compiled(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """Inside a ``torch.compile``d forward only this is called (a graph keeps no Python work
        but attribute stores): observers that need nothing else may keep q, k here."""


def expand_kv(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, nh_kv, T, d) → (B, nh, T, d) with query head h reading kv head h // (nh / nh_kv)."""
    n_kv = t.shape[1]
    if n_kv == n_head:
        return t
    if n_head % n_kv:
        raise ValueError(f"{n_head} query heads are not a multiple of {n_kv} key/value heads")
    return t.repeat_interleave(n_head // n_kv, dim=1)


def kv_head_map(n_head: int, n_kv: int) -> list[int]:
    """Which key/value head each query head reads (stored with GQA recordings)."""
    return [h // (n_head // n_kv) for h in range(n_head)]


def causal_allowed(T: int, Tk: int | None = None, window: int | None = None, device=None) -> torch.Tensor:
    """(T, Tk) boolean: key j visible to query i iff j ≤ i + (Tk − T) [and i − j < window].

    ``window`` counts the keys *including* the query itself (flash-attn ``window_size=(w-1, 0)``,
    Hugging Face ``sliding_window``)."""
    Tk = T if Tk is None else Tk
    i = torch.arange(T, device=device)[:, None] + (Tk - T)
    j = torch.arange(Tk, device=device)[None, :]
    ok = j <= i
    if window is not None:
        ok = ok & (i - j < window)
    return ok


def allowed_from(mask: torch.Tensor | None, T: int, Tk: int, causal: bool = True,
                 window: int | None = None, device=None) -> torch.Tensor:
    """Boolean ``allowed`` (B|1, 1|nh, T, Tk) from the common mask forms:

    - ``None``: the causal (optionally sliding-window) mask, or all-visible when not causal;
    - 2-D (B, Tk) padding mask (1 = token, 0 = pad; flash-attention style): combined with the
      causal/window mask;
    - 4-D boolean (True = attend) or additive float (0 = attend, large negative = masked):
      taken as is (it already holds causal, window and padding)."""
    base = causal_allowed(T, Tk, window, device) if causal else torch.ones(T, Tk, dtype=torch.bool,
                                                                           device=device)
    if mask is None:
        return base[None, None]
    if mask.dim() == 2:
        return base[None, None] & mask.bool()[:, None, None, :]
    if mask.dim() != 4:
        raise ValueError(f"attention mask of shape {tuple(mask.shape)}: expected (B, Tk) or (B, h, T, Tk)")
    mask = mask[..., -T:, :Tk]
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2       # additive: 0 kept, min/−inf masked


def additive_bias(bias: torch.Tensor | None, mask: torch.Tensor | None, T: int, Tk: int) -> torch.Tensor | None:
    """The additive part of the scores besides ``τ q·k``, or None when there is none.

    ``bias``: an explicit score bias (T5's ``position_bias``); ``mask``: a float attention mask,
    whose finite (allowed) entries are a bias too when nonzero (ALiBi folded into the mask, as
    Falcon and Bloom do).  Masked entries (min/−inf) are the mask's job, not the bias's."""
    parts = []
    if bias is not None:
        parts.append(bias.detach()[..., -T:, :Tk] if bias.dim() >= 2 else bias.detach())
    if mask is not None and mask.dim() == 4 and mask.dtype.is_floating_point:
        m = mask.detach()[..., -T:, :Tk]
        finite = m.masked_fill(m <= torch.finfo(m.dtype).min / 2, 0.0)
        if bool(finite.ne(0).any()):
            parts.append(finite)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


class Fanout(Observer):
    """Several observers on one producer (e.g. a Capture and the per-step logit statistics)."""

    def __init__(self, observers):
        self.observers = list(observers)

    def observe(self, site, *args, **kw) -> None:
        for o in self.observers:
            o.observe(site, *args, **kw)

    def observe_compiled(self, q, k) -> None:
        for o in self.observers:
            o.observe_compiled(q, k)


class KeepQK(Observer):
    """Forward-only: keeps a detached *reference* (no copy) to the last q, k of one site, for
    per-step logit statistics computed after the step (dyntool.train.recording)."""

    def __init__(self):
        self.q = self.k = self.allowed = self.scale = None

    def observe(self, site, q, k, v, out, allowed, scale, heads_dim=1, grads="standard", scores=None,
                **modifiers):
        self.q, self.k = q.detach(), expand_kv(k.detach(), q.shape[1])
        self.allowed, self.scale = allowed, scale

    def observe_compiled(self, q, k) -> None:       # a compiled step's logit statistic
        self.q, self.k = q.detach(), expand_kv(k.detach(), q.shape[1])

    def last(self):
        return None if self.q is None else (self.q, self.k)

    def clear(self) -> None:
        self.q = self.k = self.allowed = None
