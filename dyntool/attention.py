"""Attention modules with one recording seam.

``AttentionCore`` owns the mask, the backend and the seam; ``SingleHeadAttention`` (arXiv 2512.22473's
sticky-chain head: separate W_Q, W_K, W_V, W_O, no biases) and ``CausalSelfAttention``
(nanoGPT-like multi-head) both call ``AttentionCore.attend(q, k, v)`` with per-head tensors
``(B, nh, T, hs)``.  That is the *only* place attention is computed, so masks, backends and
recording are implemented once.

Backends:
- ``manual``: materialised ``softmax(τQKᵀ + mask) V``; works in float64; on a recording step
  it also exposes ``∂L/∂S`` from autograd so the routing-law residual can be recorded.
- ``sdpa``: ``F.scaled_dot_product_attention`` (fused; ``is_causal`` for the causal mask, a boolean
  ``attn_mask`` otherwise, which is how local/global heads run on CPU).
- ``flex``: ``flex_attention`` with a block mask built from the same :class:`~dyntool.masks.Mask`.
  On CUDA one module-level ``torch.compile``d kernel (:func:`flex_kernel`) serves every layer and
  every step, eager (recording) steps included, so the T×T scores are never materialised; block
  masks are cached per (mask, heads, T, device) (:func:`block_mask`).  On CPU only the forward
  without grad runs (torch 2.13 has no CPU flex backward): enough for parity checks.

Recording: ``attend`` feeds the observer contract of :mod:`dyntool.observe` while an observer is
attached (``attach``/``detach``; a :class:`dyntool.capture.Capture`, the per-step logit statistics,
or both): q, k, v, the output ``y`` (the tensor the forward consumes next, on which a capture puts
a *tensor* hook to receive ``U = ∂L/∂y``), the mask and the scale.  With a replacement backward
(``attend_fn``, the span variant) it says ``grads="applied"`` so the capture records the dQ, dK
that really reach q and k.  No observer: one attribute test, nothing else.  Inside a compiled
forward only ``observe_compiled(q, k)`` is called (the per-step logit statistic keeps q, k there).
``fused_fn`` (set while a :class:`dyntool.flight.FlightRecorder` with the fused kernel is entered)
replaces the attention itself: the kernel computes it and the cheap tier's statistics in one pass.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .masks import Mask, causal
from .observe import Fanout, Site

BACKENDS = ("manual", "sdpa", "flex")


class AttentionCore(nn.Module):
    def __init__(self, mask: Mask, n_head: int, backend: str = "sdpa"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r} (one of {', '.join(BACKENDS)})")
        self.mask, self.n_head, self.backend = mask, n_head, backend
        self.layer_index = 0          # set by the owning model; orders layers in recordings
        self._capture = None          # the attached observer (a Fanout when several), else None
        self._observers: list = []
        self.attend_fn = None         # optional replacement core, e.g. the span variant's backward
        # set by a FlightRecorder with record.kernel fused (dyntool.fused_path.FusedSite): computes
        # the attention and its statistics in one kernel on recorded steps; None = not serving
        self.fused_fn = None
        self._dense_cache: dict = {}

    def allowed(self, T: int, device) -> torch.Tensor:
        """Cached dense boolean mask ``(nh or 1, T, T)``."""
        key = (T, str(device))
        if key not in self._dense_cache:
            self._dense_cache[key] = self.mask.dense(T, self.n_head, device=device)
        return self._dense_cache[key]

    def site(self) -> Site:
        return Site(self.layer_index, id(self))

    def attach(self, observer) -> None:
        self._observers.append(observer)
        self._capture = self._observers[0] if len(self._observers) == 1 else Fanout(self._observers)

    def detach(self, observer) -> None:
        self._observers = [o for o in self._observers if o is not observer]
        self._capture = (None if not self._observers else self._observers[0]
                         if len(self._observers) == 1 else Fanout(self._observers))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``(B, nh, T, hs)`` ×3 → ``(B, nh, T, hs_v)``."""
        T = q.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1])
        cap = self._capture
        scores = None
        y = None if self.fused_fn is None else self.fused_fn(self, q, k, v, scale)
        if y is not None:
            pass
        elif self.backend == "manual":
            y, scores = self._manual(q, k, v, scale)
        elif self.attend_fn is not None:
            y = self.attend_fn(q, k, v, self._sdpa_mask_args(T, q.device), scale)
        elif self.backend == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, scale=scale, **self._sdpa_mask_args(T, q.device))
        else:
            y = self._flex(q, k, v, scale)
        if cap is not None and torch.compiler.is_compiling():
            cap.observe_compiled(q, k)
        elif cap is not None:
            cap.observe(self.site(), q, k, v, y, self.allowed(T, q.device).unsqueeze(0), scale,
                        grads="standard" if self.attend_fn is None else "applied", scores=scores)
        return y

    def _sdpa_mask_args(self, T: int, device) -> dict:
        if self.mask.is_causal:
            return {"is_causal": True}
        return {"attn_mask": self.allowed(T, device).unsqueeze(0)}   # (1, nh|1, T, T)

    def _manual(self, q, k, v, scale):
        s = torch.matmul(q, k.transpose(-1, -2)) * scale              # (B, nh, T, T)
        s = s.masked_fill(~self.allowed(q.shape[-2], q.device), float("-inf"))
        a = torch.softmax(s.float() if s.dtype in (torch.float16, torch.bfloat16) else s, dim=-1)
        return torch.matmul(a.to(v.dtype), v), s

    def _flex(self, q, k, v, scale):
        if q.device.type != "cuda" and torch.is_grad_enabled() and \
                (q.requires_grad or k.requires_grad or v.requires_grad):
            raise ValueError("the flex backend needs CUDA to train (flex_attention has no CPU backward); "
                             "use sdpa")
        bm = block_mask(self.mask, self.n_head, q.shape[-2], q.device)
        return flex_kernel(q.device.type)(q, k, v, block_mask=bm, scale=scale)


# --------------------------------------------------------------------------- flex, module level
_FLEX_COMPILED = None
_BLOCK_MASKS: dict = {}


def flex_kernel(device_type: str):
    """The flex_attention callable: one ``torch.compile``d kernel per process on CUDA (compiled
    once, shared by every layer; uncompiled flex_attention materialises the full score matrix),
    plain ``flex_attention`` elsewhere (CPU forward for parity checks) and inside an outer
    ``torch.compile`` (which compiles it with the model)."""
    global _FLEX_COMPILED
    from torch.nn.attention.flex_attention import flex_attention
    if device_type != "cuda" or torch.compiler.is_compiling():
        return flex_attention
    if _FLEX_COMPILED is None:
        _FLEX_COMPILED = torch.compile(flex_attention, dynamic=False)
    return _FLEX_COMPILED


def block_mask(mask: Mask, n_head: int, T: int, device):
    """Cached ``BlockMask`` for ``mask`` at length T on ``device`` (built once, shared by layers).

    Keyed by the mask's name (which spells its parameters, e.g. the window), the head count when
    the mask depends on the head, T and the device."""
    H = n_head if mask.per_head else None
    key = (mask.name, H, T, str(device))
    bm = _BLOCK_MASKS.get(key)
    if bm is None:
        from torch.nn.attention.flex_attention import create_block_mask
        bm = _BLOCK_MASKS[key] = create_block_mask(mask.mask_mod(), None, H, T, T, device=device)
    return bm


class SingleHeadAttention(nn.Module):
    """The spec's single head: ``logits = softmax(QKᵀ/√d_k + mask) V W_O``, row-major, no biases.

    ``x`` (B, T, d_x) → logits (B, T, n_classes).  ``W_Q`` (d_x, d_k), ``W_V`` (d_x, d_v),
    ``W_O`` (d_v, C) as in the authors' script, so ``Q = X @ W_Q``.
    """

    def __init__(self, d_x: int, d_k: int, d_v: int, n_classes: int, mask: Mask | None = None,
                 backend: str = "manual", init_std: float = 0.1):
        super().__init__()
        self.W_Q = nn.Parameter(torch.randn(d_x, d_k) * init_std)
        self.W_K = nn.Parameter(torch.randn(d_x, d_k) * init_std)
        self.W_V = nn.Parameter(torch.randn(d_x, d_v) * init_std)
        self.W_O = nn.Parameter(torch.randn(d_v, n_classes) * init_std)
        self.core = AttentionCore(mask or causal(), n_head=1, backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = (x @ self.W_Q).unsqueeze(1)           # (B, 1, T, d_k)
        k = (x @ self.W_K).unsqueeze(1)
        v = (x @ self.W_V).unsqueeze(1)           # (B, 1, T, d_v)
        g = self.core.attend(q, k, v)             # (B, 1, T, d_v): the head output u refers to
        return g.squeeze(1) @ self.W_O            # (B, T, C)


class CausalSelfAttention(nn.Module):
    """nanoGPT-style multi-head self-attention; the mask decides causal / local / local+global."""

    def __init__(self, n_embd: int, n_head: int, mask: Mask | None = None, backend: str = "sdpa",
                 bias: bool = False, qk_norm: bool = False):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        hs = n_embd // n_head
        # QK-norm (the LS paper's baseline): LayerNorm on q and k per head, before the scores
        self.q_norm = nn.LayerNorm(hs) if qk_norm else None
        self.k_norm = nn.LayerNorm(hs) if qk_norm else None
        self.core = AttentionCore(mask or causal(), n_head=n_head, backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)   # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        y = self.core.attend(q, k, v)                                      # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


def attention_cores(model: nn.Module) -> list[AttentionCore]:
    """All attention cores of a model, in layer order (``layer_index``, then module order)."""
    cores = [m for m in model.modules() if isinstance(m, AttentionCore)]
    return sorted(cores, key=lambda m: m.layer_index)
