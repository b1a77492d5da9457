"""Score modifiers and fully masked rows in dyntool.quantities, and the capture self-check.

Reference: autograd in float64 through an independent materialised attention
(``c·tanh(τ q·k / c) + bias``, a sink logit in the denominator, SDPA's zero rows or an additive
mask's uniform rows), at trained-size logits (max |τ q·k| ≥ 20)."""
import pytest
import torch

from dyntool.quantities import head_quantities
from dyntool.selfcheck import SelfCheckError, verify

T, D = 6, 4


def _inputs(seed=0, size=30.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, T, D, generator=g, dtype=torch.float64) for _ in range(3))
    s = q @ k.transpose(-1, -2) * D ** -0.5
    q = q * (size / s.abs().max())                  # trained-size logits: max |τ q·k| = size
    u = torch.randn(2, 3, T, D, generator=g, dtype=torch.float64)
    return q, k, v, u


def _reference(q, k, v, u, allowed, softcap=None, bias=None, sinks=None, rows="zero"):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) * D ** -0.5
    s = softcap * torch.tanh(logits / softcap) if softcap else logits
    if bias is not None:
        s = s + bias
    s.retain_grad()
    empty = ~allowed.any(-1, keepdim=True)
    if rows == "uniform":                           # eager's additive mask, literally: s + min
        s_in = s + torch.zeros_like(s).masked_fill(~allowed, torch.finfo(s.dtype).min)
    else:
        s_in = s.masked_fill(~allowed, float("-inf")).masked_fill(empty, 0.0)
    if sinks is not None:
        p = torch.softmax(torch.cat([s_in, sinks.expand(*s.shape[:-1], 1)], -1), -1)
        a = p[..., :-1]
    else:
        a = torch.softmax(s_in, -1)
    if rows == "zero":
        a = a * ~empty
    a.retain_grad()
    o = a @ v
    o.backward(u)
    return dict(attn=a.detach(), score_grad=s.grad, compat_grad=a.grad, q=q.grad, k=k.grad, v=v.grad, out=o.detach())


CASES = {
    "softcap": dict(softcap=10.0),
    "bias": dict(bias=torch.linspace(-3, 3, T, dtype=torch.float64).view(1, 1, 1, T).expand(1, 3, T, T)),
    "sinks": dict(sinks=torch.tensor([0.5, 2.0, 4.0], dtype=torch.float64).view(1, 3, 1, 1)),
    "all": dict(softcap=15.0, bias=torch.full((1, 1, T, T), 0.7, dtype=torch.float64),
                sinks=torch.tensor([1.0, -1.0, 3.0], dtype=torch.float64).view(1, 3, 1, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_modifiers_match_autograd_at_trained_size(name):
    q, k, v, u = _inputs()
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    mods = CASES[name]
    ref = _reference(q, k, v, u, allowed, **mods)
    got = head_quantities(q, k, v, u, allowed, D ** -0.5, **mods)
    assert float(got["logit_max"].max()) >= 20
    tol = dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got["attn"], ref["attn"], **tol)
    torch.testing.assert_close(got["compat"], ref["compat_grad"].masked_fill(~allowed, 0), **tol)
    torch.testing.assert_close(got["score_grad"], ref["score_grad"].masked_fill(~allowed, 0), **tol)
    torch.testing.assert_close(got["query_grad"], ref["q"], **tol)
    torch.testing.assert_close(got["key_grad"], ref["k"], **tol)
    torch.testing.assert_close(got["value_grad"], ref["v"], **tol)
    if "sinks" in mods:
        torch.testing.assert_close(got["attn"].sum(-1) + got["sink_mass"], torch.ones(2, 3, T, dtype=torch.float64))
    # the self-check accepts the true output with the modifiers, refuses it without them
    verify(q, k, v, ref["out"], allowed, D ** -0.5, mods.get("bias"), mods.get("softcap"), mods.get("sinks"),
           what="layer 0")
    with pytest.raises(SelfCheckError, match="layer 0: .*does not reproduce"):
        verify(q, k, v, ref["out"], allowed, D ** -0.5, what="layer 0")


@pytest.mark.parametrize("rows", ["zero", "uniform"])
def test_fully_masked_rows_follow_the_attention_and_are_exact(rows):
    q, k, v, u = _inputs(1)
    allowed = torch.ones(T, T, dtype=torch.bool).tril().expand(2, 1, T, T).clone()
    allowed[1, :, :, :2] = False                      # left padding: rows 0, 1 of sequence 1 see nothing
    ref = _reference(q, k, v, u, allowed, rows=rows)
    uniform = verify(q, k, v, ref["out"], allowed, D ** -0.5, what="layer 0")
    assert (uniform is not None) == (rows == "uniform")
    got = head_quantities(q, k, v, u, allowed, D ** -0.5, uniform_rows=uniform)
    tol = dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got["attn"], ref["attn"], **tol)
    torch.testing.assert_close(got["query_grad"], ref["q"], **tol)
    torch.testing.assert_close(got["key_grad"], ref["k"], **tol)
    torch.testing.assert_close(got["value_grad"], ref["v"], **tol)
    if rows == "zero":
        assert (got["attn"][1, :, :2] == 0).all() and (got["query_grad"][1, :, :2] == 0).all()


def test_a_diverged_output_is_recorded_not_refused():
    q, k, v, u = _inputs()
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    out = _reference(q, k, v, u, allowed)["out"]
    out[0, 0, 3] = float("nan")                        # the model's own activations went non-finite
    verify(q, k, v, out, allowed, D ** -0.5, what="layer 0")
    out[0, 1] += 1.0                                   # ... but a finite mismatch is still refused
    with pytest.raises(SelfCheckError):
        verify(q, k, v, out, allowed, D ** -0.5, what="layer 0")
