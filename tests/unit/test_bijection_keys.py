"""The wind tunnel's ``single`` key set (key_orth/single/L{l}, dyntool/sims/bijection_analysis.py, issue 46):
the keys of the V key tokens each fed alone at position 0.  Layer 0's is computed here independently
from the weights in float64 (ln_1 of token + position-0 embedding, then the head's rows of W_K)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dyntool import config
from dyntool.manifold import random_abs_cos
from dyntool.sims.bijection import BijectionConfig, build_model, heldout
from dyntool.sims.bijection_analysis import analyze


def _layer0_single(model, V: int) -> tuple[float, float]:
    """(mean |cos|, mean cos) over off-diagonal pairs of every head's keys, by hand in float64."""
    m = model.double()
    x = m.h[0].ln_1(m.wte.weight[:V] + m.wpe.weight[0])                      # (V, C)
    C, nh = x.shape[1], m.h[0].attn.n_head
    k = (x @ m.h[0].attn.c_attn.weight[C:2 * C].T).view(V, nh, C // nh).transpose(0, 1)   # (nh, V, hs)
    cos = F.normalize(k, dim=-1) @ F.normalize(k, dim=-1).transpose(1, 2)
    off = cos[:, ~torch.eye(V, dtype=torch.bool)]
    return off.abs().mean().item(), off.mean().item()


def test_single_token_keys_match_a_float64_computation_and_sit_above_random_at_init():
    cfg = config.load(BijectionConfig, "bijection", "ci", values={"model.n_embd": 32, "model.n_head": 2})
    model = build_model(cfg).eval()
    tok, _ = heldout(cfg)
    got = analyze(model, tok[:8], cfg.V, r2=False)["metrics"]
    with torch.no_grad():
        want_abs, want_signed = _layer0_single(model, cfg.V)
    assert got["key_orth/single/L0"] == pytest.approx(want_abs, abs=1e-6)
    assert got["key_orth/single_signed/L0"] == pytest.approx(want_signed, abs=1e-6)
    # the shared position-0 embedding: well above the random level the other two sets read at init
    hs = cfg.model.n_embd // cfg.model.n_head
    assert got["key_orth/vocab/L0"] < 1.5 * random_abs_cos(hs) < got["key_orth/single/L0"]
    assert np.isfinite([got[f"key_orth/single/L{l}"] for l in range(cfg.model.n_layer)]).all()
