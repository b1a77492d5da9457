"""The float64 autograd reference for Hugging Face models, shared by the exactness tests and the
README's architecture table (``tests/adapters/architectures.py``).

The reference is an attention function registered in transformers' registry that computes the
architecture's eager formula with every intermediate kept (scores, α, output) — soft-cap, T5's
position bias, float masks (ALiBi), gpt-oss sinks, and rows with no visible key the way the
model's own implementation treats them.  :func:`compare` first checks the reference reproduces
the model's own loss, so the reference cannot drift from what the model computes.  Nothing here
calls ``dyntool.quantities``.
"""
from contextlib import contextmanager

import torch
import transformers
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from dyntool.adapters.hf import uses_registry
from dyntool.capture import Capture
from dyntool.record import names

from .reference import check, per_layer

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


@contextmanager
def float64_softmax():
    """Llama-family, Gemma and GPT-J eager attention take their softmax in float32 even in float64
    models; at trained-size logits that rounding (≈1e-7, and −inf rows where float64's min mask
    overflows float32) is the model's, not dyntool's.  Keep float64 inputs in float64 so the
    recorded run and the reference compute the same forward."""
    real = torch.nn.functional.softmax

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        return real(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)
    torch.nn.functional.softmax = softmax
    try:
        yield
    finally:
        torch.nn.functional.softmax = real


AttentionInterface.register("ref_eager", _ref)
AttentionMaskInterface.register("ref_eager", eager_mask)
AttentionInterface.register("ref_sdpa", _ref_sdpa)
AttentionMaskInterface.register("ref_sdpa", sdpa_mask)


def tiny_config(kind):
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
    auto = transformers.AutoModelForCausalLM
    decoders = {
        "gpt2": lambda: transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, attn_pdrop=0,
                                                resid_pdrop=0, embd_pdrop=0, **ids),
        "llama": lambda: transformers.LlamaConfig(**dec),
        "mistral": lambda: transformers.MistralConfig(sliding_window=3, **dec),
        "qwen2": lambda: transformers.Qwen2Config(use_sliding_window=True, sliding_window=3, max_window_layers=1,
                                                  layer_types=["full_attention", "sliding_attention"], **dec),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=8, **dec),
        "gemma3": lambda: transformers.Gemma3TextConfig(head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                                                        **dec),
        "phi": lambda: transformers.PhiConfig(**{**dec, "num_key_value_heads": 4}),
        "phi3": lambda: transformers.Phi3Config(**dec),
        "stablelm": lambda: transformers.StableLmConfig(**dec),
        "opt": lambda: transformers.OPTConfig(hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
                                              word_embed_proj_dim=16, max_position_embeddings=32, dropout=0.0, **ids),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                       intermediate_size=32, max_position_embeddings=32, **ids),
        "olmo2": lambda: transformers.Olmo2Config(**dec),
        "mixtral": lambda: transformers.MixtralConfig(num_local_experts=2, num_experts_per_tok=1,
                                                      experts_implementation="eager", **dec),
        "cohere": lambda: transformers.CohereConfig(**dec),
        "starcoder2": lambda: transformers.Starcoder2Config(**dec),
    }
    decoders["falcon"] = lambda: transformers.FalconConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, alibi=True,
        new_decoder_architecture=False, multi_query=True, bos_token_id=0, eos_token_id=1)
    decoders["falcon_rope"] = lambda: transformers.FalconConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, alibi=False,
        new_decoder_architecture=True, num_kv_heads=1, bos_token_id=0, eos_token_id=1)
    if kind in decoders:
        return auto, decoders[kind]()
    raise ValueError(kind)


# projections, and the gains of QK-norm (which undoes any scaling of the projections)
QK = ("q_proj", "k_proj", "query", "key", "q", "k", "c_attn", "query_key_value", "qkv_proj", "Wqkv", "q_norm", "k_norm")


def _is_attention(m) -> bool:
    return uses_registry(m) or type(m).__name__.endswith("Attention")


def _offset(module) -> float:
    return 1.0 if type(module).__name__.startswith("Gemma") and "Norm" in type(module).__name__ else 0.0


def make_model(kind, impl, target=30.0):
    """A tiny float64 model whose q and k projections are scaled so that max |τ q·k| ≈ ``target``
    on the test inputs (the size of a trained model's logits)."""
    torch.manual_seed(0)
    cls, cfg = tiny_config(kind)
    cfg._attn_implementation = impl
    make = cls.from_config if cls.__name__.startswith("Auto") else cls._from_config
    m = make(cfg, dtype=torch.float64).eval()
    qk = [(p, _offset(m.get_submodule(".".join(name.split(".")[:-1])))) for name, p in m.named_parameters()
          if len(name.split(".")) >= 2 and name.split(".")[-2] in QK
          and _is_attention(m.get_submodule(".".join(name.split(".")[:-2])))]
    for _ in range(3):                        # logits are bilinear in (W_q, W_k): scale both by √ratio
        with Capture(m) as cap:
            m(**make_inputs(kind)).loss.backward()
        m.zero_grad()
        ratio = target / float(cap.compute()["logit_max"].max())
        with torch.no_grad():
            for p, off in qk:               # Gemma's RMSNorm gain is (1 + w)
                p.copy_((p + off) * ratio ** 0.5 - off)
    return m


def make_inputs(kind):
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


def reference(model, inputs, impl):
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


def compare(model, inputs, impl, min_logit=20.0, tol=None):
    with Capture(model) as cap:
        loss = model(**inputs).loss
        loss.backward()
    model.zero_grad()
    got, sites = cap.compute(), cap.attrs["sites"]
    ref_loss = reference(model, inputs, impl)
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
        check(layer, ref, _allowed(r, impl != "sdpa"), n_kv, name=f"{type(model).__name__} site {i}", tol=tol)
    return got, sites


def _crop(name, x, T, Tk):
    dims = names.DIMS.get(name, ())[3:]
    for axis, d in enumerate(dims):
        n = T if d == "query" else Tk if d == "key" else None
        if n is not None:
            x = x.narrow(2 + axis, 0, n)
    return x




def compare_sdpa(model, inputs, min_logit=20.0) -> dict:
    """For models calling F.scaled_dot_product_attention themselves (Falcon): the reference swaps
    in a materialised SDPA keeping every intermediate; returns the Capture's attrs."""
    import torch.nn.functional as F
    with Capture(model) as cap:
        model(**inputs).loss.backward()
    model.zero_grad()
    got = cap.compute()
    assert float(got["logit_max"].max()) >= min_logit, "test must run at trained-size logits"
    ref: list = []
    real = F.scaled_dot_product_attention

    def manual(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        for t in (q, k, v):
            t.retain_grad()
        T, Tk = q.shape[-2], k.shape[-2]
        mask = attn_mask if attn_mask is not None else (
            torch.zeros(T, Tk, dtype=q.dtype).masked_fill(~torch.ones(T, Tk, dtype=torch.bool).tril(), float("-inf"))
            if is_causal else torch.zeros(T, Tk, dtype=q.dtype))
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
        kk, vv = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
        s = q @ kk.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale) + mask
        s.retain_grad()
        a = torch.softmax(s, -1)
        a.retain_grad()
        y = a @ vv
        y.retain_grad()
        ref.append(dict(q=q, k=k, v=v, s=s, a=a, y=y, mask=mask))
        return y

    F.scaled_dot_product_attention = manual
    try:
        model(**inputs).loss.backward()
    finally:
        F.scaled_dot_product_attention = real
        model.zero_grad()
    for i, r in enumerate(ref):
        allowed = r["mask"] > torch.finfo(r["mask"].dtype).min / 2
        n_kv = r["k"].shape[1] if r["k"].shape[1] != r["q"].shape[1] else None
        check(per_layer(got, i), dict(attn=r["a"].detach(), attn_grad=r["a"].grad, scores_grad=r["s"].grad,
                                      y_grad=r["y"].grad, q_grad=r["q"].grad, k_grad=r["k"].grad,
                                      v_grad=r["v"].grad), allowed, n_kv, name=f"{type(model).__name__} L{i}")
    return cap.attrs
