"""Hugging Face decoders through the fused kernel (the ``dyntool_fused`` registry entry), under the
interpreter: a float32 step's statistics and gradients equal the eager path's on the float64 copy
of the model (≤ 1e-5 relative), for GPT-2, Llama (GQA, left padding), Mistral (sliding window),
Gemma-2 (soft-cap) and gpt-oss (sinks, with their gradient)."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")

from dyntool.flight import STATS, FlightError, FlightRecorder  # noqa: E402
from tests.adapters.hf_reference import float64_softmax, make_inputs, make_model  # noqa: E402


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def step(model, inputs, kernel, amp: torch.dtype | None = None):
    """One recorded step (its forward under CPU autocast to ``amp`` when given): the recorder, its
    statistics, all gradients as one float64 vector, the loss."""
    flight = FlightRecorder(model, kernel=kernel)
    with flight:
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            loss = model(**inputs).loss
        loss.backward()
    grads = torch.cat([p.grad.flatten().double() for _, p in sorted(model.named_parameters()) if p.grad is not None])
    model.zero_grad()
    return flight, flight.result(), grads, loss.detach()


@pytest.mark.parametrize("kind,impl,left", [("gpt2", "sdpa", False), ("llama", "sdpa", True),
                                            ("mistral", "sdpa", False), ("gemma2", "eager", False),
                                            ("gpt_oss", "eager", True)])
def test_hf_fused_equals_eager(kind, impl, left):
    with float64_softmax():
        m64 = make_model(kind, impl)
        m32 = copy.deepcopy(m64).float()
        inputs = make_inputs(kind)
        if left:                                   # left padding: rows with no visible key
            mask = torch.ones_like(inputs["attention_mask"])
            mask[1, :2] = 0
            inputs = dict(inputs, attention_mask=mask, labels=inputs["input_ids"].masked_fill(mask == 0, -100))
        flight, fused, g32, _ = step(m32, inputs, "fused")
        assert set(flight.paths().values()) == {"fused"}
        assert m32.config._attn_implementation == impl            # restored on exit
        _, eager, g64, _ = step(m64, inputs, "eager")
    assert float(eager["logit_max"].max()) > 20.0
    assert set(fused) == set(eager)
    for n in STATS:
        if n in eager:
            assert rel(fused[n], eager[n]) <= 1e-5, (n, rel(fused[n], eager[n]))
    assert rel(g32, g64) <= 1e-5                   # gpt-oss: the sinks' gradient included


def test_hf_unverified_model_type_refused():
    m = make_model("qwen3", "sdpa").float()
    with pytest.raises(FlightError, match="model type qwen3 is not verified"):
        FlightRecorder(m, kernel="fused")


def test_hf_llama_under_autocast_takes_the_autocast_dtype():
    """Under autocast Llama's rotary embedding leaves q, k in float32 beside a half v: the fused site
    casts them to the autocast dtype as SDPA does, and the step's loss and gradients stay those of
    the model's own half-precision attention."""
    from tests.kernels.test_flight_fused import input_dtypes
    m = make_model("llama", "sdpa").float()
    inputs = make_inputs("llama")
    got, seen = {}, []
    for kernel in ("eager", "fused"):
        with input_dtypes(seen if kernel == "fused" else []):
            flight, stats, grads, loss = step(m, inputs, kernel, amp=torch.float16)
        if kernel == "fused":
            assert set(flight.paths().values()) == {"fused"}
        got[kernel] = (loss, grads, stats)
    assert seen and set(seen) == {(torch.float16,) * 3}
    (le, ge, se), (lf, gf, sf) = got["eager"], got["fused"]
    assert rel(lf, le) <= 1e-3 and rel(gf, ge) <= 2e-2
    assert rel(sf["logit_max"], se["logit_max"]) <= 1e-2
