"""torch's nn.MultiheadAttention / nn.TransformerEncoder / nn.TransformerDecoder, found
automatically: recorded quantities vs an independent float64 autograd reference.

The reference swaps each MultiheadAttention's forward for a materialised one built from the same
weights (q, k, v, scores, α, per-head output o keep their gradients) and checks first that it
reproduces the module's own output, so it cannot drift from what torch computes."""
import pytest
import torch
import torch.nn as nn

from dyntool.capture import Capture, CaptureError

from .reference import check, per_layer

E, NH = 8, 2


pytestmark = pytest.mark.usefixtures("float64_default")     # tests/conftest.py


def _ref_forward(m, store):
    """A materialised nn.MultiheadAttention forward keeping every intermediate (float64)."""
    def forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        bf = m.batch_first
        q_in, k_in, v_in = (t if bf else t.transpose(0, 1) for t in (query, key, value))
        B, T, Tk, hd = q_in.shape[0], q_in.shape[1], k_in.shape[1], E // NH
        if m._qkv_same_embed_dim:
            ws = m.in_proj_weight.split(E)
        else:
            ws = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
        bs = m.in_proj_bias.split(E) if m.in_proj_bias is not None else (None,) * 3
        q, k, v = (torch.nn.functional.linear(x, w, b).view(B, -1, NH, hd).transpose(1, 2)
                   for x, w, b in zip((q_in, k_in, v_in), ws, bs))
        for t in (q, k, v):
            t.retain_grad()
        s = q @ k.transpose(-1, -2) / hd ** 0.5
        add = torch.zeros(B, NH, T, Tk)
        if attn_mask is None and is_causal:
            attn_mask = torch.ones(T, Tk, dtype=torch.bool).tril().logical_not()
        for mask, pad in ((attn_mask, False), (key_padding_mask, True)):
            if mask is None:
                continue
            mask = mask[:, None, None, :] if pad else (mask if mask.dim() == 2 else mask.view(B, NH, T, Tk))
            add = add + (torch.zeros(mask.shape).masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else mask)
        s = s + add
        s.retain_grad()
        a = torch.softmax(s, -1)
        a.retain_grad()
        o = a @ v
        o.retain_grad()
        y = m.out_proj(o.transpose(1, 2).reshape(B, T, E))
        store.append(dict(q=q, k=k, v=v, s=s, a=a, y=o, allowed=torch.isfinite(add)))
        return (y if bf else y.transpose(0, 1)), None
    return forward


def _compare(model, run, n_sites):
    """Record ``run(model)`` (a loss) with Capture, then the reference; compare every site."""
    with Capture(model) as cap:
        loss = run(model)
        loss.backward()
    model.zero_grad()
    got = cap.compute()
    mhas = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    store: list = []
    for m in mhas:
        m.forward = _ref_forward(m, store)
    try:
        ref_loss = run(model)
        ref_loss.backward()
    finally:
        for m in mhas:
            del m.forward
    torch.testing.assert_close(ref_loss, loss, rtol=1e-10, atol=1e-12)      # the reference is the module
    assert len(store) == n_sites == got["attn"].shape[0]
    for i, r in enumerate(store):
        T, Tk = r["a"].shape[-2:]
        layer = {n: x for n, x in per_layer(got, i).items()}
        layer = {n: _crop(n, x, T, Tk) for n, x in layer.items()}
        check(layer, dict(attn=r["a"].detach(), attn_grad=r["a"].grad, scores_grad=r["s"].grad, y_grad=r["y"].grad,
                          q_grad=r["q"].grad, k_grad=r["k"].grad, v_grad=r["v"].grad), r["allowed"], name=f"site {i}")
    return got, cap.attrs


def _crop(name, x, T, Tk):
    from dyntool.record import names
    for axis, d in enumerate(names.DIMS.get(name, ())[3:]):
        n = T if d == "query" else Tk if d == "key" else None
        if n is not None:
            x = x.narrow(2 + axis, 0, n)
    return x


def _sharpen(model, factor=4.0):
    with torch.no_grad():                      # trained-size logits: scale the q/k projections
        for m in model.modules():
            if isinstance(m, nn.MultiheadAttention):
                w = m.in_proj_weight if m._qkv_same_embed_dim else None
                if w is not None:
                    w[: 2 * E].mul_(factor)
                else:
                    m.q_proj_weight.mul_(factor)
                    m.k_proj_weight.mul_(factor)


@pytest.mark.parametrize("batch_first", [True, False])
def test_transformer_encoder_with_padding(batch_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, NH, dim_feedforward=16, dropout=0.0, batch_first=batch_first)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    _sharpen(model)
    x = torch.randn(2, 6, E)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True                                          # True = ignore (torch's convention)

    def run(m):
        inp = x if batch_first else x.transpose(0, 1)
        return m(inp, src_key_padding_mask=pad).pow(2).mean()
    got, attrs = _compare(model, run, 2)
    assert attrs["adapter"] == "torch-mha"
    assert [s["name"] for s in attrs["sites"]] == ["layers.0.self_attn", "layers.1.self_attn"]
    assert (got["attn"][:, :, 1, :, 4:] == 0).all()            # padded keys never attended
    assert float(got["logit_max"].max()) >= 10


def test_transformer_decoder_self_and_cross_with_other_source_length():
    torch.manual_seed(1)
    layer = nn.TransformerDecoderLayer(E, NH, dim_feedforward=16, dropout=0.0, batch_first=True)
    model = nn.TransformerDecoder(layer, num_layers=1).eval()
    _sharpen(model)
    tgt, memory = torch.randn(2, 5, E), torch.randn(2, 7, E)
    causal = nn.Transformer.generate_square_subsequent_mask(5)   # float, −inf above the diagonal

    def run(m):
        return m(tgt, memory, tgt_mask=causal, tgt_is_causal=True).pow(2).mean()
    got, attrs = _compare(model, run, 2)
    kinds = [(s["kind"], s["stack"], s["T"], s["Tk"]) for s in attrs["sites"]]
    assert kinds == [("self", "decoder", 5, 5), ("cross", "decoder", 5, 7)]
    a_self = got["attn"][0, :, :, :5, :5]
    assert (a_self.triu(1) == 0).all()                          # causal


@pytest.mark.parametrize("need_weights", [True, False])
def test_bare_multihead_attention_kdim_vdim_and_float_mask(need_weights):
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(E, NH, kdim=5, vdim=3, batch_first=True)
    _sharpen(mha)
    q, k, v = torch.randn(2, 4, E), torch.randn(2, 6, 5), torch.randn(2, 6, 3)
    bias = torch.linspace(-1, 1, 6).expand(4, 6).clone()        # a float attn_mask is a score bias
    bias[0, 5] = float("-inf")

    def run(m):
        return m(q, k, v, attn_mask=bias, need_weights=need_weights)[0].pow(2).mean()
    got, attrs = _compare(mha, run, 1)
    assert attrs["score_modifiers"] == ["bias"]


def test_add_bias_kv_is_refused_at_enter():
    mha = nn.MultiheadAttention(E, NH, add_bias_kv=True)
    with pytest.raises(CaptureError, match="add_bias_kv") as e:
        with Capture(mha):
            pass
    assert "\n" not in str(e.value)


def test_non_recording_steps_are_untouched():
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(E, NH, batch_first=True)
    x = torch.randn(1, 3, E)
    with Capture(mha) as cap:
        mha(x, x, x)[0].sum().backward()
    assert cap.compute()["attn"].shape[0] == 1
    assert not mha._forward_hooks and not mha._forward_hooks_with_kwargs
