"""Every Hugging Face architecture dyntool calls exact: recorded quantities vs autograd (float64),
at trained-size logits (q/k weights scaled so max |logit| ≥ 20: random init hides soft-capping and
score biases), with the score modifiers each model uses.

The reference is an attention function registered in transformers' registry that computes the
architecture's eager formula with every intermediate kept (scores, α, output) — soft-cap, T5's
position bias, float masks (ALiBi), gpt-oss sinks, and rows with no visible key the way the
model's own implementation treats them.  Each test first checks the reference reproduces the
model's own loss, so the reference cannot drift from what the model computes.
"""
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

from dyntool.capture import Capture, CaptureError  # noqa: E402
from dyntool.adapters.hf import _uses_registry  # noqa: E402

from .reference import check, per_layer  # noqa: E402

V = 61
REF: dict = {}


def _ref(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
         position_bias=None, s_aux=None, zero_empty_rows=False, **kw):
    n_rep = query.shape[1] // key.shape[1]
    for t in (query, key, value):
        t.retain_grad()
    k, v = key.repeat_interleave(n_rep, 1), value.repeat_interleave(n_rep, 1)
    s = query @ k.transpose(-1, -2) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if position_bias is not None:
        s = s + position_bias
    empty = None
    causal = kw.get("is_causal")
    if attention_mask is None and (getattr(module, "is_causal", True) if causal is None else causal):
        attention_mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril(s.shape[-1] - s.shape[-2])
    if attention_mask is not None and attention_mask.dtype == torch.bool:      # sdpa semantics
        empty = ~attention_mask.any(-1, keepdim=True)
        s = s.masked_fill(~attention_mask, float("-inf")).masked_fill(empty, 0.0)
    elif attention_mask is not None:
        s = s + attention_mask
    s.retain_grad()
    if s_aux is not None:
        p = torch.softmax(torch.cat([s, s_aux.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1), -1)
        a = p[..., :-1]
    else:
        a = torch.softmax(s, -1)
    if empty is not None:
        a = a * ~empty                          # SDPA: a row with no visible key outputs 0
    a.retain_grad()
    y = a @ v
    y.retain_grad()
    REF[id(module)] = dict(q=query, k=key, v=value, s=s, a=a, y=y, mask=attention_mask)
    return y.transpose(1, 2), a


def _ref_sdpa(*a, **kw):
    return _ref(*a, **kw)


@pytest.fixture(autouse=True)
def float64_softmax(monkeypatch):
    """Llama-family, Gemma and GPT-J eager attention take their softmax in float32 even in float64
    models; at trained-size logits that rounding (≈1e-7, and −inf rows where float64's min mask
    overflows float32) is the model's, not dyntool's.  Keep float64 inputs in float64 so the
    recorded run and the reference compute the same forward."""
    real = torch.nn.functional.softmax

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        return real(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)
    monkeypatch.setattr(torch.nn.functional, "softmax", softmax)


AttentionInterface.register("ref_eager", _ref)
AttentionMaskInterface.register("ref_eager", eager_mask)
AttentionInterface.register("ref_sdpa", _ref_sdpa)
AttentionMaskInterface.register("ref_sdpa", sdpa_mask)


def _tiny(kind):
    ids = dict(vocab_size=V, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    dec = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
               intermediate_size=48, max_position_embeddings=32, **ids)
    if kind == "bert":
        return transformers.BertForMaskedLM, transformers.BertConfig(
            hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=32, hidden_dropout_prob=0, attention_probs_dropout_prob=0, **ids)
    if kind == "roberta":
        return transformers.RobertaForSequenceClassification, transformers.RobertaConfig(
            hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, num_labels=3,
            max_position_embeddings=40, hidden_dropout_prob=0, attention_probs_dropout_prob=0, **ids)
    if kind == "vit":
        return transformers.ViTForImageClassification, transformers.ViTConfig(
            image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, num_labels=3, hidden_dropout_prob=0, attention_probs_dropout_prob=0)
    if kind == "t5":
        return transformers.T5ForConditionalGeneration, transformers.T5Config(
            d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
            relative_attention_num_buckets=8, dropout_rate=0.0, decoder_start_token_id=0, **ids)
    if kind == "bart":
        return transformers.BartForConditionalGeneration, transformers.BartConfig(
            d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
            decoder_start_token_id=0, forced_eos_token_id=None, **ids)
    if kind == "gemma2":
        return transformers.AutoModelForCausalLM, transformers.Gemma2Config(
            head_dim=8, attn_logit_softcapping=30.0, final_logit_softcapping=None, sliding_window=4,
            query_pre_attn_scalar=8, **dec)
    if kind == "gpt_oss":
        return transformers.AutoModelForCausalLM, transformers.GptOssConfig(
            head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=4, experts_implementation="eager",
            layer_types=["sliding_attention", "full_attention"], **{**dec, "intermediate_size": 16})
    if kind == "gptj":
        return transformers.AutoModelForCausalLM, transformers.GPTJConfig(
            n_embd=16, n_layer=2, n_head=2, rotary_dim=4, n_positions=32, attn_pdrop=0, resid_pdrop=0,
            embd_pdrop=0, **ids)
    if kind == "llama":
        return transformers.AutoModelForCausalLM, transformers.LlamaConfig(**dec)
    raise ValueError(kind)


QK = ("q_proj", "k_proj", "query", "key", "q", "k")


def _model(kind, impl, target=30.0):
    """A tiny float64 model whose q and k projections are scaled so that max |τ q·k| ≈ ``target``
    on the test inputs (the size of a trained model's logits)."""
    torch.manual_seed(0)
    cls, cfg = _tiny(kind)
    cfg._attn_implementation = impl
    make = cls.from_config if cls.__name__.startswith("Auto") else cls._from_config
    m = make(cfg, dtype=torch.float64).eval()
    qk = [p for name, p in m.named_parameters() if len(name.split(".")) >= 2 and name.split(".")[-2] in QK
          and _uses_registry(m.get_submodule(".".join(name.split(".")[:-2])))]
    for _ in range(3):                        # logits are bilinear in (W_q, W_k): scale both by √ratio
        with Capture(m) as cap:
            m(**_inputs(kind)).loss.backward()
        m.zero_grad()
        ratio = target / float(cap.compute()["logit_max"].max())
        with torch.no_grad():
            for p in qk:
                p.mul_(ratio ** 0.5)
    return m


def _inputs(kind):
    g = torch.Generator().manual_seed(1)
    if kind == "vit":
        return dict(pixel_values=torch.randn(2, 3, 8, 8, generator=g), labels=torch.tensor([0, 2]))
    x = torch.randint(3, V, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0                                      # padding in the second sequence
    if kind == "roberta":
        return dict(input_ids=x, attention_mask=mask, labels=torch.tensor([1, 2]))
    if kind in ("t5", "bart"):                           # source 7 ≠ target 5
        y = torch.randint(3, V, (2, 5), generator=g)
        return dict(input_ids=x, attention_mask=mask, labels=y)
    labels = x.masked_fill(mask == 0, -100)
    return dict(input_ids=x, attention_mask=mask, labels=labels)


def _reference(model, inputs, impl):
    REF.clear()
    configs = [m.config for m in model.modules() if hasattr(m, "config")]
    saved = [(c, c._attn_implementation) for c in {id(c): c for c in configs}.values()]
    for c, _ in saved:
        c._attn_implementation = "ref_sdpa" if impl == "sdpa" else "ref_eager"
    try:
        loss = model(**inputs).loss
        loss.backward()
    finally:
        for c, i in saved:
            c._attn_implementation = i
        model.zero_grad()
    return loss.detach()


def _allowed(r, uniform_empty: bool):
    m, (T, Tk) = r["mask"], r["a"].shape[-2:]
    if m is None:
        return torch.ones(T, Tk, dtype=torch.bool)
    ok = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
    if uniform_empty:                         # an additive mask's fully masked row is uniform
        ok = ok | ~ok.any(-1, keepdim=True)
    return ok


def _compare(model, inputs, impl, min_logit=20.0):
    with Capture(model) as cap:
        loss = model(**inputs).loss
        loss.backward()
    model.zero_grad()
    got, sites = cap.compute(), cap.attrs["sites"]
    ref_loss = _reference(model, inputs, impl)
    # the reference is the model (ViT and Llama-family eager take their softmax in float32: ~1e-9)
    torch.testing.assert_close(ref_loss, loss.detach(), rtol=1e-8, atol=1e-12)
    order = [id(m) for m in cap.adapter.modules]
    assert float(got["logit_max"].max()) >= min_logit, "test must run at trained-size logits"
    for i, key in enumerate(order):
        r = REF[key]
        T, Tk = r["a"].shape[-2:]
        assert (sites[i]["T"], sites[i]["Tk"]) == (T, Tk)
        layer = per_layer(got, i)
        layer = {n: _crop(n, x, T, Tk) for n, x in layer.items()}
        ref = dict(attn=r["a"].detach(), attn_grad=r["a"].grad, scores_grad=r["s"].grad, y_grad=r["y"].grad,
                   q_grad=r["q"].grad, k_grad=r["k"].grad, v_grad=r["v"].grad)
        n_kv = r["k"].shape[1] if r["k"].shape[1] != r["q"].shape[1] else None
        check(layer, ref, _allowed(r, impl != "sdpa"), n_kv, name=f"{type(model).__name__} site {i}")
    return got, sites


def _crop(name, x, T, Tk):
    from dyntool.record import names
    dims = names.DIMS.get(name, ())[3:]
    for axis, d in enumerate(dims):
        n = T if d == "query" else Tk if d == "key" else None
        if n is not None:
            x = x.narrow(2 + axis, 0, n)
    return x


# GPT-J's eager attention computes q·k in float32 even in float64 models: its sdpa path is the
# float64 one (eager passes the self-check at float32's accuracy, ≈1e-7).
CASES = [("bert", "sdpa"), ("bert", "eager"), ("roberta", "sdpa"), ("vit", "sdpa"), ("vit", "eager"),
         ("t5", "eager"), ("t5", "sdpa"), ("bart", "sdpa"), ("bart", "eager"), ("gemma2", "eager"),
         ("gpt_oss", "eager"), ("gptj", "sdpa"), ("llama", "sdpa"), ("llama", "eager")]


@pytest.mark.parametrize("kind,impl", CASES, ids=[f"{k}-{i}" for k, i in CASES])
def test_exact_at_trained_size_logits(kind, impl):
    model = _model(kind, impl)
    got, sites = _compare(model, _inputs(kind), impl)
    assert model.config._attn_implementation == impl             # restored on exit
    if kind in ("t5", "bart"):
        kinds = [(s["stack"], s["kind"]) for s in sites]
        assert ("encoder", "self") in kinds and ("decoder", "self") in kinds and ("decoder", "cross") in kinds
        cross = [s for s in sites if s["kind"] == "cross"]
        assert all((s["T"], s["Tk"]) == (5, 7) for s in cross)
        # padded part of a 5 × 7 cross site inside the common 7 × 7: α 0, scores NaN
        i = cross[0]["index"]
        assert (got["attn"][i, :, :, 5:] == 0).all() and got["scores"][i, :, :, 5:].isnan().all()


def test_t5_relative_position_bias_is_in_the_scores():
    model = _model("t5", "eager")
    got, _ = _compare(model, _inputs("t5"), "eager")
    bias = model.encoder.block[0].layer[0].SelfAttention.compute_bias(7, 7)            # (1, nh, 7, 7)
    enc = model.encoder.block[0].layer[0].SelfAttention
    q = got["queries"][0, :, 0]                                                          # (nh, T, d)
    k = got["keys"][0, :, 0]
    s = q @ k.transpose(-1, -2) * 1.0 + bias[0].detach()
    torch.testing.assert_close(got["scores"][0, :, 0, :, :5], s[..., :5], rtol=1e-10, atol=1e-10)
    assert enc.has_relative_attention_bias


def test_gemma2_softcap_is_exact_only_with_the_cap():
    """Soft-capping matters at trained size: without it α would be ≫ 1e-8 off (issue 27: 3.9e-2)."""
    model = _model("gemma2", "eager", target=60.0)
    got, _ = _compare(model, _inputs("gemma2"), "eager", min_logit=40.0)
    assert got["logit_max"].max() > model.config.attn_logit_softcapping       # raw logits past the cap
    s = got["scores"][torch.isfinite(got["scores"])]
    assert s.abs().max() <= model.config.attn_logit_softcapping                # scores the softmax saw


def test_gpt_oss_sink_mass_recorded():
    model = _model("gpt_oss", "eager")
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "sinks"):
                m.sinks.fill_(3.0)                  # a sink that takes a visible share of every row
    got, _ = _compare(model, _inputs("gpt_oss"), "eager")
    row = got["attn"].sum(-1) + got["sink_mass"]
    ok = torch.isfinite(row)
    torch.testing.assert_close(row[ok], torch.ones_like(row[ok]), rtol=1e-12, atol=1e-12)
    sink = got["sink_mass"][ok]
    assert (sink > 0).all() and sink.max() > 0.5              # the sink really takes part of the rows


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_llama_left_padding_fully_masked_rows(impl):
    """Left padding: a padded query row sees no key.  SDPA outputs 0 there (α recorded 0, no
    gradient), eager's additive mask gives a uniform row; dQ/dK/dV exact either way."""
    model = _model("llama", impl)
    inputs = _inputs("llama")
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    inputs.update(attention_mask=mask, labels=inputs["input_ids"].masked_fill(mask == 0, -100))
    got, _ = _compare(model, inputs, impl)
    rows = got["attn"][:, :, 1, :3].sum(-1)                         # (L, nh, 3) padded query rows
    if impl == "sdpa":
        assert (rows == 0).all()
    else:
        torch.testing.assert_close(rows, torch.ones_like(rows))


def test_falcon_alibi_through_sdpa_is_exact():
    """Falcon folds ALiBi into SDPA's float mask; the mask's finite part is the score bias."""
    torch.manual_seed(0)
    cfg = transformers.FalconConfig(vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                    alibi=True, new_decoder_architecture=False, multi_query=True,
                                    bos_token_id=0, eos_token_id=1)
    cfg._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float64).eval()
    x = torch.randint(3, V, (2, 7), generator=torch.Generator().manual_seed(1))
    ref: list = []
    real = F.scaled_dot_product_attention

    def manual(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        for t in (q, k, v):
            t.retain_grad()
        s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + attn_mask
        s.retain_grad()
        a = torch.softmax(s, -1)
        a.retain_grad()
        y = a @ v
        y.retain_grad()
        ref.append(dict(q=q, k=k, v=v, s=s, a=a, y=y, mask=attn_mask))
        return y

    with Capture(model) as cap:
        model(x, labels=x).loss.backward()
    model.zero_grad()
    got = cap.compute()
    assert cap.attrs["adapter"] == "sdpa" and cap.attrs["score_modifiers"] == ["bias"]
    F.scaled_dot_product_attention = manual
    try:
        model(x, labels=x).loss.backward()
    finally:
        F.scaled_dot_product_attention = real
    for i, r in enumerate(ref):
        allowed = r["mask"] > torch.finfo(r["mask"].dtype).min / 2
        check(per_layer(got, i), dict(attn=r["a"].detach(), attn_grad=r["a"].grad, scores_grad=r["s"].grad,
                                      y_grad=r["y"].grad, q_grad=r["q"].grad, k_grad=r["k"].grad,
                                      v_grad=r["v"].grad), allowed, n_kv=1, name=f"falcon L{i}")


def test_falcon_eager_is_refused_before_backward():
    cfg = transformers.FalconConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    alibi=True, new_decoder_architecture=False, bos_token_id=0, eos_token_id=1)
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float64).eval()
    x = torch.randint(3, V, (1, 5))
    with pytest.raises(CaptureError, match="FalconAttention.*attn_implementation='sdpa'") as e:
        with Capture(model):
            model(x, labels=x)                       # the forward alone: refused before any backward
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["bloom", "mpt", "gpt_neo"])
def test_models_computing_attention_themselves_are_refused_at_enter(kind):
    cfg = {"bloom": lambda: transformers.BloomConfig(vocab_size=V, hidden_size=16, n_layer=1, n_head=2),
           "mpt": lambda: transformers.MptConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_seq_len=16),
           "gpt_neo": lambda: transformers.GPTNeoConfig(vocab_size=V, hidden_size=16, num_layers=1, num_heads=2,
                                                        attention_types=[[["global"], 1]], max_position_embeddings=16),
           }[kind]()
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(CaptureError, match="refused.*computes the attention weights itself") as e:
        Capture(model)
    assert "supported" not in str(e.value) and "\n" not in str(e.value)


def test_an_additive_bias_dyntool_is_not_told_about_is_refused():
    """A model whose attention adds a score bias the adapter cannot see: refused by the self-check
    in the forward, with the layer and the reason named, before any backward."""
    def biased(module, query, key, value, attention_mask, scaling=None, **kw):
        bias = torch.linspace(-2.0, 2.0, key.shape[-2], dtype=query.dtype)           # per key, unknown
        k = key.repeat_interleave(query.shape[1] // key.shape[1], 1)
        v = value.repeat_interleave(query.shape[1] // value.shape[1], 1)
        s = query @ k.transpose(-1, -2) * scaling + bias
        if attention_mask is not None:
            s = s + attention_mask
        a = torch.softmax(s, -1)
        return (a @ v).transpose(1, 2), a

    AttentionInterface.register("biased_test", biased)
    AttentionMaskInterface.register("biased_test", eager_mask)
    model = _model("llama", "eager")
    model.config._attn_implementation = "biased_test"
    inputs = _inputs("llama")
    with pytest.raises(CaptureError, match=r"layer 0 \(model.layers.0.self_attn.*score bias") as e:
        with Capture(model):
            model(**inputs)
    assert "\n" not in str(e.value)
    assert model.config._attn_implementation == "biased_test"            # restored on the error
