"""The ICL-MC study's analyses of one run, by rules fixed in code before any ``cpu`` run was looked at.

Inputs are a run's ``metrics.jsonl`` columns (a pandas DataFrame with ``step``): the logged steps
(every ``eval_every``) carry the KLs and attention scores; every step carries the cheap tier.

* **stages** (:func:`stages`): at each logged step the stage is the strategy with the smallest
  KL(strategy ‖ model); a new stage starts at the first logged step from which it holds for
  ``HOLD`` = 5 consecutive logged steps.  The first stage is the one at step 0.
* **10 % of the change** (:func:`t10`): the first logged step from which a series stays at least
  10 % of its total change (last value − first value) away from its first value, for ``HOLD``
  logged steps.  The "last value" is the mean of the last ``HOLD`` logged steps (noise).  Per-step
  cheap-tier series are first averaged over each logged step's window [s, s + eval_every)
  (:func:`on_logged_grid`).
* **leading indicator** (:func:`lead`): x(t) the first difference of the indicator on the logged
  grid, y(t) = −(first difference of KL(bigram ‖ model)): how fast the bigram transition
  proceeds.  r(ℓ) = corr(x(t), y(t + ℓ)) for |ℓ| ≤ ``MAX_LAG`` logged steps; the lead is the ℓ of
  the largest r (ℓ > 0: the indicator moves first), in steps ℓ·eval_every.  Control: the same
  statistic with x shuffled in time (``N_PERM`` permutations, fixed seed); p = (1 + #{null ≥
  observed}) / (1 + N_PERM).

Added in the fourth round (issue 48, after an outside review; labelled so in the docs):

* **the stage start as the KL drop's midpoint** (:func:`kl_midpoint`), beside the argmin rule
  (which fires mid-transition): the first logged step from which KL(bigram ‖ model) stays below
  half-way between its highest value after step 0 and its end value for ``HOLD`` logged steps;
* **key-type lifts** (:mod:`.icl_markov_metrics`) and the induction-specific measure
  lift(induction) / lift(neither), per head, with their 10 % steps;
* **a null that respects autocorrelation** (:func:`lead` with ``null="circular"``): the indicator's
  differences circularly shifted by every offset farther than ``MAX_LAG`` from 0 (a shift keeps a
  smooth series smooth, a permutation does not, so a smooth series that merely moves with the
  transition is not "significant"); used for the lead of L0's ‖∂L/∂S‖ over L0's previous-token
  score and, again, over the bigram transition.  The post hoc "peak before the bigram stage" is
  replaced by the peak's distance to the KL midpoint (no p: it is a description).
"""
from __future__ import annotations

import numpy as np

from .. import masks
from ..record import metric_names as mn
from ..stats import pearson
from .icl_markov_metrics import KEY_TYPES, icl_lift
from .icl_markov_task import STRATEGIES

HOLD = 5             # logged steps a new stage (or a 10 % crossing) must hold
FRACTION = 0.10      # "which layer moves first": 10 % of the change
MAX_LAG = 20         # logged steps either side, leading indicator
N_PERM = 500         # shuffled-time permutations of the control


def logged(df):
    """The logged steps' rows (those with the KL columns), sorted by step."""
    col = mn.icl_kl("bigram")
    return df[df[col].notna()].sort_values("step") if col in df.columns else df.iloc[:0]


def stage_series(df) -> tuple[np.ndarray, list[str]]:
    """(logged steps, the stage at each: the strategy of smallest KL)."""
    rows = logged(df)
    kls = np.stack([rows[mn.icl_kl(s)].to_numpy(float) for s in STRATEGIES], 1)      # (n, 3)
    return rows["step"].to_numpy(np.int64), [STRATEGIES[i] for i in np.argmin(kls, 1)]


def stages(df, hold: int = HOLD) -> list[dict]:
    """[{stage, start}] in order: the step-0 stage, then each stage that holds ``hold`` logged steps."""
    steps, st = stage_series(df)
    if not len(steps):
        return []
    out = [{"stage": st[0], "start": int(steps[0])}]
    for i in range(1, len(st)):
        if st[i] != out[-1]["stage"] and len(st[i:i + hold]) == hold and len(set(st[i:i + hold])) == 1:
            out.append({"stage": st[i], "start": int(steps[i])})
    return out


def first_start(stage_list: list[dict], name: str) -> int | None:
    return next((s["start"] for s in stage_list if s["stage"] == name), None)


def on_logged_grid(df, col: str) -> tuple[np.ndarray, np.ndarray]:
    """A per-step column averaged over each logged step's window [s, next logged step)."""
    steps = logged(df)["step"].to_numpy(np.int64)
    if col not in df.columns or not len(steps):
        return steps, np.full(len(steps), np.nan)
    s = df["step"].to_numpy(np.int64)
    v = df[col].to_numpy(float)
    idx = np.searchsorted(steps, s, side="right") - 1               # the window each step falls in
    ok = (idx >= 0) & np.isfinite(v)
    sums = np.bincount(idx[ok], weights=v[ok], minlength=len(steps))
    counts = np.bincount(idx[ok], minlength=len(steps))
    with np.errstate(invalid="ignore"):
        return steps, sums / counts


def logged_series(df, col: str) -> tuple[np.ndarray, np.ndarray]:
    rows = logged(df)
    return rows["step"].to_numpy(np.int64), rows[col].to_numpy(float) if col in rows else np.full(len(rows), np.nan)


def t10(steps: np.ndarray, values: np.ndarray, fraction: float = FRACTION, hold: int = HOLD) -> int | None:
    """The first step from which ``values`` stays ≥ ``fraction`` of its total change away from its
    first value for ``hold`` points (None: never, or no change)."""
    v = np.asarray(values, float)
    if len(v) < hold + 1 or not np.isfinite(v[0]):
        return None
    change = np.nanmean(v[-hold:]) - v[0]
    if not np.isfinite(change) or change == 0:
        return None
    moved = (v - v[0]) / change >= fraction
    for i in range(1, len(v) - hold + 1):
        if moved[i:i + hold].all():
            return int(steps[i])
    return None


def _lag_corr(x: np.ndarray, y: np.ndarray, max_lag: int) -> np.ndarray:
    """r(ℓ) = corr(x(t), y(t + ℓ)) for ℓ = −max_lag..max_lag."""
    n = len(x)
    out = []
    for lag in range(-max_lag, max_lag + 1):
        a, b = (x[: n - lag], y[lag:]) if lag >= 0 else (x[-lag:], y[: n + lag])
        out.append(pearson(a, b))
    return np.array(out)


def lead(steps: np.ndarray, indicator: np.ndarray, kl_bigram: np.ndarray, max_lag: int = MAX_LAG,
         n_perm: int = N_PERM, seed: int = 0, null: str = "shuffle", sign: float = -1.0) -> dict:
    """The leading-indicator test (module docstring): lag of the best cross-correlation between the
    indicator's changes and a target's changes (by default −ΔKL(bigram), the transition's
    progress; ``sign`` = +1 for a rising target such as a score), against time-shuffles of the
    indicator's changes (``null="shuffle"``) or its circular shifts (``"circular"``)."""
    x, y = np.diff(np.asarray(indicator, float)), sign * np.diff(np.asarray(kl_bigram, float))
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = np.where(ok, x, 0.0), np.where(ok, y, 0.0)
    max_lag = min(max_lag, len(x) // 3)
    if max_lag < 1 or len(x) < 10:
        return {"lag_steps": None, "r": None, "p": None}
    r = _lag_corr(x, y, max_lag)
    if not np.isfinite(r).any():                    # a constant series (a run that did not move): no test
        return {"lag_steps": None, "r": None, "p": None}
    best = int(np.nanargmax(r))
    if null == "circular":
        shifts = [s_ for s_ in range(len(x)) if min(s_, len(x) - s_) > max_lag]
        if not shifts:
            return {"lag_steps": None, "r": None, "p": None}
        null = np.array([np.nanmax(_lag_corr(np.roll(x, s_), y, max_lag)) for s_ in shifts])
        n_perm = len(shifts)
    else:
        rng = np.random.default_rng(seed)
        null = np.array([np.nanmax(_lag_corr(rng.permutation(x), y, max_lag)) for _ in range(n_perm)])
    every = int(steps[1] - steps[0]) if len(steps) > 1 else 1
    return {"lag_steps": int((best - max_lag) * every), "r": float(r[best]),
            "p": float((1 + np.sum(null >= r[best])) / (1 + n_perm)),
            "null_r_mean": float(null.mean()), "null_r_95": float(np.quantile(null, 0.95)),
            "r_by_lag": [float(v) for v in r], "lags_steps": [int((i - max_lag) * every) for i in range(len(r))]}


def kl_midpoint(steps: np.ndarray, kl: np.ndarray, hold: int = HOLD) -> int | None:
    """The first logged step from which ``kl`` stays below half-way between its highest value after
    step 0 and its end value (mean of the last ``hold``) for ``hold`` logged steps; None when the
    drop is less than half of that highest value (no transition)."""
    v = np.asarray(kl, float)
    if len(v) < 2 * hold + 1:
        return None
    hi, lo = np.nanmax(v[1:]), np.nanmean(v[-hold:])
    if not hi - lo >= 0.5 * hi:
        return None
    below = v < (hi + lo) / 2
    start = 1 + int(np.nanargmax(v[1:]))                              # the drop starts at its highest point
    for i in range(start, len(v) - hold + 1):
        if below[i:i + hold].all():
            return int(steps[i])
    return None


def prev_token_head(df, n_layer: int, n_head: int) -> tuple[int, int]:
    """The (layer, head) with the largest previous-token score at the end (mean of the last HOLD logged)."""
    best, arg = -np.inf, (0, 0)
    for l in range(n_layer):
        for h in range(n_head):
            _, v = logged_series(df, mn.head(mn.icl_score("prev_token"), l, h))
            m = np.nanmean(v[-HOLD:]) if len(v) else np.nan
            if np.isfinite(m) and m > best:
                best, arg = m, (l, h)
    return arg


def analyse_run(df, n_layer: int, n_head: int) -> dict:
    """One run's numbers: stages, each head's 10 % steps, KLs and scores at step 0 and at the end,
    the leading-indicator test on the previous-token head's ‖∂L/∂S‖."""
    st = stages(df)
    steps, _ = stage_series(df)
    out: dict = {"stages": st, "unigram_start": first_start(st, "unigram"),
                 "bigram_start": first_start(st, "bigram"), "order": [s["stage"] for s in st]}
    rows = logged(df)
    for s in STRATEGIES:
        v = rows[mn.icl_kl(s)].to_numpy(float)
        out[f"kl_{s}"] = {"step0": float(v[0]), "end": float(np.nanmean(v[-HOLD:])), "min": float(np.nanmin(v))}
    heads = {}
    for l in range(n_layer):
        for h in range(n_head):
            d = {}
            for name in mn.ICL_SCORES:
                s_, v = logged_series(df, mn.head(mn.icl_score(name), l, h))
                d[name] = {"step0": float(v[0]), "end": float(np.nanmean(v[-HOLD:])), "t10": t10(s_, v)}
            lifts = {}
            for kt in KEY_TYPES:
                s_, v = logged_series(df, mn.head(icl_lift(kt), l, h))
                lifts[kt] = v
                if np.isfinite(v).any():
                    d[f"lift_{kt}"] = {"step0": float(v[0]), "end": float(np.nanmean(v[-HOLD:])),
                                       "min": float(np.nanmin(v)), "t10": t10(s_, v)}
            if "lift_induction" in d and "lift_neither" in d:
                with np.errstate(invalid="ignore", divide="ignore"):
                    r = lifts["induction"] / lifts["neither"]
                d["induction_specific"] = {"step0": float(r[0]), "end": float(np.nanmean(r[-HOLD:])), "t10": t10(s_, r)}
            s_, v = on_logged_grid(df, mn.head(mn.SCORE_GRAD_NORM, l, h))
            d["score_grad_norm"] = {"step0": float(v[0]), "end": float(np.nanmean(v[-HOLD:])), "t10": t10(s_, v),
                                    "peak_step": int(s_[np.nanargmax(v)]) if np.isfinite(v).any() else None}
            heads[f"L{l}H{h}"] = d
    out["heads"] = heads
    pl, ph = prev_token_head(df, n_layer, n_head)
    out["prev_token_head"] = [pl, ph]
    s_, g = on_logged_grid(df, mn.head(mn.SCORE_GRAD_NORM, pl, ph))
    kl_b = rows[mn.icl_kl("bigram")].to_numpy(float)
    out["lead"] = lead(s_, g, kl_b)
    out["bigram_mid"] = kl_midpoint(steps, kl_b)
    peak = int(s_[np.nanargmax(g)]) if np.isfinite(g).any() else None
    out["peak_vs_mid"] = {"peak_step": peak, "mid": out["bigram_mid"],
                          "steps_before_mid": None if None in (peak, out["bigram_mid"]) else out["bigram_mid"] - peak}
    out["lead_circular"] = _slim(lead(s_, g, kl_b, null="circular"))
    _, pt = logged_series(df, mn.head(mn.icl_score("prev_token"), pl, ph))
    out["lead_over_prev_token"] = _slim(lead(s_, g, pt, null="circular", sign=1.0))
    out["transfer"] = _transfer(df)
    out["n_logged"] = int(len(steps))
    return out


def _slim(d: dict) -> dict:
    return {k: d.get(k) for k in ("lag_steps", "r", "p", "null_r_95")}


def _transfer(df) -> dict:
    """Per other held-out set (``kl/<strategy>@<prior>`` columns): its stages and KL midpoint."""
    out = {}
    for col in [c for c in df.columns if c.startswith(mn.icl_kl("bigram") + "@")]:
        prior = col.split("@", 1)[1]
        sub = df[["step"] + [mn.icl_kl(s) + "@" + prior for s in STRATEGIES]].copy()
        sub.columns = ["step"] + [mn.icl_kl(s) for s in STRATEGIES]
        st = stages(sub)
        steps, kl_b = logged_series(sub, mn.icl_kl("bigram"))
        out[prior] = {"order": [x["stage"] for x in st], "bigram_start": first_start(st, "bigram"),
                      "bigram_mid": kl_midpoint(steps, kl_b), "kl_bigram_end": float(np.nanmean(kl_b[-HOLD:])),
                      "kl_uniform_end": float(np.nanmean(logged_series(sub, mn.icl_kl("uniform"))[1][-HOLD:]))}
    return out


def advantage_to_previous(run, layer: int, head: int) -> dict:
    """From a run's full tier: per recorded step, the advantage A_{i,i−1} toward the previous
    position (mean over queries i ≥ 1 and recorded sequences) of one head, beside the mean advantage
    over all visible keys (the level a key without a preference would have)."""
    st = run.store
    if st is None or "advantage" not in st.names():
        return {"steps": [], "prev": [], "all": []}
    adv = st["advantage"]
    steps = [int(s) for s in run.steps[: len(adv)]]
    prev, every = [], []
    for n in range(len(steps)):
        a = np.asarray(adv[n, layer, head], dtype=float)                 # (S, T, T), masked entries 0
        T = a.shape[-1]
        i = np.arange(1, T)
        prev.append(float(a[:, i, i - 1].mean()))
        vis = masks.causal().dense(T)[0].numpy()
        every.append(float(a[:, vis].mean()))
    return {"steps": steps, "prev": prev, "all": every}
