"""The atlas's event rules, fixed before any atlas run (docs/atlas.md, "Event rules").

Every rule reads the per-step series of one run (a metrics frame: ``step`` and the atlas columns)
and returns numbers or None ("no event"); nothing here looks at a result to choose a parameter.

- **forward event** of a head for a score x (first_mass: a sink; prev_token; induction): the first
  step s from which x stays ≥ θ for ``hold`` consecutive probed steps (each series on the steps it
  was measured on, ``hold`` of its own count), with
  θ = max(0.3, 3 × chance, x(step 0) + 0.1): above Gu's ε, above the uniform-attention level and
  above where the head started.
- **backward event** for the same head: the first step from which the driving advantage
  (first_adv for a sink, prev_adv, copy_adv) stays > 0 for ``hold`` probed steps.
- **lag** = forward step − backward step (> 0: the backward quantity moved first); per run the
  mean over heads having both events and the share with lag > 0; the **shuffled-head null** pairs
  each forward event with the backward event of a randomly permuted head (``n_perm``
  permutations, seed 0): p = share of permutations whose mean |lag| is ≤ the observed one (small
  p: a head's backward event sits closer to its own forward event than to another head's).
  Fewer than 2 paired heads: no test.
- **loss bump**: the training loss smoothed by a centred running median (window w = max(5, n/50));
  size = max_s (smooth[s] − min smooth[:s]); a bump when size > 0.05 nats and > 3 × the MAD of the
  residual (loss − smooth).
- **repeat phase change**: the step of the steepest fall of the smoothed repeat gap
  (atlas_rep_gap, loss on the repeat minus on the first half), over a span of w steps; reported
  with its fall and 3 × the residual MAD beside it.
"""
from __future__ import annotations

import numpy as np

from ..record import metric_names as mn

ABS, FACTOR, MARGIN = 0.3, 3.0, 0.1
GU_EPS = 0.3            # Gu et al.'s ε for the sink metric
OURS_FACTOR = 3.0       # our ε: this multiple of first_mass's chance level at the probe's T
BUMP_NATS = 0.05
N_PERM = 1000

# each phenomenon: (forward score base, chance key, driving advantage base)
PHENOMENA = {"sink": ("atlas_first_mass", "first_mass", "atlas_first_adv"),
             "prev_token": ("atlas_prev_token", "prev_token", "atlas_prev_adv"),
             "induction": ("atlas_induction", "induction", "atlas_copy_adv")}


# chance levels: uniform attention over the allowed (causal) keys, per score (atlas_scores.py)
def chance_first_mass(T: int) -> float:
    return sum(1.0 / (i + 1) for i in range(T)) / T


def chance_prev_token(T: int) -> float:
    return sum(1.0 / (i + 1) for i in range(1, T)) / (T - 1)


def chance_induction(L: int) -> float:
    return sum(1.0 / (i + 1) for i in range(L, 2 * L)) / L


def chance_levels(T: int) -> dict:
    """The chance levels of a run with context T (repeats of L = T // 2) and both sink ε."""
    return {"first_mass": chance_first_mass(T), "prev_token": chance_prev_token(T),
            "induction": chance_induction(T // 2), "eps_gu": GU_EPS, "eps_ours": OURS_FACTOR * chance_first_mass(T)}


def hold_for(n_rows: int) -> int:
    return max(3, -(-2 * n_rows // 100))          # 3 probed steps or 2 % of them


def threshold(x0: float, chance: float) -> float:
    return max(ABS, FACTOR * chance, x0 + MARGIN)


def first_sustained(steps: np.ndarray, ok: np.ndarray, hold: int) -> int | None:
    """The first step from which ``ok`` is True for ``hold`` consecutive rows (NaN rows are False)."""
    run = 0
    for i, v in enumerate(ok):
        run = run + 1 if v else 0
        if run >= hold:
            return int(steps[i - hold + 1])
    return None


def head_events(fwd_steps: np.ndarray, fwd: np.ndarray, bwd_steps: np.ndarray, bwd: np.ndarray,
                chance: float) -> dict:
    """One head's forward and backward events, each on the steps its series was measured on (the
    forward scores and the gradient side have their own schedules) with its own ``hold``."""
    th = threshold(float(fwd[0]), chance)
    f = first_sustained(fwd_steps, np.nan_to_num(fwd, nan=-np.inf) >= th, hold_for(len(fwd_steps)))
    b = first_sustained(bwd_steps, np.nan_to_num(bwd, nan=-np.inf) > 0, hold_for(len(bwd_steps)))
    return {"threshold": th, "start": float(fwd[0]), "peak": float(np.nanmax(fwd)), "last": float(fwd[-1]),
            "forward_step": f, "backward_step": b}


def lag_test(fwd_steps: list, bwd_steps: list, n_perm: int = N_PERM, seed: int = 0) -> dict:
    """The lags of heads with both events, and whether a head's backward event is tied to its own
    forward event: mean |lag| against the shuffled-head null (each forward event paired with the
    backward event of a randomly permuted head; the *signed* mean lag is the same under every
    permutation when every head has both events, so it cannot be the statistic)."""
    pairs = [(f, b) for f, b in zip(fwd_steps, bwd_steps) if f is not None and b is not None]
    lags = [f - b for f, b in pairs]
    out = {"n_forward": sum(f is not None for f in fwd_steps), "n_paired": len(pairs),
           "mean_lag": float(np.mean(lags)) if lags else None,
           "share_backward_first": float(np.mean([x > 0 for x in lags])) if lags else None,
           "mean_abs_lag": float(np.mean(np.abs(lags))) if lags else None, "null_mean_abs": None, "p": None}
    if len(pairs) < 2:
        return out
    rng = np.random.default_rng(seed)
    fi = [i for i, f in enumerate(fwd_steps) if f is not None]
    null = []
    for _ in range(n_perm):
        perm = rng.permutation(len(bwd_steps))
        d = [abs(fwd_steps[i] - bwd_steps[perm[i]]) for i in fi if bwd_steps[perm[i]] is not None]
        if d:
            null.append(np.mean(d))
    if null:
        out["null_mean_abs"] = float(np.mean(null))
        out["p"] = float(np.mean(np.asarray(null) <= out["mean_abs_lag"]))
    return out


def _window(n: int) -> int:
    return max(5, n // 50) | 1                    # odd, so the median is centred


def smooth(x: np.ndarray, w: int) -> np.ndarray:
    h = w // 2
    return np.array([np.nanmedian(x[max(0, i - h):i + h + 1]) for i in range(len(x))])


def _mad(r: np.ndarray) -> float:
    r = r[np.isfinite(r)]
    return float(np.median(np.abs(r - np.median(r)))) if len(r) else float("nan")


def loss_bump(steps: np.ndarray, loss: np.ndarray) -> dict:
    w = _window(len(loss))
    sm = smooth(loss, w)
    rise = sm - np.minimum.accumulate(sm)
    i = int(np.nanargmax(rise))
    noise = 3 * _mad(loss - sm)
    size = float(rise[i])
    return {"window": w, "size": size, "step": int(steps[i]), "noise": noise,
            "bump": bool(size > BUMP_NATS and size > noise)}


def steepest_fall(steps: np.ndarray, x: np.ndarray) -> dict:
    w = _window(len(x))
    sm = smooth(x, w)
    if len(sm) <= w:
        return {"window": w, "step": None, "fall": None, "noise": None}
    d = sm[w:] - sm[:-w]                          # change over w rows
    i = int(np.nanargmin(d))
    return {"window": w, "step": int(steps[i + w // 2]), "fall": float(-d[i]), "noise": 3 * _mad(x - sm),
            "start": float(sm[0]), "end": float(sm[-1])}


def _series(df, col: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows where ``col`` was measured."""
    d = df[["step", col]].dropna().sort_values("step")
    return d["step"].to_numpy(), d[col].to_numpy(float)


def run_events(df, chance: dict, heads: list[tuple[int, int]]) -> dict:
    """Every rule on one run's metrics frame; each series on the rows where it was measured (the
    forward scores, the gradient side and the training loss have their own schedules)."""
    fsteps, _ = _series(df, mn.head("atlas_first_mass", *heads[0]))
    out = {"hold": hold_for(len(fsteps)), "rows": len(fsteps)}
    for name, (fb, ck, bb) in PHENOMENA.items():
        per = {f"L{l}H{h}": head_events(*_series(df, mn.head(fb, l, h)), *_series(df, mn.head(bb, l, h)), chance[ck])
               for l, h in heads}
        out[name] = {"heads": per, "lag": lag_test([e["forward_step"] for e in per.values()],
                                                   [e["backward_step"] for e in per.values()])}
    bsteps, _ = _series(df, mn.head("atlas_first_adv", *heads[0]))
    out["grad_hold"], out["grad_rows"] = hold_for(len(bsteps)), len(bsteps)
    out["loss_bump"] = loss_bump(*_series(df, "loss"))
    out["repeat_phase"] = steepest_fall(*_series(df, "atlas_rep_gap"))
    return out
