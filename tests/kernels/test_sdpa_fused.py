"""nanoGPT-style modules (``F.scaled_dot_product_attention`` themselves) through the fused kernel,
under the interpreter.  The statistics of a float32 step equal ``full_tier_reduction`` of a
float64 Capture of the *same* step (q, k, v, U as the model produced them; ``alongside``) to
≤ 1e-5 relative: that isolates the kernel from the float32 model's own rounding, which moves a
cancelling sum such as Σ E_α[b] by more than 1e-5 between a float32 and a float64 model.  The
gradients equal the float64 model's.  A call with an ``attn_mask`` runs SDPA and is still
recorded (eagerly)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from dyntool.adapters import sdpa
from dyntool.capture import Capture
from dyntool.flight import STATS, FlightRecorder, full_tier_reduction
from tests.adapters.test_sdpa_tlens import Nano, WrappedAttention


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def step(model, x, y, kernel):
    flight, cap = FlightRecorder(model, kernel=kernel), Capture(model)
    with flight.alongside(cap):
        model(x, y).backward()
    g = torch.cat([p.grad.flatten().double() for _, p in sorted(model.named_parameters())])
    model.zero_grad()
    return flight, flight.result(), full_tier_reduction(cap.compute(dtype=torch.float64), cap.attrs["sites"]), g


@pytest.mark.parametrize("how", ["auto", "wrap", "window"])
def test_sdpa_fused_equals_eager(how):
    torch.manual_seed(0)
    kw = dict(attn_cls=WrappedAttention) if how == "wrap" else dict(window=5) if how == "window" else {}
    m = Nano(C=32, nh=2, **kw)
    with torch.no_grad():                         # trained-size logits
        for b in m.blocks:
            b.c_attn.weight[:64] *= 12.0
    m64 = copy.deepcopy(m).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 23, (2, 20), generator=g), torch.randint(0, 23, (2, 20), generator=g)
    flight, fused, full, g32 = step(m, x, y, "fused")
    assert set(flight.paths().values()) == {"fused"}
    assert F.scaled_dot_product_attention is sdpa._REAL and not sdpa.ARMED
    assert float(full["logit_max"].max()) > 20.0
    assert set(fused) == set(full)
    for n in STATS:
        if n in full:
            assert rel(fused[n], full[n]) <= 1e-5, (n, rel(fused[n], full[n]))
    *_, g64 = step(m64, x, y, "eager")
    assert rel(g32, g64) <= 1e-5
