"""Is what reached disk as precise as what was computed?  The gradient quantities of a real LM are
small (median |∂L/∂S| ≈ 1.5e-5 on the HF Trainer example), below float16's normal range (6.1e-5):
stored in float16, 77 % of them lose digits and some become exactly 0.  ``record.grad_dtype``
(float32 by default) avoids it; :func:`underflow_report` measures it on a recorded run, for
``dyntool check``: the stored ∂L/∂S entries that are exactly 0 where they should not be.

Many zeros are exact, not lost: a query row whose upstream gradient U_i is 0 (a position the loss
does not read, e.g. the last one of a causal LM) has ∂L/∂S = 0, and so has a row that sees one key
(α = 1, b − E_α[b] = 0).  So the expected value is recomputed in float64 from what was stored,
∂L/∂S = α ⊙ (B − E_α[b]) with B = ``compat``, and a zero counts only where that is nonzero.
Without B, rows whose stored U_i is 0 (or, without U either, whose stored row is all 0) and rows
with one visible key are left out, and a zero elsewhere under α > 0 counts."""
from __future__ import annotations

import numpy as np


def _lost(a, g, b=None, u=None) -> tuple[int, int]:
    """(stored zeros that should not be, entries that could have been) over one step's rows.
    a, g, b: (..., query, key) α, stored ∂L/∂S, B; u: (..., query, d_v) U — all float64."""
    live = a > 0
    if b is not None:                                        # the routing law, recomputed
        expected = a * (b - (a * b).sum(-1, keepdims=True))  # (..., query, key)
        should = live & (expected != 0)
    else:
        one_key = live.sum(-1, keepdims=True) <= 1           # (..., query, 1): α = 1, gradient 0
        if u is not None:
            no_grad = ~np.any(u != 0, axis=-1, keepdims=True)       # U_i = 0: the loss skips row i
        else:
            no_grad = ~np.any(g != 0, axis=-1, keepdims=True)       # can't tell: assume U_i = 0
        should = live & ~one_key & ~no_grad
    return int((should & (g == 0)).sum()), int(should.sum())


def _read(arrays, name, i):
    return np.asarray(arrays[name][i], dtype=np.float64) if name in arrays and arrays[name].shape[0] > i else None


def underflow_report(store, max_steps: int = 4) -> str | None:
    """One line about score gradients flushed to zero on disk, or None when there are none to
    report (no score_grad, or none lost).  Reads at most ``max_steps`` recorded steps (the last)."""
    arrays = store.arrays() if callable(getattr(store, "arrays", None)) else store.arrays
    if "score_grad" not in arrays or "attn" not in arrays:
        return None
    ds, attn = arrays["score_grad"], arrays["attn"]
    n = min(ds.shape[0], attn.shape[0])
    if n == 0:
        return None
    lost = seen = 0
    for i in range(max(0, n - max_steps), n):
        a, g = _read(arrays, "attn", i), _read(arrays, "score_grad", i)
        b, u = _read(arrays, "compat", i), _read(arrays, "upstream", i)
        if b is not None and b.shape != a.shape:             # a different crop: not comparable
            b = None
        if u is not None and u.shape[:-1] != a.shape[:-1]:
            u = None
        k, m = _lost(a, g, b, u)
        lost, seen = lost + k, seen + m
    if not lost:
        return None
    dtype = str(getattr(ds, "dtype", "?"))
    # advise only a setting the run does not have: float32 is the widest record.grad_dtype
    fix = ("record with record.grad_dtype=float32 to keep them" if dtype == "float16"
           else f"they are below what {dtype} holds; scale the recorded loss up to keep them")
    return (f"score_grad stored as {dtype}: {lost} of {seen} entries with nonzero ∂L/∂S "
            f"({100 * lost / max(seen, 1):.1f} %) are exactly 0 on disk (underflow); {fix}")
