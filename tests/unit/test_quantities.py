"""Recorded gradient quantities vs an independent autograd computation (float64).

The reference re-implements attention functionally with q, k, v, S, α and the head output y as
autograd leaves/intermediates, so every recorded quantity is checked against
``torch.autograd.grad`` rather than against our own formulas.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from dyntool import masks
from dyntool.attention import CausalSelfAttention, SingleHeadAttention
from dyntool.capture import Capture, CaptureError
from dyntool.quantities import head_quantities

TOL = dict(rtol=1e-9, atol=1e-11)


pytestmark = pytest.mark.usefixtures("float64_default")     # tests/conftest.py


def reference_grads(q, k, v, allowed, downstream):
    """Autograd reference: grads of loss wrt q, k, v, S (pre-softmax), α and y = αV."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~allowed, float("-inf"))
    s.retain_grad()
    a = torch.softmax(s, -1)
    a.retain_grad()
    y = a @ v
    y.retain_grad()
    loss = downstream(y)
    loss.backward()
    return dict(q=q.grad, k=k.grad, v=v.grad, s=s.grad, a=a.grad, y=y.grad, attn=a.detach())


def _check_against_reference(got, ref, allowed):
    torch.testing.assert_close(got["upstream"], ref["y"], **TOL)
    torch.testing.assert_close(got["attn"], ref["attn"], **TOL)
    # B = ∂L/∂α on the allowed entries
    torch.testing.assert_close(got["compat"], ref["a"].masked_fill(~allowed, 0.0), **TOL)
    torch.testing.assert_close(got["score_grad"], ref["s"].masked_fill(~allowed, 0.0), **TOL)
    torch.testing.assert_close(got["value_grad"], ref["v"], **TOL)
    torch.testing.assert_close(got["query_grad"], ref["q"], **TOL)
    torch.testing.assert_close(got["key_grad"], ref["k"], **TOL)


@pytest.mark.parametrize("mask", [masks.causal(), masks.sliding_window(3), masks.full(),
                                  masks.local_global(2, 1, 2)], ids=lambda m: m.name)
def test_head_quantities_match_autograd(mask):
    g = torch.Generator().manual_seed(0)
    B, H, T, dk, dv = 2, 3, 7, 4, 5
    q, k = torch.randn(B, H, T, dk, generator=g), torch.randn(B, H, T, dk, generator=g)
    v = torch.randn(B, H, T, dv, generator=g)
    W = torch.randn(H * dv, 6, generator=g)
    target = torch.randint(6, (B, T), generator=g)
    allowed = mask.dense(T, H)                                     # (nh|1, T, T)

    def downstream(y):
        logits = y.transpose(1, 2).reshape(B, T, H * dv) @ W
        return F.cross_entropy(logits.reshape(-1, 6), target.reshape(-1))

    ref = reference_grads(q, k, v, allowed, downstream)
    got = head_quantities(q, k, v, ref["y"], allowed)
    _check_against_reference(got, ref, allowed.expand(B, H, T, T))
    # advantage sign convention: A = E_α[b] − b, so ∂L/∂S = −α ⊙ A
    torch.testing.assert_close(-got["attn"] * got["advantage"], got["score_grad"], **TOL)
    # zero-sum routing: each row of the score gradient sums to 0
    assert got["score_grad"].sum(-1).abs().max() < 1e-12


def test_score_grad_matches_finite_differences():
    g = torch.Generator().manual_seed(1)
    T, d = 4, 3
    q, k, v = (torch.randn(1, 1, T, d, generator=g) for _ in range(3))
    w = torch.randn(T, d, generator=g)
    allowed = masks.causal().dense(T)
    scale = 1 / math.sqrt(d)

    def loss_from_scores(s):
        a = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
        return ((a @ v)[0, 0] * w).sum() ** 2

    s0 = (q @ k.transpose(-1, -2)) * scale
    y = torch.softmax(s0.masked_fill(~allowed, float("-inf")), -1) @ v
    u = 2 * ((y[0, 0] * w).sum()) * w                              # ∂L/∂y by hand
    got = head_quantities(q, k, v, u.view(1, 1, T, d), allowed)["score_grad"][0, 0]
    eps = 1e-6
    for i in range(T):
        for j in range(i + 1):
            sp, sm = s0.clone(), s0.clone()
            sp[0, 0, i, j] += eps
            sm[0, 0, i, j] -= eps
            fd = (loss_from_scores(sp) - loss_from_scores(sm)) / (2 * eps)
            assert abs(fd.item() - got[i, j].item()) < 1e-7, (i, j)


def _mhsa_reference(m: CausalSelfAttention, x, target, W_out):
    """Functional re-implementation of CausalSelfAttention → per-head reference grads."""
    B, T, C = x.shape
    nh = m.n_head
    qkv = x @ m.c_attn.weight.T
    q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in qkv.split(C, dim=2))

    def downstream(y):
        out = y.transpose(1, 2).reshape(B, T, C) @ m.c_proj.weight.T
        return F.cross_entropy((out @ W_out).reshape(B * T, -1), target.reshape(-1))

    return reference_grads(q, k, v, m.core.mask.dense(T, nh), downstream)


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
@pytest.mark.parametrize("mask", [masks.causal(), masks.local_global(2, 2, 3)], ids=lambda m: m.name)
def test_capture_multihead_matches_autograd(backend, mask):
    torch.manual_seed(0)
    B, T, C, nh = 3, 9, 16, 4
    m = CausalSelfAttention(C, nh, mask=mask, backend=backend)
    x = torch.randn(B, T, C)
    W_out = torch.randn(C, 5)
    target = torch.randint(5, (B, T))
    with Capture(m) as cap:
        loss = F.cross_entropy((m(x) @ W_out).reshape(B * T, -1), target.reshape(-1))
        loss.backward()
    got = cap.compute()
    ref = _mhsa_reference(m, x, target, W_out)
    # capture layout is (layer, head, seq, ...) ; reference is (seq, head, ...)
    got = {k: v[0].transpose(0, 1) if v.dim() >= 4 else v for k, v in got.items()}
    allowed = mask.dense(T, nh).unsqueeze(0).expand(B, nh, T, T)
    _check_against_reference(got, ref, allowed)
    if backend == "manual":
        assert got["routing_residual"].max() < 1e-12     # autograd ∂L/∂S == α ⊙ (B − E_α[b])
    else:
        assert "routing_residual" not in got


def test_sdpa_recording_equals_manual_recording():
    torch.manual_seed(3)
    mask = masks.local_global(1, 3, 4)
    x = torch.randn(2, 11, 24)
    recs = {}
    for backend in ("manual", "sdpa"):
        torch.manual_seed(5)
        m = CausalSelfAttention(24, 4, mask=mask, backend=backend)
        with Capture(m) as cap:
            m(x).pow(2).mean().backward()
        recs[backend] = cap.compute()
    for name, val in recs["sdpa"].items():
        torch.testing.assert_close(val, recs["manual"][name], rtol=1e-9, atol=1e-12, equal_nan=True, msg=name)


def test_single_head_capture_matches_autograd_batch():
    torch.manual_seed(0)
    B, T, dx, dk, dv, C = 3, 8, 6, 4, 5, 3
    m = SingleHeadAttention(dx, dk, dv, C, mask=masks.causal(), backend="manual")
    x = torch.randn(B, T, dx)
    y = torch.randint(C, (B, T))
    with Capture(m) as cap:
        F.cross_entropy(m(x).reshape(-1, C), y.reshape(-1)).backward()
    got = {k: v[0].transpose(0, 1) if v.dim() >= 4 else v for k, v in cap.compute().items()}
    q, k, v = (x @ m.W_Q).unsqueeze(1), (x @ m.W_K).unsqueeze(1), (x @ m.W_V).unsqueeze(1)
    ref = reference_grads(q, k, v, masks.causal().dense(T),
                          lambda g: F.cross_entropy((g.squeeze(1) @ m.W_O).reshape(-1, C), y.reshape(-1)))
    _check_against_reference(got, ref, masks.causal().dense(T).expand(B, 1, T, T))
    # closed form of the output layer: U = (P − Y) W_Oᵀ / N
    p = torch.softmax(m(x), -1).detach()
    u_closed = (p - F.one_hot(y, C)) @ m.W_O.detach().T / (B * T)
    torch.testing.assert_close(got["upstream"][:, 0], u_closed, **TOL)


def test_grad_scale_is_divided_out():
    """Gradient accumulation scales the loss by 1/accum; the recorded U must not be biased."""
    torch.manual_seed(0)
    m = CausalSelfAttention(8, 2, backend="sdpa")
    x = torch.randn(1, 5, 8)
    out = {}
    for scale in (1.0, 0.25):
        with Capture(m, grad_scale=scale) as cap:
            (m(x).pow(2).sum() * scale).backward()
        out[scale] = cap.compute()["upstream"]
        m.zero_grad()
    torch.testing.assert_close(out[0.25], out[1.0], **TOL)


def test_missing_backward_raises_and_hooks_are_removed():
    m = CausalSelfAttention(8, 2)
    x = torch.randn(1, 4, 8)
    with Capture(m) as cap:
        y = m(x)
    with pytest.raises(CaptureError, match="hook never fired"):
        cap.compute()
    assert m.core._capture is None
    y.sum().backward()            # hooks gone: backward after exit must not touch the capture
    assert all(s.u is None for s in cap.slots.values())


def test_entropy_and_logit_stats_closed_form():
    T = 6
    allowed = masks.causal().dense(T)
    q = torch.zeros(1, 1, T, 2)                                   # all scores 0 → uniform rows
    k = torch.randn(1, 1, T, 2)
    v = torch.randn(1, 1, T, 3)
    got = head_quantities(q, k, v, torch.randn(1, 1, T, 3), allowed)
    support = torch.arange(1, T + 1, dtype=torch.float64)
    torch.testing.assert_close(got["attn_entropy"][0, 0], torch.log(support))
    torch.testing.assert_close(got["attn_entropy_norm"][0, 0, 1:], torch.ones(T - 1))
    torch.testing.assert_close(got["column_usage"][0, 0], (1 / support).flip(0).cumsum(0).flip(0))
    assert got["logit_max"].item() == 0.0


def test_span_records_the_gradients_it_applies():
    """A replacement backward (span) rescales dQ/dK: the record holds the applied ones."""
    from dyntool.attention import AttentionCore
    from dyntool.span import SpanConfig, span_attention
    torch.manual_seed(0)
    core = AttentionCore(masks.causal(), n_head=2)
    cfg = SpanConfig(alpha_q=2.0, beta_q=0.5, alpha_k=1.5, beta_k=0.25)
    core.attend_fn = lambda q, k, v, mask_args, scale: span_attention(q, k, v, cfg, scale=scale, **mask_args)
    q, k, v = (torch.randn(2, 2, 6, 4, requires_grad=True) for _ in range(3))
    W = torch.randn(4, 3)
    with Capture(core) as cap:
        (core.attend(q, k, v) @ W).pow(2).sum().backward()
    got = cap.compute()
    assert cap.attrs["qk_grads"] == "applied"
    torch.testing.assert_close(got["query_grad"][0].transpose(0, 1), q.grad, **TOL)
    torch.testing.assert_close(got["key_grad"][0].transpose(0, 1), k.grad, **TOL)
    torch.testing.assert_close(got["value_grad"][0].transpose(0, 1), v.grad, **TOL)   # dV untouched
    std = head_quantities(q.detach(), k.detach(), v.detach(), got["upstream"][0].transpose(0, 1),
                          masks.causal().dense(6))
    assert not torch.allclose(std["query_grad"], q.grad)          # the standard dQ differs
