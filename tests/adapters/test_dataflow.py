"""The dataflow adapter (dyntool/adapters/dataflow*.py) against float64 autograd truth.

Every family that computes its own softmax records α, B, advantages, ∂L/∂S, U, dQ, dK, dV equal to
autograd on the model's own tensors (``dataflow_reference``: kept with retain_grad by swapped
torch functions, no tracer) at trained-size logits (max |τ q·k| ≥ 20), with right and left
padding; the refusals come as one line with their reason."""
import functools

import pytest
import torch

from dyntool.capture import Capture, CaptureError

from . import dataflow_reference as R
from .dataflow_models import TinyNano, batch, nano, nano_truth
from .reference import per_layer

transformers = pytest.importorskip("transformers")

# MPT in float64 with left padding: the model's own loss is NaN (its float32 softmax of float64's
# finfo.min gives −inf rows), so there is nothing to compare
CASES = [(f, p) for f in R.FAMILIES for p in ("right", "left") if (f, p) != ("mpt", "left")]


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)      # XGLM builds a torch.full(finfo.min) in the default dtype
    yield
    torch.set_default_dtype(old)


@functools.lru_cache(maxsize=None)
def _model(family):                          # one model per family for both paddings (weights never change)
    return R.make(family)


@pytest.mark.slow          # the default run checks the same comparisons through docs' table (test_architectures)
@pytest.mark.parametrize("family,padding", CASES)
def test_family_matches_float64_autograd(family, padding, float64_default):
    model = _model(family)
    cls = R.FAMILIES[family][0]
    attn = next(m for m in model.modules() if type(m).__name__ == cls)
    from dyntool.adapters.dataflow import n_heads
    attrs = R.compare(model, R.inputs(padding), {cls}, n_heads(attn), tol=R.TOL.get(family, 1e-8))
    assert attrs["adapter"] == "dataflow"


@pytest.mark.parametrize("variant", ["matmul", "inplace", "einsum"])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_nanogpt_manual_path_matches_autograd(variant, padding):
    """nanoGPT's manual path; in-place masked_fill_; einsum scores (k in another layout) and α·V."""
    x, pad = batch(padding=padding)
    cap = nano_truth(nano(inplace=variant == "inplace", einsum=variant == "einsum"), x, pad)
    assert cap.adapter.name == "dataflow" and len(cap.sites) == 2


def test_batch_one_and_cross_attention_with_other_key_length():
    x, _ = batch(B=1)
    nano_truth(nano(), x, None)
    m = nano(cross=True)
    memory = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 3
    x, pad = batch()
    cap = nano_truth(m, x, None, memory)
    assert {(s["T"], s["Tk"]) for s in cap.attrs["sites"]} == {(8, 5)}


def test_dropout_refused_with_residual():
    m = nano(dropout=0.3).train()
    x, pad = batch()
    with pytest.raises(CaptureError, match=r"differs from the output the model used by \d.*dropout p=0.3"):
        with Capture(m):
            m(x, pad).sum().backward()


def test_gradient_edit_on_alpha_refused_by_backward_check():
    """An op dyntool cannot see in the forward (a hook rescaling ∂L/∂α) is caught on the backward."""
    m = nano()
    x, pad = batch()
    real = torch.nn.functional.softmax

    def softmax(t, dim=None, **kw):
        a = real(t, dim=dim, **kw)
        if a.requires_grad:
            a.register_hook(lambda g: 2 * g)
        return a
    torch.nn.functional.softmax = softmax
    try:
        with pytest.raises(CaptureError, match=r"∂L/∂α differs from U Vᵀ by 0\.\d+ and its ∂L/∂S"):
            with Capture(m):
                m(x, pad).sum().backward()
    finally:
        torch.nn.functional.softmax = real


def test_checkpointing_non_reentrant_exact_reentrant_refused():
    x, pad = batch()
    nano_truth(nano(checkpointing="non-reentrant"), x, pad)
    m = nano(checkpointing="reentrant")
    with pytest.raises(CaptureError, match="reentrant activation checkpointing"):
        with Capture(m):
            m(x, pad).sum().backward()


def test_moe_router_softmax_is_not_a_site():
    x, pad = batch()
    cap = nano_truth(nano(moe=True), x, pad)
    assert [s.label for s in cap.sites] == ["CausalSelfAttention"] * 2


def test_non_recording_forward_has_no_hooks_and_same_output():
    m = nano()
    x, pad = batch()
    before = m(x, pad)
    with Capture(m) as cap:
        m(x, pad).sum().backward()
    assert not any(mod._forward_pre_hooks or mod._forward_hooks for mod in m.modules())
    torch.testing.assert_close(m(x, pad), before, rtol=0, atol=0)
    assert cap.adapter.residuals and max(max(r) for r in cap.adapter.residuals.values()) < 1e-12


def test_softmax_not_reaching_v_is_refused_in_one_line():
    class Odd(torch.nn.Module):           # a softmax, but α·V through a transpose dyntool does not follow
        def __init__(self):
            super().__init__()
            self.q = torch.nn.Linear(4, 4)

        def forward(self, x):
            a = torch.softmax(self.q(x) @ x.transpose(-1, -2), dim=-1)
            return a.transpose(-1, -2) @ x

    class OddAttention(Odd):
        pass
    m = torch.nn.Sequential(OddAttention()).double()
    with pytest.raises(CaptureError, match="without a last-dimension softmax whose output reaches a matmul"):
        with Capture(m):
            m(torch.randn(2, 3, 4, dtype=torch.float64)).sum().backward()


def test_falcon_eager_routes_to_dataflow_and_sdpa_stays_sdpa():
    cfg = R.FAMILIES["falcon"][1]()
    for impl, name in (("eager", "dataflow"), ("sdpa", "sdpa")):
        cfg._attn_implementation = impl
        m = transformers.AutoModelForCausalLM.from_config(cfg)
        assert Capture(m).adapter.name == name


def test_unknown_class_name_is_one_line():
    with pytest.raises(CaptureError, match="no module of class 'Nope'"):
        Capture(TinyNano(), attention="Nope")


def _record(model, inputs, **kw):
    with Capture(model, **kw) as cap:
        out = model(**inputs)
        (out.loss if hasattr(out, "loss") else out.sum()).backward()
    model.zero_grad()
    return cap.adapter.name, cap.compute()


@pytest.mark.parametrize("cls,kind,adapter", [("BertSelfAttention", "bert", "hf"), ("ViTAttention", "vit", "hf"),
                                              ("GPTJAttention", "gptj", "hf"),
                                              ("MultiheadAttention", "mha", "torch-mha")])
def test_named_class_routes_by_what_it_does(cls, kind, adapter):
    """The four classes that were refused when named (routed to SDPA) record what the automatic
    path records (exact against float64 autograd in test_hf_models / test_torch_mha)."""
    if kind == "mha":
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, dtype=torch.float64)
        model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
        x = torch.randn(2, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        run = lambda **kw: _record(torch.nn.Sequential(model), {"input": x}, **kw)  # noqa: E731
    else:
        from .hf_reference import make_inputs, make_model
        model = make_model(kind, "eager")
        run = lambda **kw: _record(model, make_inputs(kind), **kw)                    # noqa: E731
    name, named = run(attention=cls)
    auto_name, auto = run()
    assert name == auto_name == adapter
    assert named.keys() == auto.keys()
    for k in auto:
        torch.testing.assert_close(named[k], auto[k], rtol=0, atol=0, equal_nan=True, msg=k)


def test_bfloat16_model_with_float32_softmax_records_within_bf16_rounding():
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(R.FAMILIES["bloom"][1](), dtype=torch.bfloat16).eval()
    x = R.inputs("left")
    with Capture(model) as cap:
        model(**x).loss.backward()
    model.zero_grad()
    got = cap.compute()
    with R.kept({"BloomAttention"}) as (calls, attach):
        attach(model)
        model(**x).loss.backward()
    for i, (_, events) in enumerate(calls):
        ref = R.truth(events, 2)
        layer = per_layer(got, i)
        assert events[[e[0] for e in events].index("softmax")][2].dtype == torch.float32
        torch.testing.assert_close(layer["attn"].double(), ref["attn"], rtol=0, atol=2e-2)
        torch.testing.assert_close(layer["score_grad"].double(), ref["scores_grad"].masked_fill(ref["attn"] == 0, 0),
                                   rtol=0.1, atol=float(ref["scores_grad"].abs().max()) * 0.05)


def test_run_recorded_through_dataflow_reads_with_info_and_check(tmp_path):
    from dyntool.cli import main
    from dyntool.integrations import RunRecorder
    from dyntool.run import open_run
    torch.manual_seed(0)
    cfg = R.FAMILIES["falcon"][1]()
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    probe = torch.arange(8).view(1, 8) % R.V
    probe_batch = {"input_ids": probe, "labels": probe}
    with RunRecorder(model, tmp_path, max_steps=3, every=1, name="df", probe=probe_batch) as rec:
        for step in range(3):
            rec.probe_step(step)
            loss = model(input_ids=probe, labels=probe).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.log(step, loss=loss.item())
    run = open_run(tmp_path / "df")
    assert run.config["model"]["adapter"] == "dataflow"
    ds = run.to_xarray()
    assert "attn" in ds and ds["attn"].sizes["step"] == 3
    assert main(["check", str(tmp_path / "df")]) == 0
    assert main(["info", str(tmp_path / "df")]) == 0


def test_backward_check_on_first_recorded_step_and_every_nth():
    m = nano()
    x, pad = batch()
    ran = []
    for _ in range(11):
        with Capture(m) as cap:
            m(x, pad).sum().backward()
        m.zero_grad()
        ran.append(bool(cap.adapter.residuals))
    assert ran == [True] + [False] * 9 + [True]


def test_two_forwards_in_one_capture_are_refused():
    """Gradient accumulation (two forwards, one backward) inside one Capture: one line, as for
    every adapter (capture one micro-step)."""
    m = nano()
    x, pad = batch()
    with pytest.raises(CaptureError, match="ran twice inside one Capture"):
        with Capture(m):
            (m(x, pad).sum() + m(x, pad).sum()).backward()


def test_cheap_tier_every_step_works_through_the_tracer(tmp_path):
    """RunRecorder's cheap tier (per-head statistics, no T×T kept) on a BLOOM recorded by dataflow:
    its logit_max is the full tier's of the same batch (the same observer contract)."""
    import json

    from dyntool.integrations import RunRecorder
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(R.FAMILIES["bloom"][1]()).eval()
    x = torch.randint(3, R.V, (2, 8), generator=torch.Generator().manual_seed(2))
    with RunRecorder(model, tmp_path, max_steps=2, every=0, name="c", batch="train", cheap_every=1) as rec:
        for step in range(2):
            with rec.train_step(step):
                loss = model(input_ids=x, labels=x).loss
                loss.backward()
            rec.log(step, loss=loss.item())
    model.zero_grad()
    with Capture(model) as cap:
        model(input_ids=x, labels=x).loss.backward()
    full = cap.compute()["logit_max"]
    rows = [json.loads(line) for line in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    cheap = torch.tensor([[rows[-1][f"logit_max/L{l}H{h}"] for h in range(2)] for l in range(2)])
    torch.testing.assert_close(cheap, full.float(), rtol=1e-5, atol=1e-7)


def test_model_whose_own_scores_are_nan_is_refused_in_one_line(float64_default):
    """MPT in float64 with left padding: its float32 softmax of float64's finfo.min gives NaN rows."""
    model = _model("mpt")
    with pytest.raises(CaptureError, match="the model's own scores are not finite here") as e:
        with Capture(model):
            model(**R.inputs("left")).loss.backward()
    assert "\n" not in str(e.value)


def test_compiled_recording_step_is_refused(monkeypatch):
    """Inside a compiled graph the tracer sees no eager calls: refused at the layer's first forward."""
    m = nano()
    x, pad = batch()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(CaptureError, match="a compiled recording step"):
        with Capture(m):
            m(x, pad)


def test_one_module_called_twice_in_a_forward_is_refused_in_one_line():
    m = nano(n_layer=1)
    m.blocks.append(m.blocks[0])                 # the same block (and attention) run twice per forward
    x, pad = batch()
    assert len(Capture(m).sites) == 1
    with pytest.raises(CaptureError, match="ran twice inside one Capture") as e:
        with Capture(m):
            m(x, pad).sum().backward()
    assert "\n" not in str(e.value)
