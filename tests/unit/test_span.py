"""span-recon backward: identity at unit scales, hand formulas at other scales (float64)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dyntool.span import CANDIDATES, SpanConfig, span_attention, split_parallel

B, NH, T, HS = 2, 3, 7, 5
W = 3  # sliding window width (query i sees keys i-W+1 .. i)


def _window_mask(T=T, w=W):
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    return (j <= i) & (i - j < w)                                  # (T, T) True = attend


MASKS = {"causal": dict(is_causal=True), "window": dict(attn_mask=_window_mask())}
IMPLS = {"c1_orthogonal": ["hook", "eager"]}


def _inputs(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, NH, T, HS, generator=g, dtype=dtype) for _ in range(4))
    return q, k, v, do


def _grads(fn, q, k, v, do):
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    o = fn(qq, kk, vv)
    return (o,) + torch.autograd.grad(o, (qq, kk, vv), do)


def _sdpa(mask_kw):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **mask_kw)


def _span(cfg, mask_kw, impl="auto"):
    return lambda q, k, v: span_attention(q, k, v, cfg, impl=impl, **mask_kw)


def _probs(q, k, mask_kw):
    """P computed independently of the module (explicit masked softmax)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    m = torch.ones(T, T, dtype=torch.bool).tril() if mask_kw.get("is_causal") else mask_kw["attn_mask"]
    return torch.softmax(s.masked_fill(~m, float("-inf")), -1)


def _cases():
    for c in CANDIDATES:
        for impl in IMPLS.get(c, ["auto"]):
            for m in MASKS:
                yield c, impl, m


@pytest.mark.parametrize("cand,impl,mask", list(_cases()))
def test_unit_scales_equal_sdpa(cand, impl, mask):
    q, k, v, do = _inputs()
    ref = _grads(_sdpa(MASKS[mask]), q, k, v, do)
    got = _grads(_span(SpanConfig(cand), MASKS[mask], impl), q, k, v, do)
    assert torch.equal(got[0], ref[0])                            # forward bitwise identical
    for a, b in zip(got[1:], ref[1:]):
        assert (a - b).abs().max().item() <= 1e-12


@pytest.mark.parametrize("cand", CANDIDATES)
def test_forward_bitwise_float32_and_scaled(cand):
    q, k, v, _ = _inputs(dtype=torch.float32)
    cfg = SpanConfig(cand, alpha_q=3.0, beta_k=0.5, alpha0=1.0)
    for kw in (dict(is_causal=True), dict(attn_mask=_window_mask()), dict(scale=0.3)):
        assert torch.equal(span_attention(q, k, v, cfg, **kw),
                           F.scaled_dot_product_attention(q, k, v, **kw))


@pytest.mark.parametrize("cand", CANDIDATES)
def test_gradcheck_at_unit_scales(cand):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    cfg = SpanConfig(cand)
    assert torch.autograd.gradcheck(lambda a, b, c: span_attention(a, b, c, cfg, is_causal=True),
                                    (q, k, v))


def test_gradcheck_fails_when_scaled():
    # the variant is *not* the gradient of the forward: gradcheck must notice
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    cfg = SpanConfig(alpha_q=2.0)
    assert not torch.autograd.gradcheck(
        lambda a, b, c: span_attention(a, b, c, cfg, is_causal=True), (q, k, v), raise_exception=False)


def _c1_hand(g, x, y, kind, alpha, beta):
    if kind == "c1_orthogonal":
        par = torch.einsum("bhtd,bhtd->bht", g, x)[..., None] / torch.einsum(
            "bhtd,bhtd->bht", x, x)[..., None] * x
    elif kind == "c1_oblique":
        par = torch.einsum("bhtd,bhtd->bht", g, y)[..., None] / torch.einsum(
            "bhtd,bhtd->bht", x, y)[..., None] * x
    else:  # least-squares projection onto span{x, y}
        A = torch.stack([x, y], -1)                               # (B, nh, T, hs, 2)
        par = (A @ torch.linalg.pinv(A) @ g[..., None])[..., 0]
    return alpha * par + beta * (g - par)


@pytest.mark.parametrize("cand,impl,mask", [c for c in _cases() if c[0] != "c2_constant_mode"])
def test_c1_matches_hand_formula(cand, impl, mask):
    q, k, v, do = _inputs(2)
    mk = MASKS[mask]
    _, dq, dk, dv = _grads(_sdpa(mk), q, k, v, do)
    P = _probs(q, k, mk)
    kbar = torch.einsum("bhij,bhjd->bhid", P, k)
    qbar = torch.einsum("bhij,bhid->bhjd", P, q) / P.sum(-2)[..., None]
    cfg = SpanConfig(cand, alpha_q=2.5, beta_q=0.5, alpha_k=0.0, beta_k=1.5)
    _, gq, gk, gv = _grads(_span(cfg, mk, impl), q, k, v, do)
    assert torch.allclose(gq, _c1_hand(dq, q, kbar, cand, 2.5, 0.5), atol=1e-10, rtol=0)
    assert torch.allclose(gk, _c1_hand(dk, k, qbar, cand, 0.0, 1.5), atol=1e-10, rtol=0)
    assert torch.allclose(gv, dv, atol=1e-12, rtol=0)             # dV never touched
    assert not torch.allclose(gq, dq)                             # the test can fail


@pytest.mark.parametrize("side", ["q", "k"])
def test_one_sided(side):
    q, k, v, do = _inputs(3)
    _, dq, dk, _ = _grads(_sdpa(MASKS["causal"]), q, k, v, do)
    cfg = SpanConfig(alpha_q=2.0, alpha_k=2.0, apply_q=side == "q", apply_k=side == "k")
    assert not cfg.bidirectional
    _, gq, gk, _ = _grads(_span(cfg, MASKS["causal"]), q, k, v, do)
    untouched, touched = (gk, gq) if side == "q" else (gq, gk)
    assert torch.equal(untouched, dk if side == "q" else dq)
    assert not torch.allclose(touched, dq if side == "q" else dk)


def test_oblique_violation_orthogonal_to_partner():
    q, k, v, do = _inputs(4)
    mk = MASKS["window"]
    P = _probs(q, k, mk)
    kbar = P @ k
    qbar = (P.transpose(-2, -1) @ q) / P.sum(-2)[..., None]
    cfg = SpanConfig("c1_oblique", alpha_q=0.0, alpha_k=0.0)     # keep only g⊥
    _, gq, gk, _ = _grads(_span(cfg, mk), q, k, v, do)
    _, dq, dk, _ = _grads(_sdpa(mk), q, k, v, do)
    assert (gq * kbar).sum(-1).abs().max() < 1e-12 * max(1.0, dq.abs().max().item())
    assert (gk * qbar).sum(-1).abs().max() < 1e-12 * max(1.0, dk.abs().max().item())
    par = dq - gq                                                 # g∥ must be along q_i
    cos = F.cosine_similarity(par, q, dim=-1).abs()
    assert torch.allclose(cos[par.norm(dim=-1) > 1e-9], torch.ones(()).double(), atol=1e-9)


def test_orthogonal_removal_and_first_token():
    q, k, v, do = _inputs(5)
    cfg = SpanConfig(alpha_q=0.0, alpha_k=0.0)
    _, gq, gk, _ = _grads(_span(cfg, MASKS["causal"]), q, k, v, do)
    assert (gq * q).sum(-1).abs().max() < 1e-12 and (gk * k).sum(-1).abs().max() < 1e-12
    assert gq[:, :, 0].abs().max() < 1e-12                        # dq_0 = 0 under causal (F4)


def test_first_order_span():
    q, k, v, do = _inputs(6)
    mk = MASKS["causal"]
    P = _probs(q, k, mk)
    kbar = P @ k
    cfg = SpanConfig("c1c_first_order", alpha_q=0.0)              # g⊥ ⟂ both q_i and k̄_i
    _, gq, _, _ = _grads(_span(cfg, mk), q, k, v, do)
    assert (gq * q).sum(-1).abs().max() < 1e-12 and (gq * kbar).sum(-1).abs().max() < 1e-12


def test_first_order_degenerate_partner_falls_back_to_orthogonal():
    g = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    for y in (2.0 * x, -x, x + 1e-12 * torch.randn_like(x)):
        a = split_parallel(g, x, y, "c1c_first_order")
        b = split_parallel(g, x, y, "c1_orthogonal")
        assert torch.allclose(a, b, atol=1e-9) and torch.isfinite(a).all()
    zero = torch.zeros_like(x)                                    # x = 0 -> span{y}
    assert torch.isfinite(split_parallel(g, zero, x, "c1c_first_order")).all()
    assert torch.equal(split_parallel(g, zero, x, "c1_orthogonal"), zero)


def test_oblique_clamp_keeps_sign_and_is_finite():
    x = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    g = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    for sgn in (1.0, -1.0):
        y = torch.tensor([[sgn * 1e-9, 1.0]], dtype=torch.float64)  # x·y ≈ 0
        par = split_parallel(g, x, y, "c1_oblique", eps=1e-6)
        ynorm = y.norm()
        expect = (g * y).sum() / (sgn * 1e-6 * ynorm) * x         # |x·y| clamped to eps|x||y|
        assert torch.allclose(par, expect)


def test_decomposition_algebra():
    g, x, y = (torch.randn(2, 3, 4, 5, dtype=torch.float64) for _ in range(3))
    for kind in ("c1_orthogonal", "c1_oblique", "c1c_first_order"):
        par = split_parallel(g, x, y, kind)
        again = split_parallel(par, x, y, kind)
        assert torch.allclose(again, par, atol=1e-10)             # idempotent projector


@pytest.mark.parametrize("mask", list(MASKS))
def test_c2_row_mode_adds_alpha0_tau_delta_kbar(mask):
    q, k, v, do = _inputs(7)
    mk = MASKS[mask]
    o, dq, dk, dv = _grads(_sdpa(mk), q, k, v, do)
    P = _probs(q, k, mk)
    tau = 1 / math.sqrt(HS)
    delta = (do * o).sum(-1, keepdim=True)                        # δ_i = Σ_j P_ij dP_ij
    kbar = P @ k
    a0 = 0.7
    _, gq, gk, gv = _grads(_span(SpanConfig("c2_constant_mode", alpha0=a0), mk), q, k, v, do)
    assert torch.allclose(gq, dq + a0 * tau * delta * kbar, atol=1e-12, rtol=0)
    # key side of the same dS term: dk_j += α0 τ Σ_i P_ij δ_i q_i
    assert torch.allclose(gk, dk + a0 * tau * (P * delta).transpose(-2, -1) @ q, atol=1e-12, rtol=0)
    assert torch.allclose(gv, dv, atol=1e-12, rtol=0)


def test_c2_column_mode():
    q, k, v, do = _inputs(8)
    mk = MASKS["causal"]
    _, dq, dk, _ = _grads(_sdpa(mk), q, k, v, do)
    P = _probs(q, k, mk)
    tau = 1 / math.sqrt(HS)
    dP = do @ v.transpose(-2, -1)
    dS = P * (dP - (P * dP).sum(-1, keepdim=True))
    gamma = dS.sum(-2, keepdim=True) / P.sum(-2, keepdim=True)   # (B, nh, 1, T)
    a = -0.4
    cfg = SpanConfig("c2_constant_mode", alpha0_col=a, apply_q=False)
    _, gq, gk, _ = _grads(_span(cfg, mk), q, k, v, do)
    qsum = P.transpose(-2, -1) @ q                                # Σ_i P_ij q_i
    assert torch.allclose(gk, dk + a * tau * gamma.transpose(-2, -1) * qsum, atol=1e-12, rtol=0)
    assert torch.allclose(gq, dq + a * tau * (P * gamma) @ k, atol=1e-12, rtol=0)


def test_fully_masked_row_matches_sdpa():
    q, k, v, do = _inputs(9)
    m = _window_mask().clone()
    m[3] = False                                                  # query 3 sees nothing
    ref = _grads(_sdpa(dict(attn_mask=m)), q, k, v, do)
    got = _grads(_span(SpanConfig("c1_oblique"), dict(attn_mask=m)), q, k, v, do)
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
    got = _grads(_span(SpanConfig("c1_oblique", alpha_q=2, alpha_k=2), dict(attn_mask=m)),
                 q, k, v, do)
    assert all(torch.isfinite(t).all() for t in got)


def test_autocast_bf16_cpu():
    q, k, v, do = _inputs(10, dtype=torch.float32)
    cfg = SpanConfig("c1_oblique", alpha_q=2.0)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = span_attention(qq, kk, vv, cfg, is_causal=True)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert o.dtype == torch.bfloat16 and torch.equal(o, ref)
    o.backward(do.to(o.dtype))
    assert qq.grad.dtype == torch.float32 and torch.isfinite(qq.grad).all()
    # close to the float64 variant gradient at the bf16-rounded point
    r = [t.to(torch.bfloat16).double() for t in (q, k, v)]
    _, gq, _, _ = _grads(_span(cfg, MASKS["causal"]), *r, do.to(torch.bfloat16).double())
    assert torch.allclose(qq.grad.double(), gq, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kw", [dict(candidate="c3"), dict(alpha_q=-1.0), dict(beta_k=float("nan")),
                                dict(eps=0.0), dict(eps=2.0), dict(apply_q=1), dict(alpha0="1"),
                                dict(alpha0_col=float("inf"))])
def test_invalid_config(kw):
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"SpanConfig.{name}"):
        SpanConfig(**kw)


def test_invalid_call():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="not both"):
        span_attention(q, k, v, SpanConfig(), attn_mask=_window_mask(), is_causal=True)
    with pytest.raises(ValueError, match="hook"):
        span_attention(q, k, v, SpanConfig("c1_oblique"), impl="hook")
    with pytest.raises(TypeError):
        span_attention(q, k, v, {"candidate": "c1_orthogonal"})
    with pytest.raises(ValueError, match="shape"):
        span_attention(q[0], k, v, SpanConfig())


def test_config_properties():
    assert SpanConfig().is_identity and SpanConfig().bidirectional
    assert not SpanConfig(alpha_q=2).is_identity
    assert SpanConfig(alpha_q=2, apply_q=False).is_identity
    assert SpanConfig("c2_constant_mode", alpha_q=5).is_identity  # C1 scales unused by C2
    assert not SpanConfig("c2_constant_mode", alpha0=0.1).is_identity
    hash(SpanConfig())                                            # frozen: usable as a key
