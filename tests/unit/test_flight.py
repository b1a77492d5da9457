"""The cheap tier (dyntool.flight) equals the full tier's reduction of the same step, in float64.

The independent computation is :class:`dyntool.capture.Capture` (itself checked against autograd
in tests/adapters): both observers see the same forward and backward through one adapter
(``FlightRecorder.alongside``), and every cheap statistic must equal the full tier's T × T
reduction (``full_tier_reduction``) to 1e-9."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from dyntool.capture import Capture
from dyntool.flight import STATS, FlightError, FlightRecorder, full_tier_reduction
from dyntool.record import metric_names as mn
from dyntool.train.config import ModelConfig
from dyntool.train.gpt import GPT

V, T = 50, 16


def gpt(attention="mhsa", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(attention=attention, n_layer=2, n_head=4, n_embd=32, **kw)
    m = GPT(cfg, V, T).double()
    with torch.no_grad():                 # trained-size logits: scale W_q, W_k
        for blk in m.h:
            blk.attn.c_attn.weight[: 64] *= 14.0
            if blk.attn.q_norm is not None:          # QK-norm undoes that: scale its gains
                blk.attn.q_norm.weight *= 2.5
                blk.attn.k_norm.weight *= 2.5
    return m


def batch(B=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


def both_tiers(model, run, max_block_mib=64.0, grad_scale=1.0, **kw):
    """One forward/backward with a Capture and a FlightRecorder on the same adapter."""
    cap = Capture(model, grad_scale=grad_scale, **kw)
    flight = FlightRecorder(model, grad_scale=grad_scale, max_block_mib=max_block_mib, **kw)
    with flight.alongside(cap):
        run(model).backward()
    model.zero_grad()
    return flight.result(), full_tier_reduction(cap.compute(dtype=torch.float64), cap.attrs["sites"])


def assert_equal_tiers(cheap, full, expect=STATS):
    assert set(cheap) == set(full)
    assert {n for n in expect if n != "sink_mass"} <= set(cheap)
    for name in full:
        assert cheap[name].dtype == torch.float64, name
        assert torch.isfinite(cheap[name]).all(), name
        torch.testing.assert_close(cheap[name], full[name], rtol=1e-9, atol=1e-12, msg=name)


def gpt_loss(x, y):
    return lambda m: m(x, y)[1]


@pytest.mark.parametrize("attention,kw", [("mhsa", {}), ("ls", dict(n_local=3, n_global=1, window=4)),
                                          ("qknorm", {})])
def test_dyntool_gpt_cheap_equals_full(attention, kw):
    m = gpt(attention, **kw)
    cheap, full = both_tiers(m, gpt_loss(*batch()), grad_scale=0.5)
    assert float(full["logit_max"].max()) > 5.0            # not a near-uniform toy
    assert_equal_tiers(cheap, full)


def test_row_blocks_change_nothing():
    """A budget of a few rows per block (and the causal key cut) gives the one-block numbers."""
    m = gpt()
    x, y = batch()
    one, _ = both_tiers(m, gpt_loss(x, y))
    per_row = 6 * 3 * 4 * T * 8 / 2**20                    # MiB of one row's temporaries
    many, full = both_tiers(m, gpt_loss(x, y), max_block_mib=3.5 * per_row)
    assert_equal_tiers(many, full)
    for n in one:
        torch.testing.assert_close(many[n], one[n], rtol=1e-12, atol=1e-14)


def count_host_reads(monkeypatch) -> list[str]:
    """The names of the tensor methods that read the host, appended as they are called."""
    reads = []
    for name in ("__bool__", "__int__", "__index__", "item", "tolist", "nonzero"):
        orig = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=orig, _n=name, **k: (reads.append(_n), _o(self, *a, **k))[1])
    return reads


def test_row_blocks_read_the_mask_once_per_call(monkeypatch):
    """The key range of every row block comes from one host read per layer and step, not from a
    ``nonzero``/``int``/``any`` per block (each a device sync on a GPU); the numbers stay exact,
    with a sliding window (keys cut at both ends) and with uniform rows present."""
    from dyntool import cheap_stats
    reads = count_host_reads(monkeypatch)
    B, nh, Tq, d = 2, 2, 24, 4
    g = torch.Generator().manual_seed(0)
    q, k, v, u = (torch.randn(B, nh, Tq, d, generator=g, dtype=torch.float64) for _ in range(4))
    allowed = torch.ones(Tq, Tq, dtype=torch.bool).tril() & torch.ones(Tq, Tq, dtype=torch.bool).triu(-5)
    allowed = allowed.expand(B, nh, Tq, Tq).clone()
    allowed[0, :, 3] = False                                   # an empty row, made uniform
    uniform = torch.zeros(B, nh, Tq, 1, dtype=torch.bool)
    uniform[0, :, 3] = True
    out = torch.randn(B, nh, Tq, d, dtype=torch.float64)
    per_row = 6 * B * nh * Tq * 8 / 2**20
    reads.clear()
    many = cheap_stats.Sums(nh, torch.float64, "cpu")
    cheap_stats.accumulate(many, q, k, v, out, u, allowed, 0.5, uniform=uniform, max_block_mib=2.5 * per_row)
    assert reads.count("tolist") == 1 and len(reads) == 1, reads          # 10 blocks, one read
    one = cheap_stats.Sums(nh, torch.float64, "cpu")
    cheap_stats.accumulate(one, q, k, v, out, u, allowed, 0.5, uniform=uniform, max_block_mib=64.0)
    for name, x in many.finish().items():
        torch.testing.assert_close(x, one.finish()[name], rtol=1e-12, atol=1e-14, msg=name)
    ends = cheap_stats.key_ends(allowed, None, Tq, Tq, 5)      # causal window: the block's last row
    assert ends == [5, 10, 15, 20, 24]


def test_gpu_path_reads_nothing_and_gives_the_same_numbers(monkeypatch):
    """Where host reads are off (a GPU: ``cheap_stats.host_reads``), the cheap tier of a model with
    causal blocks and an empty row reads nothing at all (no key cut, the uniform-row mask kept as a
    tensor) and gives the numbers the CPU path gives; run here with the predicate switched."""
    from dyntool import cheap_stats
    m = gpt()
    x, y = batch()
    per_row = 6 * 3 * 4 * T * 8 / 2**20
    cpu, full = both_tiers(m, gpt_loss(x, y), max_block_mib=3.5 * per_row)
    monkeypatch.setattr(cheap_stats, "host_reads", lambda device: False)
    reads = count_host_reads(monkeypatch)
    B, nh, Tq, d = 2, 2, 12, 4
    g = torch.Generator().manual_seed(0)
    q, k, v, u, out = (torch.randn(B, nh, Tq, d, generator=g, dtype=torch.float64) for _ in range(5))
    allowed = torch.ones(Tq, Tq, dtype=torch.bool).tril().expand(B, nh, Tq, Tq).clone()
    allowed[0, :, 3] = False
    uni = cheap_stats.uniform_rows(v, out, allowed, None, nh)
    sums = cheap_stats.Sums(nh, torch.float64, "cpu")
    cheap_stats.accumulate(sums, q, k, v, out, u, allowed, 0.5, uniform=uni, max_block_mib=6 * B * nh * Tq * 8 * 3 / 2**20)
    assert reads == [] and uni is not None and uni.shape == (B, nh, Tq, 1)
    monkeypatch.undo()
    monkeypatch.setattr(cheap_stats, "host_reads", lambda device: False)
    gpu_path, _ = both_tiers(m, gpt_loss(x, y), max_block_mib=3.5 * per_row)
    assert_equal_tiers(gpu_path, full)
    for n in cpu:
        torch.testing.assert_close(gpu_path[n], cpu[n], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_accumulate_in_fp32_per_block(monkeypatch, dtype):
    """bf16/fp16 inputs are cast block by block: the statistics equal the same call on the inputs
    up-cast first (the same arithmetic), with grouped keys, a half bias, sinks, uniform rows and a
    budget of a few rows; the blocks are sized by the fp32 temporaries, not the inputs' itemsize."""
    from dyntool import cheap_stats
    B, nh, n_kv, Tq, d = 2, 4, 2, 24, 8
    g = torch.Generator().manual_seed(3)
    q, u = (torch.randn(B, nh, Tq, d, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, n_kv, Tq, d, generator=g).to(dtype) for _ in range(2))
    bias = torch.randn(1, nh, Tq, Tq, generator=g).to(dtype)
    sinks = torch.randn(nh, generator=g).to(dtype)
    allowed = torch.ones(Tq, Tq, dtype=torch.bool).tril().expand(B, nh, Tq, Tq).clone()
    allowed[1, :, 2] = False
    uniform = torch.zeros(B, nh, Tq, 1, dtype=torch.bool)
    uniform[1, :, 2] = True
    rows = []
    orig = cheap_stats.key_ends
    monkeypatch.setattr(cheap_stats, "key_ends", lambda *a: (rows.append(a[-1]), orig(*a))[1])
    row = 6 * B * nh * Tq * 4 + B * nh * 2 * d * 4           # fp32 temporaries + a row's q, U cast
    kv = 2 * B * n_kv * Tq * d * 4                           # the keys and values a block casts
    res = {}
    for name, cast in (("half", lambda t: t), ("fp32", lambda t: t.float())):
        sums = cheap_stats.Sums(nh, torch.float32, "cpu")
        cheap_stats.accumulate(sums, cast(q), cast(k), cast(v), None, cast(u), allowed, 0.3, bias=cast(bias),
                               softcap=5.0, sinks=cast(sinks), uniform=uniform, max_block_mib=(3.5 * row + kv) / 2**20,
                               grad_scale=0.5)
        res[name] = sums.finish()
    assert rows == [3, 4], rows          # sized in fp32 (an itemsize of 2 would give 8); fp32 casts no k, v
    for n, x in res["half"].items():
        assert x.dtype == torch.float32 and torch.isfinite(x).all(), n
        torch.testing.assert_close(x, res["fp32"][n], rtol=1e-6, atol=1e-7, msg=n)


def test_half_model_reduces_its_own_dtype(monkeypatch):
    """A bf16 model: the recorder hands q, k, v, U to the reduction in bf16 (no whole fp32 copy
    held through the backward) and its statistics are fp32, equal to the reduction of the same
    tensors up-cast first (≤ 1e-6 relative)."""
    from dyntool import cheap_stats
    m = gpt().to(torch.bfloat16)
    calls = []
    orig = cheap_stats.accumulate

    def spy(sums, q, k, v, o, u, *a, **kw):
        calls.append((q.clone(), k.clone(), v.clone(), u.clone(), a, kw))
        orig(sums, q, k, v, o, u, *a, **kw)
    monkeypatch.setattr(cheap_stats, "accumulate", spy)
    flight = FlightRecorder(m, grad_scale=0.5, max_block_mib=0.03)        # 3-row blocks
    with flight:
        m(*batch())[1].backward()
    res = flight.result()
    assert len(calls) == 2 and all(t.dtype == torch.bfloat16 for c in calls for t in c[:4])
    ref = []
    for q, k, v, u, a, kw in calls:
        sums = cheap_stats.Sums(q.shape[1], torch.float32, "cpu")
        orig(sums, q.float(), k.float(), v.float(), None, u.float(), *a, **kw)
        ref.insert(0, sums.finish())              # the backward reaches the last layer first
    for n, x in res.items():
        assert x.dtype == torch.float32 and torch.isfinite(x).all(), n
        torch.testing.assert_close(x, torch.stack([r[n] for r in ref]), rtol=1e-6, atol=1e-7, msg=n)


def test_budget_below_one_row_is_refused():
    m = gpt()
    with pytest.raises(ValueError, match="too small for one query row"):
        both_tiers(m, gpt_loss(*batch()), max_block_mib=1e-6)
    with pytest.raises(FlightError, match="max_block_mib"):
        FlightRecorder(m, max_block_mib=-1)


def test_micro_steps_accumulate_and_references_drop():
    """Two forwards/backwards inside one recorder = one forward over both batches; q/k/v are
    not kept past the backward."""
    m = gpt()
    (x1, y1), (x2, y2) = batch(2, seed=1), batch(1, seed=2)
    flight = FlightRecorder(m)
    seen = []

    class Spy:
        wants_grads = False

        def observe(self, site, q, *a, **kw):
            seen.append(weakref.ref(q))
    with flight:
        for x, y in ((x1, y1), (x2, y2)):
            m(x, y)[1].backward()
    two = flight.result()
    m.zero_grad()
    flight.reset()
    with flight:
        m(torch.cat([x1, x2]), torch.cat([y1, y2]))[1].backward()
    joint = flight.result()
    # U of each micro-batch is ∂(its own mean loss)/∂out; the joint mean loss scales U by B_i/B
    for n in ("attn_entropy", "score_max", "logit_max", "column_max", "column_entropy"):
        torch.testing.assert_close(two[n], joint[n], rtol=1e-10, atol=1e-12, msg=n)
    m.zero_grad()
    core = m.h[0].attn.core
    core.attach(spy := Spy())
    with flight:
        m(x1, y1)[1].backward()
    core.detach(spy)
    gc.collect()
    # the forward's q is referenced by nobody once the step is over (autograd and the recorder let go)
    assert seen and all(r() is None for r in seen)


def test_metrics_names_and_pending_backward():
    m = gpt()
    flight = FlightRecorder(m)
    with flight:
        m(*batch())[1].backward()
    row = flight.metrics()
    assert row[mn.head("score_grad_norm", 1, 3)] > 0
    assert mn.parse("column_entropy/L0H2") == mn.MetricName("column_entropy", "head", 0, 2)
    assert len(row) == 10 * 2 * 4
    flight.reset()
    with flight:
        m(*batch())                              # no backward
    with pytest.raises(FlightError, match="never received their gradient"):
        flight.result()
    flight.reset()
    with torch.no_grad(), flight:               # evaluation forwards are not observed
        m(*batch())
    with pytest.raises(FlightError, match="no attention ran"):
        flight.result()


# ------------------------------------------------------------------ Hugging Face (tiny configs)
@pytest.mark.parametrize("kind,impl", [("gpt2", "sdpa"), ("gpt2", "eager"), ("llama", "sdpa"),
                                       ("llama", "eager"), ("mistral", "sdpa"), ("gemma2", "eager"),
                                       ("gpt_oss", "eager"), ("t5", "sdpa")])
def test_hf_cheap_equals_full(kind, impl):
    """GPT-2; Llama with GQA and padding; Mistral's sliding window; Gemma-2's soft-cap;
    gpt-oss's sinks; T5's position bias (encoder–decoder, cross-attention of another length)."""
    from tests.adapters.hf_reference import float64_softmax, make_inputs, make_model
    with float64_softmax():
        model = make_model(kind, impl)
        inputs = make_inputs(kind)
        cheap, full = both_tiers(model, lambda m: m(**inputs).loss)
    assert float(full["logit_max"].max()) > 20.0
    assert_equal_tiers(cheap, full)
    if kind == "gpt_oss":
        assert "sink_mass" in cheap and float(cheap["sink_mass"].max()) > 0


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_hf_left_padding_rows_follow_the_model(impl):
    """Rows with no visible key: 0 under SDPA, uniform under eager's additive mask; the cheap
    tier reads which from the output, as the full tier's self-check does."""
    from tests.adapters.hf_reference import float64_softmax, make_inputs, make_model
    with float64_softmax():
        model = make_model("llama", impl)
        inputs = make_inputs("llama")
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[1, :3] = 0
        inputs.update(attention_mask=mask, labels=inputs["input_ids"].masked_fill(mask == 0, -100))
        cheap, full = both_tiers(model, lambda m: m(**inputs).loss)
    assert_equal_tiers(cheap, full)


def test_sdpa_module_and_transformerlens():
    from tests.adapters.test_sdpa_tlens import NanoAttention
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, 16, dtype=torch.float64)
            self.attn = torch.nn.ModuleList(NanoAttention(16, 2, window=w).double() for w in (None, 3))
            self.head = torch.nn.Linear(16, V, dtype=torch.float64)

        def forward(self, x):
            h = self.emb(x)
            for a in self.attn:
                h = h + a(h)
            return self.head(h)
    net = Net()
    x, y = batch()
    loss = lambda m: torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())   # noqa: E731
    assert_equal_tiers(*both_tiers(net, loss))


@pytest.mark.parametrize("kw", [{}, dict(positional_embedding_type="rotary", n_key_value_heads=2)])
def test_transformerlens(kw):
    from tests.adapters.test_sdpa_tlens import _tl_model
    model = _tl_model(**kw)
    x = torch.randint(23, (2, 8), generator=torch.Generator().manual_seed(0))
    cheap, full = both_tiers(model, lambda m: m(x, return_type="loss"))
    assert_equal_tiers(cheap, full)


@pytest.mark.parametrize("padding", [False, True])
def test_torch_multihead_attention_cheap_equals_full(padding):
    """torch's nn.MultiheadAttention returns out_proj(o) only: the cheap tier takes U through the
    adapter's grad_map and the empty-row decision from the self-check (it raised on out_map before)."""
    nn = torch.nn
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2,
                                enable_nested_tensor=False).double()
    with torch.no_grad():
        for layer in enc.layers:                                # trained-size logits
            layer.self_attn.in_proj_weight[:32] *= 12.0
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    kw = dict(mask=nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64), is_causal=True)
    if padding:
        kw["src_key_padding_mask"] = torch.tensor([[False] * 7, [False] * 5 + [True] * 2, [False] * 7])
    cheap, full = both_tiers(enc, lambda m: m(x, **kw).pow(2).sum())
    assert float(full["logit_max"].max()) >= 20.0                # trained-size logits
    assert_equal_tiers(cheap, full)
