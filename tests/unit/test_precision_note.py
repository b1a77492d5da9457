"""The precision note of `dyntool check` (record/precision.py) against a float64 recomputation of
∂L/∂S = α ⊙ (B − E_α[b]) on synthetic heads: exact zeros (U_i = 0, one visible key) are no alarm,
a genuinely flushed gradient is counted exactly, and the advice never names the run's own setting."""
from __future__ import annotations

import numpy as np
import pytest

from dyntool.record.precision import underflow_report

T, DV = 6, 3


def _head(grad_dtype="float32", seed=0):
    """One step of one head: causal α, U with row T-1 zero (no loss there), B = U Vᵀ, exact ∂L/∂S."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(T, T))
    s[np.triu_indices(T, 1)] = -np.inf
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)                                        # (query, key); row 0: α = 1
    u = rng.normal(size=(T, DV)) * 1e-3
    u[-1] = 0                                                            # the loss does not read T-1
    b = u @ rng.normal(size=(T, DV)).T                                   # (query, key)
    g = a * (b - (a * b).sum(-1, keepdims=True))
    shape = (1, 1, 1, 1)                                                 # (step, layer, head, seq)
    return {"attn": a.reshape(shape + a.shape).astype(np.float32),
            "compat": b.reshape(shape + b.shape).astype(grad_dtype),
            "upstream": u.reshape(shape + u.shape).astype(grad_dtype),
            "score_grad": g.reshape(shape + g.shape).astype(grad_dtype)}


class Store:
    def __init__(self, arrays, keep):
        self.arrays = {k: v for k, v in arrays.items() if k in keep}


ALL = ("attn", "compat", "upstream", "score_grad")


@pytest.mark.parametrize("keep", [ALL, ("attn", "upstream", "score_grad"), ("attn", "score_grad")])
def test_exact_zeros_are_no_alarm(keep):
    arrays = _head()
    g = arrays["score_grad"][0, 0, 0, 0]
    assert (g[0] == 0).all() and (g[-1] == 0).all() and (arrays["attn"][0, 0, 0, 0][-1] > 0).all()
    assert underflow_report(Store(arrays, keep)) is None


@pytest.mark.parametrize("keep", [ALL, ("attn", "upstream", "score_grad"), ("attn", "score_grad")])
def test_a_genuine_underflow_is_counted_exactly(keep):
    arrays = _head("float16")
    g = arrays["score_grad"]
    flushed = [(2, 0), (3, 1), (4, 4)]                                   # nonzero in the exact value
    for q, k in flushed:
        assert g[0, 0, 0, 0, q, k] != 0
        g[0, 0, 0, 0, q, k] = 0
    note = underflow_report(Store(arrays, keep))
    live = sum(range(2, T))                                              # rows 1..T-2: 2+3+4+5 keys
    assert note is not None and note.startswith(f"score_grad stored as float16: 3 of {live} entries"), note
    assert "record.grad_dtype=float32" in note


def test_float32_run_is_never_told_to_use_float32():
    arrays = _head("float32")
    arrays["score_grad"][0, 0, 0, 0, 3, 1] = 0
    note = underflow_report(Store(arrays, ALL))
    assert note is not None and "1 of" in note and "grad_dtype" not in note, note
