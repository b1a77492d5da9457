"""Hugging Face architectures with score modifiers, encoders and encoder–decoders: recorded
quantities vs autograd (float64, ``hf_reference``) at trained-size logits (q/k weights scaled so
max |logit| ≥ 20: random init hides soft-capping and score biases), and the refusals.
The plain decoders of the README table are checked by ``test_architectures.py``."""
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")
from transformers.masking_utils import AttentionMaskInterface, eager_mask  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

from dyntool.capture import Capture, CaptureError  # noqa: E402

from .hf_reference import V, compare, compare_sdpa, float64_softmax, make_inputs, make_model  # noqa: E402
from .reference import check, per_layer  # noqa: E402


@pytest.fixture(autouse=True)
def _float64_softmax():
    with float64_softmax():
        yield


# GPT-J's eager attention computes q·k in float32 even in float64 models: its sdpa path is the
# float64 one (eager passes the self-check at float32's accuracy, ≈1e-7).
CASES = [("bert", "sdpa"), ("bert", "eager"), ("roberta", "sdpa"), ("vit", "sdpa"), ("vit", "eager"),
         ("t5", "eager"), ("t5", "sdpa"), ("bart", "sdpa"), ("bart", "eager"), ("gemma2", "eager"),
         ("gpt_oss", "eager"), ("gptj", "sdpa"), ("llama", "sdpa"), ("llama", "eager")]


@pytest.mark.parametrize("kind,impl", CASES, ids=[f"{k}-{i}" for k, i in CASES])
def test_exact_at_trained_size_logits(kind, impl):
    model = make_model(kind, impl)
    got, sites = compare(model, make_inputs(kind), impl)
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
    model = make_model("t5", "eager")
    got, _ = compare(model, make_inputs("t5"), "eager")
    bias = model.encoder.block[0].layer[0].SelfAttention.compute_bias(7, 7)            # (1, nh, 7, 7)
    enc = model.encoder.block[0].layer[0].SelfAttention
    q = got["queries"][0, :, 0]                                                          # (nh, T, d)
    k = got["keys"][0, :, 0]
    s = q @ k.transpose(-1, -2) * 1.0 + bias[0].detach()
    torch.testing.assert_close(got["scores"][0, :, 0, :, :5], s[..., :5], rtol=1e-10, atol=1e-10)
    assert enc.has_relative_attention_bias


def test_gemma2_softcap_is_exact_only_with_the_cap():
    """Soft-capping matters at trained size: without it α would be ≫ 1e-8 off (issue 27: 3.9e-2)."""
    model = make_model("gemma2", "eager", target=60.0)
    got, _ = compare(model, make_inputs("gemma2"), "eager", min_logit=40.0)
    assert got["logit_max"].max() > model.config.attn_logit_softcapping       # raw logits past the cap
    s = got["scores"][torch.isfinite(got["scores"])]
    assert s.abs().max() <= model.config.attn_logit_softcapping                # scores the softmax saw


def test_gpt_oss_sink_mass_recorded():
    model = make_model("gpt_oss", "eager")
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "sinks"):
                m.sinks.fill_(3.0)                  # a sink that takes a visible share of every row
    got, _ = compare(model, make_inputs("gpt_oss"), "eager")
    row = got["attn"].sum(-1) + got["sink_mass"]
    ok = torch.isfinite(row)
    torch.testing.assert_close(row[ok], torch.ones_like(row[ok]), rtol=1e-12, atol=1e-12)
    sink = got["sink_mass"][ok]
    assert (sink > 0).all() and sink.max() > 0.5              # the sink really takes part of the rows


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_llama_left_padding_fully_masked_rows(impl):
    """Left padding: a padded query row sees no key.  SDPA outputs 0 there (α recorded 0, no
    gradient), eager's additive mask gives a uniform row; dQ/dK/dV exact either way."""
    model = make_model("llama", impl)
    inputs = make_inputs("llama")
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    inputs.update(attention_mask=mask, labels=inputs["input_ids"].masked_fill(mask == 0, -100))
    got, _ = compare(model, inputs, impl)
    rows = got["attn"][:, :, 1, :3].sum(-1)                         # (L, nh, 3) padded query rows
    if impl == "sdpa":
        assert (rows == 0).all()
    else:
        torch.testing.assert_close(rows, torch.ones_like(rows))


def test_falcon_alibi_through_sdpa_is_exact():
    """Falcon folds ALiBi into SDPA's float mask; the mask's finite part is the score bias."""
    model = make_model("falcon", "sdpa")
    attrs = compare_sdpa(model, make_inputs("falcon"))
    assert attrs["adapter"] == "sdpa" and attrs["score_modifiers"] == ["bias"]


class _KernelAttention(torch.nn.Module):
    """Attention behind an opaque kernel: projections dyntool can see, no normalisation in its code."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(4, 12)

    def forward(self, x):
        return torch.ops.aten.gelu(self.qkv(x)[..., :4])


def test_attention_dyntool_cannot_see_into_is_refused_at_enter():
    # BLOOM, MPT, GPT-Neo, XGLM, OpenAI-GPT and Falcon eager record through the dataflow adapter
    # (tests/adapters/test_dataflow.py); a module with no softmax in its code is still refused
    model = torch.nn.Sequential(_KernelAttention())
    with pytest.raises(CaptureError, match="refused.*computes the attention weights itself") as e:
        Capture(model)
    assert "supported" not in str(e.value) and "\n" not in str(e.value)


def _llama_with_attention(name, modify_scores):
    """A Llama whose attention (registered as ``name``) changes the scores behind dyntool's back:
    ``modify_scores(s, key, **kw)`` gets τ q·k and the kwargs the attention function received."""
    def attention(module, query, key, value, attention_mask, scaling=None, **kw):
        k = key.repeat_interleave(query.shape[1] // key.shape[1], 1)
        v = value.repeat_interleave(query.shape[1] // value.shape[1], 1)
        s = modify_scores(query @ k.transpose(-1, -2) * scaling, key, **kw)
        if attention_mask is not None:
            s = s + attention_mask
        a = torch.softmax(s, -1)
        return (a @ v).transpose(1, 2), a

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, eager_mask)
    model = make_model("llama", "eager")
    model.config._attn_implementation = name
    return model


def test_an_additive_bias_dyntool_is_not_told_about_is_refused():
    """A model whose attention adds a score bias the adapter cannot see: refused by the self-check
    in the forward, with the layer and the reason named, before any backward."""
    def per_key_bias(s, key, **kw):
        return s + torch.linspace(-2.0, 2.0, key.shape[-2], dtype=s.dtype)
    model = _llama_with_attention("biased_test", per_key_bias)
    with pytest.raises(CaptureError, match=r"layer 0 \(model.layers.0.self_attn.*score bias") as e:
        with Capture(model):
            model(**make_inputs("llama"))
    assert "\n" not in str(e.value)
    assert model.config._attn_implementation == "biased_test"            # restored on the error


def test_encoder_decoder_run_records_its_sites(tmp_path):
    """BART through RunRecorder: one record with encoder self-, decoder self- and cross-attention
    sites, each with its own (T, Tk), readable by `dyntool check`."""
    import zarr

    from dyntool.cli import main
    from dyntool.integrations import RunRecorder
    model = make_model("bart", "sdpa")
    inputs = make_inputs("bart")
    with RunRecorder(model, tmp_path, max_steps=2, every=1, probe=inputs) as rec:
        for step in range(2):
            rec.probe_step(step)
            rec.log(step, loss=1.0)
    g = zarr.open_group(str(rec.path / "record.zarr"), mode="r")
    sites = g.attrs["sites"]
    assert [(s["stack"], s["kind"], s["T"], s["Tk"]) for s in sites] == [
        ("encoder", "self", 7, 7), ("decoder", "self", 5, 5), ("decoder", "cross", 5, 7)]
    assert g["attn"].shape[1:] == (3, 2, 1, 7, 7)
    attn = g["attn"][0]
    assert (attn[1, :, :, 5:, :] == 0).all() and (attn[1, :, :, :, 5:] == 0).all()    # padded 5 × 5 site
    assert main(["check", str(rec.path)]) == 0


def test_an_unknown_kwarg_reaching_the_attention_is_refused_not_dropped():
    """transformers forwards extra model kwargs to the attention function; one that changes the
    scores (here a temperature dyntool knows nothing of) is caught by the self-check."""
    model = _llama_with_attention("tempered_test", lambda s, key, temperature=1.0, **kw: s / temperature)
    inputs = make_inputs("llama")
    with Capture(model) as cap:                       # temperature 1: nothing to see, recorded
        model(**inputs).loss.backward()
    assert cap.compute()["attn"].shape[0] == 2
    with pytest.raises(CaptureError, match="does not reproduce the output"):
        with Capture(model):
            model(**inputs, temperature=3.0)
