"""Is what reached disk as precise as what was computed?  The gradient quantities of a real LM are
small (median |∂L/∂S| ≈ 1.5e-5 on the HF Trainer example), below float16's normal range (6.1e-5):
stored in float16, 77 % of them lose digits and some become exactly 0.  ``record.grad_dtype``
(float32 by default) avoids it; :func:`underflow_report` measures it on a recorded run, for
``dyntool check``: the share of entries with α > 0 whose stored ∂L/∂S is exactly 0 (the routing
law makes ∂L/∂S = α (b − E_α[b]) nonzero wherever α is, except on measure-zero ties)."""
from __future__ import annotations

import numpy as np


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
        a, g = np.asarray(attn[i], dtype=np.float64), np.asarray(ds[i], dtype=np.float64)
        live = a > 0
        seen += int(live.sum())
        lost += int((live & (g == 0)).sum())
    if not lost:
        return None
    dtype = getattr(ds, "dtype", "?")
    return (f"score_grad stored as {dtype}: {lost} of {seen} entries with α > 0 ({100 * lost / max(seen, 1):.1f} %) "
            "are exactly 0 on disk (underflow); record with record.grad_dtype=float32 to keep them")
