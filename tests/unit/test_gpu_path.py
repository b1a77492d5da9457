"""The GPU path, tested on CPU: dropout, vocab padding, flex parity and block masks, graph breaks."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from dyntool import attention, masks
from dyntool.errors import ConfigError
from dyntool.span import CANDIDATES, SpanConfig, span_attention
from dyntool.span import SpanConfig
from dyntool.train.config import ModelConfig
from dyntool.train.gpt import GPT

V, T = 50, 16


def make(attention="mhsa", seed=0, vocab=V, device_type="cpu", **kw):
    torch.manual_seed(seed)
    kw = {"n_layer": 2, "n_head": 4, "n_embd": 32, **kw}
    return GPT(ModelConfig(attention=attention, **kw), vocab, T, device_type=device_type)


def batch(B=3, seed=1, vocab=V, t=T):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (B, t), generator=g), torch.randint(0, vocab, (B, t), generator=g)


# ------------------------------------------------------------------------------------- dropout
def test_dropout_is_active_in_train_and_off_in_eval():
    m = make(dropout=0.3)
    ref = make(dropout=0.0)
    ref.load_state_dict(m.state_dict())
    x, y = batch()
    m.train()
    a, la = m(x, y)
    b, lb = m(x, y)
    assert not torch.equal(a, b)                     # two train-mode passes draw different masks
    assert not torch.allclose(a, ref.eval()(x)[0])
    m.eval()
    with torch.no_grad():
        c, _ = m(x)
        d, _ = m(x)
        r, _ = ref(x)
    assert torch.equal(c, d)                         # deterministic under .eval()
    assert torch.equal(c, r)                         # and exactly the dropout-free model


def test_dropout_sits_on_embedding_attention_and_mlp_outputs():
    m = make(dropout=0.25)
    ps = {n: mod.p for n, mod in m.named_modules() if isinstance(mod, torch.nn.Dropout)}
    assert ps == {"drop": 0.25, "h.0.mlp_dropout": 0.25, "h.0.attn_dropout": 0.25,
                  "h.1.mlp_dropout": 0.25, "h.1.attn_dropout": 0.25}
    assert all(mod.p == 0 for mod in make().modules() if isinstance(mod, torch.nn.Dropout))


@pytest.mark.parametrize("bad", [-0.1, 1.0])
def test_dropout_out_of_range_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="dropout"):
        ModelConfig(dropout=bad).validate("model.")


# -------------------------------------------------------------------------------- vocab padding
@pytest.mark.parametrize("tie", [True, False])
def test_vocab_padding_keeps_logits_and_loss_of_the_true_vocab(tie):
    vocab = 37
    padded = make(vocab=vocab, vocab_multiple=16, tie_weights=tie)
    plain = make(vocab=vocab, vocab_multiple=1, tie_weights=tie)
    assert padded.padded_vocab == 48 and padded.lm_head.weight.shape[0] == 48
    sd = {k: (v[:vocab] if k in ("wte.weight", "lm_head.weight") else v) for k, v in padded.state_dict().items()}
    plain.load_state_dict(sd)
    x, y = batch(vocab=vocab)
    lp, lossp = padded(x, y)
    lq, lossq = plain(x, y)
    assert lp.shape == (3, T, vocab)
    torch.testing.assert_close(lp, lq, rtol=0, atol=1e-6)
    # an independent loss: log-softmax over the true vocab only
    ref = -torch.log_softmax(lq.double(), -1).gather(-1, y[..., None]).mean()
    torch.testing.assert_close(lossp.double(), ref, rtol=1e-6, atol=1e-6)
    lossp.backward()
    assert padded.lm_head.weight.grad[vocab:].abs().max() == 0   # padding rows are never predicted


# ------------------------------------------------------------------------------ flex attention
@pytest.mark.parametrize("t,n_local,window", [(16, 3, 4), (37, 2, 5), (130, 3, 50), (200, 0, 7)])
def test_flex_forward_matches_the_manual_mask_on_cpu(t, n_local, window):
    """flex_attention's CPU forward (no grad) with our cached BlockMask vs the materialised mask."""
    kw = dict(n_local=n_local, n_global=4 - n_local, window=window)
    flex = GPT(ModelConfig(attention="ls", n_layer=2, n_head=4, n_embd=32, backend="flex", **kw), V, t,
               device_type="cuda").double().eval()          # device_type only lets flex be chosen
    manual = GPT(ModelConfig(attention="ls", n_layer=2, n_head=4, n_embd=32, backend="manual", **kw), V, t)
    manual.double().eval().load_state_dict(flex.state_dict())
    x, _ = batch(vocab=V, t=t)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # "flex_attention called without torch.compile"
        a, _ = flex(x)
        b, _ = manual(x)
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_block_mask_semantics_equal_the_dense_mask():
    m = masks.local_global(3, 1, 5)
    mm = m.mask_mod()
    h, q, k = torch.arange(4)[:, None, None], torch.arange(40)[None, :, None], torch.arange(40)[None, None, :]
    assert torch.equal(mm(torch.tensor(0), h, q, k).expand(4, 40, 40), m.dense(40, 4))
    d = m.dense(40, 4)
    assert d[0, 10, 6] and not d[0, 10, 5] and d[3, 10, 0] and not d[3, 10, 11]   # window includes self


def test_block_masks_are_cached_and_shared_by_layers():
    attention._BLOCK_MASKS.clear()
    m = masks.local_global(3, 1, 5)
    a = attention.block_mask(m, 4, 33, "cpu")
    assert attention.block_mask(m, 4, 33, "cpu") is a
    assert attention.block_mask(masks.local_global(3, 1, 5), 4, 33, "cpu") is a   # same mask by value
    assert attention.block_mask(m, 4, 34, "cpu") is not a
    assert attention.block_mask(masks.local_global(3, 1, 6), 4, 33, "cpu") is not a


def test_flex_refuses_to_train_on_cpu_with_a_clear_message():
    with pytest.raises(ConfigError, match="flex needs CUDA"):
        make("ls", backend="flex")
    m = make("ls", backend="flex", device_type="cuda")
    with pytest.raises(ValueError, match="no CPU backward"):
        m(batch()[0])


def _graph_breaks(fn, *args) -> int:
    import torch._dynamo as dynamo
    dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dynamo.explain(fn)(*args).graph_break_count


@pytest.mark.slow
def test_flex_gpt_traces_without_graph_breaks():
    attention._BLOCK_MASKS.clear()                  # the block mask is built inside the trace
    m = make("ls", backend="flex", device_type="cuda", n_local=3, n_global=1, window=5).eval()
    with torch.no_grad():
        assert _graph_breaks(m, batch()[0]) == 0


# ------------------------------------------------------------------------- span under compile
@pytest.mark.parametrize("cand", CANDIDATES)
@pytest.mark.parametrize("mask", ["window", pytest.param("causal", marks=pytest.mark.slow)])
def test_span_compiles_fullgraph_forward_and_backward(cand, mask):
    """fullgraph=True raises on any graph break (a class built in a traced call, a host sync in the
    backward); the compiled gradients must equal the eager ones."""
    import torch._dynamo as dynamo
    cfg = SpanConfig(cand, alpha_q=2.0, beta_q=0.5, alpha_k=1.5, alpha0=0.5, alpha0_col=0.3)
    kw = dict(is_causal=True) if mask == "causal" else dict(attn_mask=masks.sliding_window(3).dense(9)[0])

    def f(q, k, v):
        return span_attention(q, k, v, cfg, scale=0.3, **kw)
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(4))
    dynamo.reset()
    outs = []
    for fn in (f, torch.compile(f, backend="aot_eager", fullgraph=True)):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            o = fn(qq, kk, vv)
        outs.append((o,) + torch.autograd.grad(o, (qq, kk, vv), do))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("cand", ["c1_oblique", "c2_constant_mode"])
def test_span_gpt_compiles_without_graph_breaks(cand):
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    m = GPT(ModelConfig(attention="span", n_layer=2, n_head=4, n_embd=32), V, T,
            span=SpanConfig(candidate=cand, alpha_q=2.0, alpha_k=2.0, alpha0=0.5))
    counters.clear()
    torch._dynamo.reset()
    x, y = batch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, loss = torch.compile(m, backend="aot_eager")(x, y)
    loss.backward()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert all(p.grad is not None for p in m.parameters())


# ----------------------------------------------------------------------------- fused grad norm
def test_group_grad_norms_equal_per_parameter_norms_in_float64():
    from dyntool.train.gpt import group_grad_norms
    m = make("mhsa")
    x, y = batch()
    m(x, y)[1].backward()
    groups = m.grad_groups()
    groups["no_grad"] = [torch.nn.Parameter(torch.ones(3))]        # never gets a gradient
    got = group_grad_norms(groups)
    assert "no_grad" not in got and set(got) == set(m.grad_groups())
    for name, ps in m.grad_groups().items():
        ref = sum(float((p.grad.double() ** 2).sum()) for p in ps) ** 0.5
        assert abs(float(got[name]) - ref) <= 1e-5 * ref
