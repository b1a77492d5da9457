"""Hugging Face adapter: recorded quantities vs autograd on the model's own tensors (float64).

The reference run registers its own attention function (a materialised softmax whose q, k, v,
scores, α and output y keep their gradients) in transformers' registry; GPT-2 is also checked
against HF's own eager attention with ``output_attentions`` (∂L/∂α = B directly).
"""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")
from transformers.masking_utils import AttentionMaskInterface, eager_mask  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

from dyntool.capture import Capture  # noqa: E402
from dyntool.observe import allowed_from  # noqa: E402

from .reference import TOL, check, per_layer  # noqa: E402

V, T = 61, 7
REF: dict = {}


def _ref_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    n_rep = query.shape[1] // key.shape[1]
    for t in (query, key, value):
        t.retain_grad()
    k, v = key.repeat_interleave(n_rep, 1), value.repeat_interleave(n_rep, 1)
    s = query @ k.transpose(-1, -2) * scaling
    if attention_mask is not None:
        s = s + attention_mask
    s.retain_grad()
    a = torch.softmax(s, -1)
    a.retain_grad()
    y = a @ v
    y.retain_grad()
    REF[module.layer_idx] = dict(q=query, k=key, v=value, s=s, a=a, y=y, mask=attention_mask)
    return y.transpose(1, 2), a


AttentionInterface.register("ref_test", _ref_attention)
AttentionMaskInterface.register("ref_test", eager_mask)


def _cfg(kind):
    tiny = dict(vocab_size=V, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    if kind == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=16, attn_pdrop=0.0,
                                       resid_pdrop=0.0, embd_pdrop=0.0, **tiny)
    llama = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                 intermediate_size=48, max_position_embeddings=32, **tiny)
    if kind == "llama":
        return transformers.LlamaConfig(**llama)
    if kind == "mistral":
        return transformers.MistralConfig(sliding_window=3, **llama)
    if kind == "qwen2":
        return transformers.Qwen2Config(use_sliding_window=True, sliding_window=3, max_window_layers=1,
                                        layer_types=["full_attention", "sliding_attention"], **llama)
    raise ValueError(kind)


def _model(kind, impl):
    torch.manual_seed(0)
    cfg = _cfg(kind)
    cfg._attn_implementation = impl
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float64).eval()


def _batch(pad: bool):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, V, (2, T), generator=g)
    mask = torch.ones(2, T, dtype=torch.long)
    if pad:
        mask[1, 5:] = 0                                  # right padding of the second sequence
    labels = x.masked_fill(mask == 0, -100)
    return x, mask, labels


def _record(model, x, mask, labels):
    with Capture(model) as cap:
        model(x, attention_mask=mask, labels=labels).loss.backward()
    model.zero_grad()
    return cap.compute(), cap.attrs


def _reference(model, x, mask, labels):
    REF.clear()
    impl = model.config._attn_implementation
    model.config._attn_implementation = "ref_test"
    try:
        model(x, attention_mask=mask, labels=labels).loss.backward()
    finally:
        model.config._attn_implementation = impl
        model.zero_grad()
    out = {}
    for l, r in REF.items():
        out[l] = dict(attn=r["a"].detach(), attn_grad=r["a"].grad, scores_grad=r["s"].grad, y_grad=r["y"].grad,
                      q_grad=r["q"].grad, k_grad=r["k"].grad, v_grad=r["v"].grad,
                      allowed=allowed_from(r["mask"], T, T))
    return out


CASES = [("gpt2", False), ("llama", True), ("mistral", False), ("qwen2", True)]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("kind,pad", CASES, ids=[c[0] for c in CASES])
def test_hf_recording_matches_autograd(kind, pad, impl):
    model = _model(kind, impl)
    x, mask, labels = _batch(pad)
    got, attrs = _record(model, x, mask, labels)
    assert model.config._attn_implementation == impl        # restored on exit
    ref = _reference(model, x, mask, labels)
    n_kv = None if kind == "gpt2" else 2
    assert attrs["adapter"] == "hf" and attrs["attn_implementation"] == impl
    if n_kv:
        assert attrs["kv_head"] == [0, 0, 1, 1]
    for l, r in ref.items():
        check(per_layer(got, l), r, r["allowed"], n_kv, name=f"{kind} L{l}")
    if kind in ("mistral", "qwen2"):                          # the window really is in the record
        a = got["attn"][-1, 0, 0]                              # last layer is sliding in both
        assert (a[6, :4] == 0).all() and (a[6, 4:] > 0).all()
    if pad:
        assert (got["attn"][:, :, 1, :, 5:] == 0).all()       # padded keys never attended


@pytest.mark.parametrize("kind,pad", CASES, ids=[c[0] for c in CASES])
def test_sdpa_recording_equals_eager_recording(kind, pad):
    x, mask, labels = _batch(pad)
    recs = {impl: _record(_model(kind, impl), x, mask, labels)[0] for impl in ("sdpa", "eager")}
    # GPT-2's eager softmax runs in float64: recordings agree to rounding.  Llama-family eager
    # attention takes its softmax in float32 even for float64 models, so the *forward* of the
    # later layers already differs by ~2e-8 between sdpa and eager (measured), hence 1e-7 there.
    tol = dict(rtol=1e-12, atol=1e-12) if kind == "gpt2" else dict(rtol=1e-7, atol=1e-7)
    for name, val in recs["sdpa"].items():
        torch.testing.assert_close(val, recs["eager"][name], **tol, equal_nan=True, msg=name)


def test_gpt2_compat_is_dL_dattn_from_hf_eager_output_attentions():
    model = _model("gpt2", "eager")
    x, mask, labels = _batch(False)
    got, _ = _record(model, x, mask, labels)
    out = model(x, attention_mask=mask, labels=labels, output_attentions=True)
    for a in out.attentions:
        a.retain_grad()
    out.loss.backward()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l, a in enumerate(out.attentions):
        torch.testing.assert_close(got["attn"][l].transpose(0, 1), a.detach(), **TOL)
        torch.testing.assert_close(got["compat"][l].transpose(0, 1), a.grad.masked_fill(~causal, 0.0), **TOL)


def test_non_recording_steps_leave_the_model_untouched():
    model = _model("llama", "sdpa")
    twin = copy.deepcopy(model)
    x, mask, labels = _batch(True)
    _record(model, x, mask, labels)
    assert model.config._attn_implementation == "sdpa"
    calls = []
    orig = AttentionInterface._global_mapping["sdpa"]
    AttentionInterface.register("sdpa", lambda *a, **k: calls.append(1) or orig(*a, **k))
    try:
        out = model(x, attention_mask=mask).logits
    finally:
        AttentionInterface.register("sdpa", orig)
    assert len(calls) == 2                                   # the model's own sdpa, once per layer
    assert torch.equal(out, twin(x, attention_mask=mask).logits)


def test_dropout_while_recording_is_refused():
    model = _model("gpt2", "sdpa")
    model.config.attn_pdrop = 0.5
    for blk in model.transformer.h:
        blk.attn.attn_dropout.p = 0.5
    model.train()
    x, mask, labels = _batch(False)
    with pytest.raises(Exception, match="dropout"):
        with Capture(model):
            model(x, labels=labels).loss.backward()
    assert model.config._attn_implementation == "sdpa"
