"""Span-variant attention backward ("span-recon"): a RECONSTRUCTION, not the paper's method.

Paper: Kim, Yun & Yoon, *Scaling Bidirectional Spans and Span Violations in Attention
Mechanism*, arXiv 2512.13033.  All we could read is the abstract: the canonical forward
(softmax attention, their Eq. 1) is left intact; an "asymmetric projection" splits the
*backward* gradients into "parallel spans" and "orthogonal violations", which are rescaled;
"0th order bidirectional parallel spans" helped most, giving a 0.56% lower validation loss on
WikiText-2.  The method section, formulas and hyper-parameters could not be retrieved, so
everything below is our candidate family (arXiv 2512.13033 gives only the abstract's idea); pick the paper's
setting once someone checks the PDF.  Call it ``span-recon`` in configs and docs.

Forward: ``O = softmax(τ Q Kᵀ + mask) V`` via ``F.scaled_dot_product_attention`` with exactly
the caller's arguments, so the output is bitwise identical to the plain SDPA path.

Backward (eager, P recomputed from the saved q, k; float32, or float64 for float64 inputs)::

    P = softmax(τ Q Kᵀ + mask)   dV = Pᵀ dO   dP = dO Vᵀ   δ_i = Σ_j P_ij dP_ij
    dS = P ⊙ (dP − δ 1ᵀ)         dQ = τ dS K   dK = τ dSᵀ Q          (standard)

then, per head and per token (rows g of dQ or dK, x = that token's own q_i or k_j):

- ``c1_orthogonal`` (C1a, "0th order"):  g∥ = (g·x / x·x) x
- ``c1_oblique``    (C1b, asymmetric):   g∥ = (g·y / x·y) x, with |x·y| clamped to
  ≥ eps·|x||y| (sign kept); partner y = k̄_i = Σ_j P_ij k_j on the query side and
  y = q̄_j = Σ_i P_ij q_i / Σ_i P_ij on the key side.  g⊥ = g − g∥ is orthogonal to y.
- ``c1c_first_order`` (C1c, "1st order"): g∥ = orthogonal projection of g onto span{x, y}
  (Gram–Schmidt; if y ∥ x to within eps the span is just {x}, i.e. C1a).
- For C1: g̃ = α·g∥ + β·g⊥ with (alpha_q, beta_q) on dQ (if apply_q) and (alpha_k, beta_k)
  on dK (if apply_k).  "Bidirectional" = apply_q and apply_k.
- ``c2_constant_mode`` (C2, softmax constant mode, acts on dS before dQ/dK are formed):
  row (query direction, if apply_q):  dS̃ = dS + α0·P ⊙ (δ 1ᵀ), so dq_i gains α0·τ·δ_i·k̄_i.
  Column analogue (key direction, if apply_k, scale ``alpha0_col``): γ_j = Σ_i dS_ij / Σ_i P_ij
  is the P-weighted column mean of (dP − δ1ᵀ); dS̃ += α0_col·P ⊙ (1 γᵀ), so dk_j gains
  α0_col·τ·γ_j·Σ_i P_ij q_i.  γ is computed from the standard dS, so row and column terms
  commute.  Note the row mode is invisible to the loss (softmax is shift-invariant per row),
  so the standard gradient has α0 = 0; the column mode has no such meaning - it is just the
  transposed construction.  Default alpha0_col = 0 (row only).

dV is never touched.  With all scales at 1 (alpha0 = alpha0_col = 0) every candidate returns
the standard gradient.  Position: the split sits between the attention
core backward and the Q/K projection (and RoPE) backward; use it on post-RoPE q, k.

Autocast: ``custom_fwd/custom_bwd`` for ``q.device.type``; the forward keeps the ambient
autocast state (so it equals plain SDPA under autocast too), the backward re-rounds q, k, v to
the autocast dtype the forward used, then computes in float32 with autocast off.  Fully masked
rows get P = 0 (as SDPA's output 0).  Not supported: dropout, GQA, nested tensors.

Implementations (``span_attention(impl=...)``): ``"eager"`` is the custom Function above, for
every candidate.  ``"hook"`` (the default for c1_orthogonal via ``"auto"``) keeps SDPA's own
fused backward for the standard grads and rescales dQ, dK in an identity Function on q and k
C1a needs no P, and this keeps flash kernels on GPU.

Micro-benchmark (dev CPU, shared with other jobs, so per-thread CPU time, 1 thread, float32,
torch 2.13; B=8, nh=4, T=128, hs=32, causal; α=2, β=0.5 on both sides; median of 60):

    attention core fwd+bwd     SDPA 4.5 ms | c1_orthogonal (hook) 1.34x, (eager) 1.9x
                               c1_oblique 2.4x | c1c_first_order 2.6x | c2_constant_mode 1.5x
    pre-LN block fwd+bwd       SDPA 20 ms  | c1_orthogonal 1.09x | c1_oblique 1.41x
    (d_model 128, MLP 4x)      c1c_first_order 1.51x | c2_constant_mode 1.24x

So the default C1a meets the ≤ 1.25× step target; the eager path (needed for partners and C2)
does 5-7 dense bmm without causal block skipping, versus SDPA's fused causal kernel.  The
backward is fully vectorised (no loops over heads or tokens); it materialises P, so memory is
O(B·nh·T²) as in the manual backend.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import masks
from .quantities import compute_dtype
from .span_config import CANDIDATES, SpanConfig  # noqa: F401 - its own module: checked without torch


# ----------------------------------------------------------------------------- helpers

def _dot(a, b):
    return torch.linalg.vecdot(a, b).unsqueeze(-1)  # (..., T, 1), one fused pass


def _safe_div(num, den):
    # 0 where den == 0: a zero-norm x / y (or a never-attended key) has g = 0 or no direction.
    # The guard works on the small (..., T, 1) denominator; the big tensor is touched once.
    inv = torch.where(den == 0, torch.zeros_like(den), 1.0 / den)
    return num * inv


def _parallel_terms(g, x, y, kind: str, eps: float):
    """g∥ as a list of (coefficient (..., T, 1), direction (..., T, hs)) pairs."""
    if kind == "c1_orthogonal":
        return [(_safe_div(_dot(g, x), _dot(x, x)), x)]
    ny = y.norm(dim=-1, keepdim=True)
    if kind == "c1_oblique":
        den = _dot(x, y)
        floor = eps * x.norm(dim=-1, keepdim=True) * ny
        den = torch.where(den.abs() < floor, torch.where(den < 0, -floor, floor), den)  # sign(0)=+
        return [(_safe_div(_dot(g, y), den), x)]
    if kind == "c1c_first_order":
        e1 = _safe_div(x, x.norm(dim=-1, keepdim=True))         # (..., T, hs)
        r = y - _dot(y, e1) * e1                                # y minus its x-component
        nr = r.norm(dim=-1, keepdim=True)
        e2 = torch.where(nr > eps * ny, _safe_div(r, nr), torch.zeros_like(r))  # y ∥ x -> 1-D
        return [(_dot(g, e1), e1), (_dot(g, e2), e2)]
    raise ValueError(f"SpanConfig.candidate: {kind!r} has no C1 split")


def split_parallel(g, x, y, kind: str, eps: float = 1e-6):
    """g∥ for rows of g (..., T, hs) w.r.t. own vectors x and partners y (same shape)."""
    terms = _parallel_terms(g, x, y, kind, eps)
    return sum(c * d for c, d in terms)


def _rescale(g, x, y, kind, alpha, beta, eps):
    if alpha == beta == 1:
        return g  # exact identity, not just up to rounding
    # α g∥ + β (g − g∥) = β g + (α − β) g∥, written to touch (T, hs) tensors few times
    out = g * beta if beta != 1 else g.clone()
    for c, d in _parallel_terms(g, x, y, kind, eps):
        out.addcmul_(c, d, value=alpha - beta)
    return out


def _allowed(attn_mask, is_causal, L, S, device):
    if is_causal:
        return masks.causal().dense(L, device=device, T_k=S)[0]   # SDPA's is_causal: top-left, j <= i
    return attn_mask


def _span_backward(cfg: SpanConfig, q, k, v, do, attn_mask, is_causal, scale):
    """All inputs already in the compute dtype. Returns dq, dk, dv."""
    L, S, hs = q.shape[-2], k.shape[-2], q.shape[-1]
    tau = scale if scale is not None else 1.0 / math.sqrt(hs)
    qs = q * tau                                                  # fold τ into the small side
    s = torch.matmul(qs, k.transpose(-2, -1))                     # (B, nh, L, S)
    mask = _allowed(attn_mask, is_causal, L, S, q.device)
    empty = None                                                  # fully masked rows, (…, L, 1)
    if mask is not None:
        if mask.dtype == torch.bool:
            s.masked_fill_(~mask, float("-inf"))
            if not is_causal:
                empty = (~mask).all(-1, keepdim=True)
        else:
            s.add_(mask.to(s.dtype))                              # additive float mask
            empty = torch.isneginf(mask).all(-1, keepdim=True)
    p = torch.softmax(s, dim=-1)
    del s
    if empty is not None:
        # fully masked rows -> P = 0 (softmax gave NaN); no host sync (a Python bool on a
        # tensor), so the backward traces whole under torch.compile
        p.masked_fill_(empty, 0.0)
    dv = torch.matmul(p.transpose(-2, -1), do)                    # (B, nh, S, hs_v)
    dp = torch.matmul(do, v.transpose(-2, -1))                    # (B, nh, L, S)
    delta = torch.linalg.vecdot(p, dp).unsqueeze(-1)              # (B, nh, L, 1)
    ds = dp.sub_(delta).mul_(p)                                   # standard dS, in place
    if cfg.candidate == "c2_constant_mode":
        gamma = None
        if cfg.apply_k and cfg.alpha0_col:                        # from the *standard* dS
            gamma = _safe_div(ds.sum(-2, keepdim=True), p.sum(-2, keepdim=True))  # (B,nh,1,S)
        if cfg.apply_q and cfg.alpha0:
            ds.addcmul_(p, delta, value=cfg.alpha0)               # row constant mode
        if gamma is not None:
            ds.addcmul_(p, gamma, value=cfg.alpha0_col)           # column constant mode
    dq = torch.matmul(ds, k).mul_(tau)                            # (B, nh, L, hs)
    dk = torch.matmul(ds.transpose(-2, -1), qs)                   # (B, nh, S, hs), τ in qs
    if cfg.candidate != "c2_constant_mode":
        kind = cfg.candidate
        need_y = kind != "c1_orthogonal"
        if cfg.apply_q and not cfg.alpha_q == cfg.beta_q == 1:
            y = torch.matmul(p, k) if need_y else None            # k̄_i = Σ_j P_ij k_j
            dq = _rescale(dq, q, y, kind, cfg.alpha_q, cfg.beta_q, cfg.eps)
        if cfg.apply_k and not cfg.alpha_k == cfg.beta_k == 1:
            y = None
            if need_y:                                            # q̄_j = Σ_i P_ij q_i / Σ_i P_ij
                y = _safe_div(torch.matmul(p.transpose(-2, -1), q),
                              p.sum(-2).unsqueeze(-1))
            dk = _rescale(dk, k, y, kind, cfg.alpha_k, cfg.beta_k, cfg.eps)
    return dq, dk, dv


class _ProjectGrad(torch.autograd.Function):
    """Identity forward; backward replaces g by α·g∥ + β·g⊥ (C1a, x = the input itself).

    The hook form: SDPA's own fused backward produces the standard
    gradient and only this O(T·hs) step is added, so no P is recomputed."""

    @staticmethod
    def forward(ctx, x, alpha, beta):
        ctx.save_for_backward(x)
        ctx.alpha, ctx.beta = alpha, beta
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        ct = compute_dtype(g.dtype)
        # eps only guards the oblique / 1st-order splits; the orthogonal one needs none
        out = _rescale(g.to(ct), x.to(ct), None, "c1_orthogonal", ctx.alpha, ctx.beta, 0.0)
        return out.to(g.dtype), None, None


# ----------------------------------------------------------------------------- Function

def _make_function(device_type: str):
    """One autograd.Function per device type: custom_fwd/bwd need it at decoration time.

    Built once per device type *at import* (``_FUNCTIONS``), never inside a traced call: a class
    statement executed under ``torch.compile`` is a graph break (``__build_class__``)."""

    class SpanAttentionFn(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type=device_type)
        def forward(ctx, q, k, v, cfg, attn_mask, is_causal, scale):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                               is_causal=is_causal, scale=scale)
            ctx.save_for_backward(q, k, v, attn_mask)
            ctx.cfg, ctx.is_causal, ctx.scale = cfg, is_causal, scale
            # the dtype SDPA really computed in (autocast may have cast q, k, v down)
            ctx.fwd_dtype = o.dtype
            return o

        @staticmethod
        @torch.amp.custom_bwd(device_type=device_type)
        def backward(ctx, do):
            q, k, v, attn_mask = ctx.saved_tensors
            ct = compute_dtype(q.dtype)

            def prep(t):
                # round to what the forward saw, then widen: the gradient of cast∘SDPA is
                # SDPA's gradient at the rounded point
                if t.dtype != ctx.fwd_dtype and t.is_floating_point():
                    t = t.to(ctx.fwd_dtype)
                return t.to(ct)

            with torch.autocast(device_type=device_type, enabled=False):
                dq, dk, dv = _span_backward(ctx.cfg, prep(q), prep(k), prep(v), do.to(ct),
                                            attn_mask, ctx.is_causal, ctx.scale)
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None

    SpanAttentionFn.__name__ = SpanAttentionFn.__qualname__ = f"SpanAttentionFn_{device_type}"
    return SpanAttentionFn


_FUNCTIONS = {dt: _make_function(dt) for dt in ("cpu", "cuda")}


def _function_for(device_type: str):
    fn = _FUNCTIONS.get(device_type)
    if fn is None:                                   # e.g. "mps", "xpu": built on first use (eager)
        fn = _FUNCTIONS[device_type] = _make_function(device_type)
    return fn


def span_attention(q, k, v, cfg: SpanConfig, attn_mask=None, is_causal: bool = False,
                   scale: float | None = None, impl: str = "auto"):
    """Canonical attention forward with the span-recon backward.

    q, k: (B, nh, L|S, hs), v: (B, nh, S, hs_v); ``attn_mask``: bool (True = attend) or
    additive float, broadcastable to (B, nh, L, S); or ``is_causal=True`` (not both).
    ``impl``: ``"eager"`` = the custom Function with the recomputed-P backward (any
    candidate); ``"hook"`` = SDPA's own backward + :class:`_ProjectGrad` on q and k (C1a
    only; fused kernels kept); ``"auto"`` = hook for c1_orthogonal, eager otherwise.
    """
    if not isinstance(cfg, SpanConfig):
        raise TypeError(f"cfg must be a SpanConfig, got {type(cfg).__name__}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected q, k, v of shape (B, nh, T, hs), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"incompatible q, k, v shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)} (GQA is not supported)")
    if attn_mask is not None and is_causal:
        raise ValueError("pass either attn_mask or is_causal=True, not both")
    if attn_mask is not None and attn_mask.requires_grad:
        raise ValueError("attn_mask must not require grad")
    if impl not in ("auto", "eager", "hook"):
        raise ValueError(f"impl: expected 'auto', 'eager' or 'hook', got {impl!r}")
    if impl == "hook" and cfg.candidate != "c1_orthogonal":
        raise ValueError(f"impl='hook' supports only c1_orthogonal, not {cfg.candidate!r}")
    if impl == "hook" or (impl == "auto" and cfg.candidate == "c1_orthogonal"):
        if cfg.apply_q and not cfg.alpha_q == cfg.beta_q == 1:
            q = _ProjectGrad.apply(q, cfg.alpha_q, cfg.beta_q)
        if cfg.apply_k and not cfg.alpha_k == cfg.beta_k == 1:
            k = _ProjectGrad.apply(k, cfg.alpha_k, cfg.beta_k)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                              is_causal=is_causal, scale=scale)
    return _function_for(q.device.type).apply(q, k, v, cfg, attn_mask, is_causal, scale)
