"""Frame–precision measures without endpoints (arXiv 2512.22473: figure F7, diagnostic D10).

The earlier F7 divided each curve by its own distance to the FINAL state, so every curve fell
from 1 to 0 by construction and "who settles first" was partly an artefact of the choice of
endpoint.  These measures use only neighbouring recorded steps and the gradients of that step:

* ``attn_drift``  mean over query rows of JS(α_i(t) ‖ α_i(t−Δ)) in nats, divided by the number
  of training steps in the interval (a rate; rows renormalised over their visible entries);
* ``value_drift`` ‖V(t) − V(t−Δ)‖ / ‖V(t−Δ)‖ per training step (relative change of all values);
* ``share_routing/values/readout`` gradient-energy shares ‖∂L/∂W_{Q,K}‖², ‖∂L/∂W_V‖²,
  ‖∂L/∂W_O‖² over their sum at step t (D10; the first-order split of −ΔL under equal learning
  rates, arXiv 2512.22473, first-order loss change).

Pure numpy on arrays, so the sims, the bijection wind tunnel and the app can all call it:
``interval_measures(steps, attn=..., values=..., grad_sq=...)``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..stats import js_rows

__all__ = ["interval_measures", "energy_shares", "describe_change"]


def _rows(a: np.ndarray) -> np.ndarray:
    """Rows renormalised to sum 1 over their finite, non-negative entries (NaN/masked -> 0)."""
    a = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    s = a.sum(-1, keepdims=True)
    return np.divide(a, s, out=np.zeros_like(a), where=s > 0)


def energy_shares(grad_sq: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{group: squared gradient norm per step} -> {share_group: fraction of their sum}."""
    total = sum(np.asarray(v, dtype=np.float64) for v in grad_sq.values())
    return {f"share_{k}": np.divide(np.asarray(v, dtype=np.float64), total,
                                    out=np.full_like(total, np.nan), where=total > 0)
            for k, v in grad_sq.items()}


def interval_measures(steps, attn: np.ndarray | None = None, values: np.ndarray | None = None,
                      grad_sq: dict[str, np.ndarray] | None = None,
                      shares: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """One row per recorded step t (after the first): the interval [t−Δ, t] it closes.

    ``steps`` (S,) recorded training steps; ``attn`` (S, queries, keys) (a crop or a pooled
    overview; masked entries 0 or NaN); ``values`` (S, positions, d); ``grad_sq``
    {"routing"|"values"|"readout": (S,)} squared gradient norms, or ready ``shares`` (S,) each.
    Columns: step, interval (Δ in training steps), attn_drift, value_drift, share_* (at t).
    """
    steps = np.asarray(steps, dtype=np.int64)
    S = len(steps)
    if S < 2:
        return pd.DataFrame(columns=["step", "interval"])
    dt = np.diff(steps).astype(np.float64)
    out = {"step": steps[1:], "interval": dt.astype(np.int64)}
    if attn is not None:
        A = _rows(attn[:S])
        keep = (A[1:].sum(-1) > 0) & (A[:-1].sum(-1) > 0)                  # (S-1, rows)
        js = js_rows(A[1:], A[:-1])
        js = np.where(keep, js, np.nan)
        with np.errstate(invalid="ignore"):
            out["attn_drift"] = np.nanmean(js, axis=-1) / dt
    if values is not None:
        V = np.nan_to_num(np.asarray(values[:S], dtype=np.float64)).reshape(S, -1)
        base = np.linalg.norm(V[:-1], axis=1)
        out["value_drift"] = np.divide(np.linalg.norm(V[1:] - V[:-1], axis=1), base,
                                       out=np.full(S - 1, np.nan), where=base > 0) / dt
    if grad_sq is not None:
        shares = energy_shares(grad_sq)
    for k, v in (shares or {}).items():
        k = k if k.startswith("share_") else f"share_{k}"
        out[k] = np.asarray(v, dtype=np.float64)[1:S]
    return pd.DataFrame(out)


def describe_change(steps, y, what: str, fmt: str = "{:.2f}") -> str:
    """A caption phrase written from the data: 'what rose from a (step s0) to b (step s1)'."""
    steps, y = np.asarray(steps), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(y)
    if ok.sum() < 2:
        return f"{what}: not enough data"
    s, v = steps[ok], y[ok]
    verb = "rose" if v[-1] > v[0] else "fell" if v[-1] < v[0] else "stayed"
    lo, hi = int(np.argmin(v)), int(np.argmax(v))
    extra = ""
    if verb == "rose" and lo not in (0,) and v[lo] < v[0]:
        extra = f", after a low of {fmt.format(v[lo])} at step {s[lo]}"
    if verb == "fell" and hi not in (0,) and v[hi] > v[0]:
        extra = f", after a high of {fmt.format(v[hi])} at step {s[hi]}"
    return (f"{what} {verb} from {fmt.format(v[0])} (step {s[0]}) to {fmt.format(v[-1])} "
            f"(step {s[-1]}){extra}")


def settle_step(steps, y, frac: float = 0.1):
    """First step from which ``y`` (a drift rate) stays below ``frac`` × its maximum for the rest of
    the record, or None if it never does (the last point alone does not count as settled)."""
    steps, y = np.asarray(steps), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(y)
    s, v = steps[ok], y[ok]
    if len(v) < 2:
        return None
    below = v < frac * v.max()
    for i in range(len(v) - 1):
        if below[i:].all():
            return int(s[i])
    return None


def ordering_phrase(steps, attn, values, arm: str, frac: float = 0.1) -> str:
    """Caption phrase, from the data: does attention drift settle before value drift?"""
    a, v = settle_step(steps, attn, frac), settle_step(steps, values, frac)
    pk = int(np.asarray(steps)[np.nanargmax(np.asarray(attn, dtype=np.float64))]) if np.isfinite(attn).any() else None
    def settled(name, x):
        return (f"{name} stays below {frac:.0%} of its peak from step {x}" if x is not None else
                f"{name} never stays below {frac:.0%} of its peak within the record")
    verdict = ("attention settles first" if a is not None and (v is None or a < v) else
               "attention does NOT settle before the values")
    return (f"{arm}: attention drift peaks at step {pk}; {settled('attention drift', a)}; "
            f"{settled('value drift', v)}: {verdict}")
