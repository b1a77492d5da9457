"""The first-order quantities of attention training, as pure tensor functions.

Notation (arXiv 2512.22473, its first-order analysis; the last column names the step of that
analysis or says "diagnostic" for dyntool's own summaries; row-major): per head, queries ``q_i``, keys
``k_j``, values ``v_j``, scale ``τ = 1/sqrt(d_k)``, allowed set ``M(i)`` (the mask).

=====================  =========================================================  ==============
name                   formula                                                    where
=====================  =========================================================  ==============
``scores``    S        ``s_ij = τ q_i·k_j`` on M(i) (masked entries: NaN on disk)   model
``attn``      α        ``softmax_j(s_ij)`` over M(i)                               model
``upstream``  U        ``u_i = ∂L/∂g_i``, g_i = Σ_j α_ij v_j (the per-head output)  output layer
``compat``    B        ``b_ij = u_i·v_j`` (= ∂L/∂α_ij), 0 off M(i)                  compatibility
``expected_compat``    ``E_α[b]_i = Σ_j α_ij b_ij = u_i·g_i``                       compatibility
``advantage`` A        ``A_ij = E_α[b]_i − b_ij``  (positive = value j is better than  routing law
                       query i's current mix; gradient descent moves s_ij up)
``score_grad`` dS      ``∂L/∂s_ij = α_ij (b_ij − E_α[b]_i) = −α_ij A_ij``           routing law
``value_grad`` dV      ``∂L/∂v_j = Σ_i α_ij u_i``                                    value update
``query_grad`` dQ      ``∂L/∂q_i = τ Σ_j dS_ij k_j``                                 query/key law
``key_grad``   dK      ``∂L/∂k_j = τ Σ_i dS_ij q_i``                                 query/key law
``attn_entropy``       ``H_i = −Σ_j α_ij log α_ij`` (nats)                           diagnostic
``attn_entropy_norm``  ``H_i / log|M(i)|`` (0 where |M(i)| = 1)                     diagnostic
``column_usage``       ``c_j = Σ_i α_ij``                                           value update
``value_norm``         ``‖v_j‖``                                                     diagnostic
``logit_max``          ``max |τ q_i·k_j|`` over allowed entries (per head)          LS paper
``logit_norm``         RMS of ``τ q_i·k_j`` over allowed entries (per head)
``sink_mass``          ``1 − Σ_j α_ij``: an attention sink's share (sink models)     diagnostic
=====================  =========================================================  ==============

Score modifiers (soft-capping, additive biases such as ALiBi or T5's relative-position bias,
attention sinks): ``S`` is what the softmax sees, ``c·tanh(τ q·k / c) + bias``; see
:func:`head_quantities`.

Every function takes batched tensors ``(..., T, d)`` and a boolean ``allowed`` mask broadcastable
to ``(..., T, T)``; they are checked against autograd in ``tests/unit/test_quantities.py``.
"""
from __future__ import annotations

import math

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What every recorded quantity and statistic is computed in: float64 stays float64, everything
    else (bf16, fp16, fp32) is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def masked_scores(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, scale: float) -> torch.Tensor:
    """``τ q kᵀ`` with disallowed entries set to −inf.  # (..., T, T)"""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    return s.masked_fill(~allowed, float("-inf"))


def attention_weights(scores: torch.Tensor) -> torch.Tensor:
    """Row softmax; a fully-masked row (never produced by our masks) would give NaN."""
    return torch.softmax(scores, dim=-1)


def score_parts(q: torch.Tensor, k: torch.Tensor, scale: float, softcap: float | None = None,
                bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, scores)``: the raw ``τ q kᵀ`` and the scores the softmax sees,
    ``c·tanh(logits / c) + bias`` (soft-capping first, as Gemma-2 and TransformerLens do; the bias
    holds ALiBi, T5's relative-position bias or any additive float mask).  # (..., T, Tk) each"""
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = softcap * torch.tanh(logits / softcap) if softcap else logits
    return logits, (s if bias is None else s + bias)


def masked_softmax(s: torch.Tensor, allowed: torch.Tensor, sinks: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(α, sink_mass)``: softmax of ``s`` over the allowed keys of each row.

    ``sinks`` (broadcastable to (..., T, 1)): one extra logit per row in the denominator with no
    value (gpt-oss ``s_aux``, TransformerLens attention sinks); α over the real keys then sums to
    ``1 − sink_mass``.  A row with no allowed key gets α = 0 (what SDPA outputs there), never NaN."""
    sm = s.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        a, sink_mass = torch.softmax(sm, dim=-1), None
    else:
        p = torch.softmax(torch.cat([sm, sinks.to(s.dtype).expand(*sm.shape[:-1], 1)], dim=-1), dim=-1)
        a, sink_mass = p[..., :-1], p[..., -1]
    empty = ~allowed.any(-1, keepdim=True)
    a = a.masked_fill(empty, 0.0)             # unconditional: an `if empty.any()` is a device sync
    return a, sink_mass


def compatibility(u: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``B = U Vᵀ`` restricted to the allowed entries.  # (..., T, T)"""
    return (torch.matmul(u, v.transpose(-1, -2))).masked_fill(~allowed, 0.0)


def expected_compat(attn: torch.Tensor, compat: torch.Tensor) -> torch.Tensor:
    """``E_α[b]`` per query row.  # (..., T)"""
    return (attn * compat).sum(-1)


def advantage(attn: torch.Tensor, compat: torch.Tensor, allowed: torch.Tensor,
              expected: torch.Tensor | None = None) -> torch.Tensor:
    """``A = E_α[b] − B`` on the allowed entries (0 elsewhere).  # (..., T, T)

    ``expected`` (..., T): E_α[b] when the caller has it already (e.g. as u·g, which equals
    Σ_j α_ij b_ij without a T×T pass); default computed from ``attn`` and ``compat``."""
    e = expected_compat(attn, compat) if expected is None else expected
    return (e.unsqueeze(-1) - compat).masked_fill(~allowed, 0.0)


def score_grad(attn: torch.Tensor, compat: torch.Tensor, expected: torch.Tensor | None = None) -> torch.Tensor:
    """The routing law ``∂L/∂S = α ⊙ (B − E_α[b])``; each row sums to 0.  # (..., T, T)

    ``expected``: E_α[b] if already known (see :func:`advantage`)."""
    e = expected_compat(attn, compat) if expected is None else expected
    return attn * (compat - e.unsqueeze(-1))


def entropy(attn: torch.Tensor) -> torch.Tensor:
    """Per-query attention entropy in nats, with 0·log 0 = 0.  # (..., T)"""
    return torch.special.entr(attn).sum(-1)     # entr(x) = −x log x, 0 at 0: one pass, no temporaries


def normalised_entropy(ent: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``H_i / log|M(i)|`` so that rows with different causal support compare; 0 if |M(i)| = 1."""
    support = allowed.sum(-1).to(ent.dtype).expand_as(ent)
    log_support = torch.log(support.clamp_min(1.0))
    return torch.where(support > 1, ent / log_support.clamp_min(1e-30), torch.zeros_like(ent))


def logit_stats(scores: torch.Tensor, allowed: torch.Tensor, reduce_dims: tuple[int, ...]):
    """``(max |s|, RMS s)`` over allowed entries, reduced over ``reduce_dims``."""
    finite = torch.where(allowed, scores, torch.zeros_like(scores))
    mx = finite.abs().amax(dim=reduce_dims)
    n = allowed.expand_as(scores).sum(dim=reduce_dims).clamp_min(1)
    rms = torch.sqrt((finite * finite).sum(dim=reduce_dims) / n)
    return mx, rms


def head_quantities(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, u: torch.Tensor,
                    allowed: torch.Tensor, scale: float | None = None, *, bias: torch.Tensor | None = None,
                    softcap: float | None = None, sinks: torch.Tensor | None = None,
                    uniform_rows: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """All per-head quantities from saved ``q, k, v`` and the captured ``u``.

    Shapes: ``q, k`` (..., T, d_k); ``v, u`` (..., Tk, d_v) / (..., T, d_v); ``allowed``
    broadcastable to (..., T, Tk).  Matrices come back as (..., T, Tk), per-query/per-key vectors
    as (..., T), and ``logit_max``/``logit_norm`` reduced over the last three axes of
    (..., seq, T, Tk) when ``q`` is 4-D or more (i.e. per head), else over (T, Tk).

    Score modifiers (see :func:`score_parts`, :func:`masked_softmax`): ``scores`` are the ones the
    softmax sees and ``score_grad`` is ∂L/∂ of those (the routing law holds for them);
    ``query_grad``/``key_grad`` go back through the soft-cap; ``logit_max``/``logit_norm`` are
    about the raw ``τ q·k`` (the statistic logit-growth papers report).  ``sinks`` adds
    ``sink_mass`` (the sink's share of each row).  Rows with no allowed key: α = 0 and no
    gradient (SDPA's semantics), or, where ``uniform_rows`` (..., T, 1) is True, uniform over all
    keys with the gradient autograd gives an additive-mask softmax (eager's semantics).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    logits, s = score_parts(q, k, scale, softcap, bias)
    seen = allowed                                     # what the statistics of real entries use
    if uniform_rows is not None and uniform_rows.any():
        allowed = allowed | uniform_rows               # every key, equal scores: uniform α
        s = s.masked_fill(uniform_rows, 0.0)
    a, sink_mass = masked_softmax(s, allowed, sinks)
    b = compatibility(u, v, allowed)
    eb = expected_compat(a, b)
    ds = a * (b - eb.unsqueeze(-1))
    d_logits = ds * (1 - torch.tanh(logits / softcap) ** 2) if softcap else ds
    ent = entropy(a)
    red = (-3, -2, -1) if q.dim() >= 4 else (-2, -1)
    lmax, lrms = logit_stats(logits, seen, red)
    out = {
        "scores": s.masked_fill(~allowed, float("nan")),
        "attn": a,
        "compat": b,
        "expected_compat": eb,
        "advantage": (eb.unsqueeze(-1) - b).masked_fill(~allowed, 0.0),
        "score_grad": ds,
        "upstream": u,
        "values": v,
        "queries": q,
        "keys": k,
        "value_grad": torch.matmul(a.transpose(-1, -2), u),
        "query_grad": torch.matmul(d_logits, k) * scale,
        "key_grad": torch.matmul(d_logits.transpose(-1, -2), q) * scale,
        "attn_entropy": ent,
        "attn_entropy_norm": normalised_entropy(ent, allowed),
        "column_usage": a.sum(-2),
        "value_norm": v.norm(dim=-1),
        "logit_max": lmax,
        "logit_norm": lrms,
    }
    if sink_mass is not None:
        out["sink_mass"] = sink_mass
    return out
