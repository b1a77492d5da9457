"""Sticky-chain study figure F7, frame and precision over training (arXiv 2512.22473; diagnostic D10):

* ``f7_dissociation`` (id kept for file names and the app; the figure does NOT show a dissociation
  unless its caption says so) — endpoint-free measures (:mod:`dyntool.sims.frame_precision`): attention
  drift and value drift between neighbouring records, and gradient-energy shares;
* :func:`frame_precision_figure` draws the same three panels for any ``interval_measures`` rows.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import style
from .common import arms_of, array, diag, first_head, main_study, mean_std, need, seed_arm
from .registry import figure
from ..sims.frame_precision import describe_change, interval_measures, ordering_phrase

KIND = "sticky-markov"


def _check_f7(runs):
    ok = [r for r in runs if (array(r, "attn") is not None or array(r, "attn_pooled") is not None)
          and array(r, "values") is not None and len(r.steps) >= 3]
    need(ok, "no run of the study recorded attn (or attn_pooled) and values at ≥ 3 steps")
    return True, ""


_SHARES = {"routing": ("diag_share_qk",), "values": ("diag_share_v",), "readout": ("diag_share_o",)}


def dissociation(run, hm: float | None = None) -> pd.DataFrame | None:
    """Per recorded interval of one run: attention drift, value drift (both per training step,
    between NEIGHBOURING records, no endpoint) and gradient-energy shares (D10) at its end."""
    a = array(run, "attn")
    if a is None:
        a = array(run, "attn_pooled")
    v = array(run, "values")
    if a is None or v is None or len(run.steps) < 3:
        return None
    n = min(len(a), len(v))
    steps = run.steps[:n]
    shares = {}
    for group, (name,) in _SHARES.items():
        s, val = diag(run, name)
        if len(s):
            shares[group] = np.interp(steps, s, val, left=np.nan, right=np.nan)
    return interval_measures(steps, attn=first_head(a, slice(0, n)), values=first_head(v, slice(0, n)), shares=shares)


@figure("f7_dissociation", "Frame and precision: attention drift, value drift, gradient-energy shares", KIND,
        needs="a sticky-markov study recording attn (crop or pooled) and values at ≥ 3 steps; the "
              "diag_share_* metrics add the energy-share panel", group="dynamics", pick=main_study,
        check=_check_f7)
def f7_dissociation(runs, **opts):
    frames = []
    for arm, rs in arms_of(runs).items():
        for r in rs:
            df = dissociation(r)
            if df is not None and len(df):
                frames.append(df.assign(arm=arm, seed=seed_arm(r)[0], run=r.id))
    need(frames, "no run had both attention and values at ≥ 3 recorded steps")
    long = pd.concat(frames, ignore_index=True)
    return frame_precision_figure(long, "sticky chain")


def frame_precision_figure(long: pd.DataFrame, what: str):
    """Three panels from :func:`interval_measures` rows (columns arm, seed, step, ...): attention
    drift, value drift (log scale, per training step) and gradient-energy shares; caption from data."""
    arms = list(dict.fromkeys(long["arm"]))
    fig = style.figure(style.DOUBLE, 2.6)
    axs = fig.subplots(1, 3)
    words = []
    # does attention stabilise before the values?  Stated per arm from the seed-mean drifts
    order = []
    for arm in arms:
        sub = long[long["arm"] == arm]
        if {"attn_drift", "value_drift"} <= set(sub) and not sub["attn_drift"].isna().all():
            pa = sub.pivot_table(index="seed", columns="step", values="attn_drift")
            pv = sub.pivot_table(index="seed", columns="step", values="value_drift").reindex(columns=pa.columns)
            order.append(ordering_phrase(pa.columns.to_numpy(), mean_std(pa.to_numpy())[0],
                                         mean_std(pv.to_numpy())[0], style.arm_label(arm)))
    for col, ax, ylabel in (("attn_drift", axs[0], "attention drift JS(α(t), α(t−Δ)) / Δ [nats/step]"),
                            ("value_drift", axs[1], "value drift ‖ΔV‖/‖V‖ / Δ [1/step]")):
        for k, arm in enumerate(arms):
            sub = long[long["arm"] == arm]
            if col not in sub or sub[col].isna().all():
                continue
            piv = sub.pivot_table(index="seed", columns="step", values=col)
            mu, sd = mean_std(piv.to_numpy())
            style.band(ax, piv.columns.to_numpy(), mu, sd, style.arm_color(arm, k),
                       label=f"{style.arm_label(arm)} (n = {len(piv)})")
            words.append(describe_change(piv.columns.to_numpy(), mu, f"{style.arm_label(arm)} {col.replace('_', ' ')}",
                                         "{:.2g}"))
        ax.set_yscale("log")
        ax.set_xlabel(f"{style.STEP} [steps]")
        ax.set_ylabel(ylabel, fontsize=6.5)
    style.panel_label(axs[0], "a")
    style.panel_label(axs[1], "b")
    cx = axs[2]
    ls = {"share_routing": "-", "share_values": "--", "share_readout": ":"}
    for k, arm in enumerate(arms):
        sub = long[long["arm"] == arm]
        for col, line in ls.items():
            if col not in sub or sub[col].isna().all():
                continue
            piv = sub.pivot_table(index="seed", columns="step", values=col)
            mu, _ = mean_std(piv.to_numpy())
            cx.plot(piv.columns.to_numpy(), mu, ls=line, color=style.arm_color(arm, k), lw=1.0)
            if col == "share_routing":
                words.append(describe_change(piv.columns.to_numpy(), mu,
                                             f"{style.arm_label(arm)} routing share of gradient energy"))
    for col, line in ls.items():
        cx.plot([], [], ls=line, color="black", lw=1.0, label=col.replace("share_", ""))
    cx.set_ylim(0, 1)
    cx.set_xlabel(f"{style.STEP} [steps]")
    cx.set_ylabel("share of Σ‖∂L/∂θ‖²")
    cx.legend(loc="best", fontsize=6)
    style.panel_label(cx, "c")
    h, lab = axs[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=max(1, len(lab)))
    caption = (f"Frame and precision on the {what}, measured between neighbouring recorded steps (no final-state "
               "reference), mean ± std over seeds. (a) attention drift: mean over recorded query rows of "
               "JS(α_i(t) ‖ α_i(t−Δ)) in nats, divided by the Δ training steps between records (rows "
               "renormalised over the recorded keys). (b) value drift ‖V(t) − V(t−Δ)‖/‖V(t−Δ)‖ per step. "
               "(c) gradient-energy shares of routing (W_Q, W_K), values (W_V) and readout (W_O) at each "
               "recorded step (D10). Measured: " + "; ".join(words) + ". Order of stabilisation: " +
               ("; ".join(order) if order else "not measurable") + ".")
    return fig, long, caption
