"""The GPT of dyntool.train: shapes, parameter parity, LS masks, span identity, qknorm, logit stat."""
from __future__ import annotations

import pytest
import torch

from dyntool.capture import Capture
from dyntool.span import CANDIDATES
from dyntool.span import SpanConfig
from dyntool.train.config import ModelConfig
from dyntool.train.gpt import GPT
from dyntool.train.recording import logit_absmax, logit_bound

V, T = 50, 16


def make(attention="mhsa", dtype=torch.float32, span=None, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(attention=attention, n_layer=2, n_head=4, n_embd=32, **kw)
    return GPT(cfg, V, T, span=span).to(dtype)


def batch(B=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


@pytest.mark.parametrize("attention", ["mhsa", "ls", "span", "qknorm"])
def test_forward_shapes_and_loss(attention):
    m = make(attention, n_local=3, n_global=1, window=4)
    x, y = batch()
    logits, loss = m(x, y)
    assert logits.shape == (3, T, V)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())
    assert [b.attn.core.layer_index for b in m.h] == [0, 1]


def test_ls_has_the_parameters_of_mhsa():
    a, b = make("mhsa"), make("ls", n_local=3, n_global=1, window=4)
    assert a.num_params() == b.num_params()
    assert [(n, p.shape) for n, p in a.named_parameters()] == [(n, p.shape) for n, p in b.named_parameters()]


def test_qknorm_runs_and_normalises():
    m = make("qknorm")
    assert m.h[0].attn.q_norm is not None and m.h[0].attn.k_norm is not None
    x, y = batch()
    _, loss = m(x, y)
    loss.backward()
    assert m.h[0].attn.q_norm.weight.grad is not None
    assert make("qknorm").num_params() > make("mhsa").num_params()


@pytest.mark.parametrize("n_global", [1, 0])
def test_ls_local_heads_zero_outside_window(n_global):
    p = 4
    m = make("ls", backend="manual", n_local=4 - n_global, n_global=n_global, window=p)
    x, y = batch()
    with Capture(m) as cap:
        _, loss = m(x, y)
        loss.backward()
    attn = cap.compute()["attn"]                                   # (L, nh, S, T, T)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    inside = (i - j >= 0) & (i - j < p)                            # keys i-p+1 .. i
    n_local = 4 - n_global
    local = attn[:, :n_local]
    assert (local[..., ~inside] == 0).all()
    assert (local[..., inside] > 0).all()
    torch.testing.assert_close(attn.sum(-1), torch.ones_like(attn.sum(-1)))
    if n_global:
        glob = attn[:, n_local:]
        assert (glob[..., j > i] == 0).all()
        assert (glob[..., (j <= i) & ~inside] > 0).all()           # global heads see beyond the window


def _grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("candidate", CANDIDATES)
def test_span_identity_scales_equal_mhsa(candidate):
    """All scales 1: forward bitwise equal, gradients equal (float64) - eager recompute backward."""
    x, y = batch()
    base = make("mhsa", torch.float64)
    span = make("span", torch.float64, span=SpanConfig(candidate=candidate, impl="eager"))
    span.load_state_dict(base.state_dict())
    lb, loss_b = base(x, y)
    ls, loss_s = span(x, y)
    assert torch.equal(lb, ls) and torch.equal(loss_b, loss_s)
    loss_b.backward()
    loss_s.backward()
    gb, gs = _grads(base), _grads(span)
    for n in gb:
        torch.testing.assert_close(gs[n], gb[n], rtol=1e-12, atol=1e-14, msg=n)


def test_span_rescaling_changes_only_the_backward():
    x, y = batch()
    base = make("mhsa")
    span = make("span", span=SpanConfig(alpha_q=2.0, alpha_k=2.0, beta_q=0.5, beta_k=0.5))
    span.load_state_dict(base.state_dict())
    lb, loss_b = base(x, y)
    ls, loss_s = span(x, y)
    assert torch.equal(lb, ls)
    loss_b.backward()
    loss_s.backward()
    gb, gs = _grads(base), _grads(span)
    assert not torch.allclose(gb["h.0.attn.c_attn.weight"], gs["h.0.attn.c_attn.weight"])
    for n in ("ln_f.weight", "h.1.mlp.c_fc.weight"):               # above the last attention: unchanged
        torch.testing.assert_close(gb[n], gs[n])


@pytest.mark.parametrize("attention", ["mhsa", "ls", "qknorm"])
def test_logit_stat_matches_dense_scores(attention):
    m = make(attention, torch.float64, backend="manual", n_local=3, n_global=1, window=4)
    m.track_qk(True)
    x, y = batch()
    with Capture(m) as cap:
        _, loss = m(x, y)
        loss.backward()
    scores = cap.compute()["scores"]                               # (L, nh, S, T, T), NaN off-mask
    dense = scores.abs().nan_to_num(0.0).amax(dim=(2, 3, 4))       # (L, nh)
    for layer, blk in enumerate(m.h):
        q, k = blk.last_qk()
        allowed = blk.attn.core.allowed(T, q.device)
        scale = q.shape[-1] ** -0.5
        got = logit_absmax(q, k, allowed, scale, chunk=5)
        torch.testing.assert_close(got, dense[layer])
        assert (logit_bound(q, k, scale) >= got - 1e-12).all()


def test_track_qk_off_keeps_nothing():
    m = make()
    x, y = batch()
    m(x, y)
    assert all(b.last_qk() is None for b in m.h)
