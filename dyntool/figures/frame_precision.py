"""Sticky-chain study figure F7, frame and precision measures over training (arXiv 2512.22473; D10).

* ``f7_frame_precision``: endpoint-free measures (:mod:`dyntool.sims.frame_precision`): attention
  drift and value drift between neighbouring records (the runs that recorded arrays), and each
  parameter group's share of the first-order loss decrease η‖g‖² (every seed, from metrics).
  The caption states from the data whether attention settles before the values; it does not
  presume it (the paper's "dissociation" is a claim to test, not the figure's name).
* :func:`frame_precision_figure` draws the same three panels for any ``interval_measures`` rows.

Split as data (:func:`frame_precision_data`) → drawing (:func:`draw`) → caption (:func:`caption`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import style
from .common import arms_of, array, diag, first_head, is_em, main_study, mean_std, need, seed_arm
from .registry import figure
from ..sims.frame_precision import describe_change, energy_shares, interval_measures, ordering_phrase

KIND = "sticky-markov"
# group -> (gradient-norm metric, the parameters whose learning rate weights it)
_GROUPS = {"routing": ("diag_grad_norm_qk", ("W_Q", "W_K")), "values": ("diag_grad_norm_v", ("W_V",)),
           "readout": ("diag_grad_norm_o", ("W_O",))}
_RAW_SHARES = {"routing": "diag_share_qk", "values": "diag_share_v", "readout": "diag_share_o"}
_DRIFTS = (("attn_drift", "attention drift [nats/step]"), ("value_drift", "value drift [1/step]"))


def _check_f7(runs):
    ok = [r for r in runs if (array(r, "attn") is not None or array(r, "attn_pooled") is not None)
          and array(r, "values") is not None and len(r.steps) >= 3]
    need(ok, "no run of the study recorded attn (or attn_pooled) and values at ≥ 3 steps")
    return True, ""


def drift_rows(run) -> pd.DataFrame | None:
    """Per recorded interval of one run: attention drift and value drift (per training step,
    between NEIGHBOURING records, no endpoint)."""
    a = array(run, "attn")
    if a is None:
        a = array(run, "attn_pooled")
    v = array(run, "values")
    if a is None or v is None or len(run.steps) < 3:
        return None
    n = min(len(a), len(v))
    return interval_measures(run.steps[:n], attn=first_head(a, slice(0, n)), values=first_head(v, slice(0, n)))


def descent_shares(run) -> tuple[pd.DataFrame | None, bool]:
    """Per logged step of one run: each group's share of the first-order loss decrease
    Σ_p η_p‖∂L/∂W_p‖² (gradient descent lowers L by that much to first order, so a group with a
    10× learning rate counts 10×).  Needs the run's per-parameter learning rates (``config.lrs``)
    and one rate per group (routing: η_Q = η_K, since only ‖g_Q‖² + ‖g_K‖² is logged); otherwise
    the unweighted ‖g‖² shares, flagged by the second return value False."""
    lrs = run.config.get("lrs") or {}
    weighted = all(lrs.get(p) is not None for _, ps in _GROUPS.values() for p in ps) and lrs["W_Q"] == lrs["W_K"]
    names = {g: name for g, (name, _) in _GROUPS.items()} if weighted else _RAW_SHARES
    curves = {g: diag(run, name) for g, name in names.items()}
    if any(len(s) == 0 for s, _ in curves.values()):
        return None, False
    steps = curves["routing"][0]
    on_steps = {g: np.interp(steps, s, v) for g, (s, v) in curves.items()}
    if not weighted:
        return pd.DataFrame({"step": steps, **{f"share_{g}": v for g, v in on_steps.items()}}), False
    sq = {g: float(lrs[ps[0]]) * on_steps[g] ** 2 for g, (_, ps) in _GROUPS.items()}
    return pd.DataFrame({"step": steps, **energy_shares(sq)}), True


def frame_precision_data(runs) -> dict:
    """{"drifts": rows (arm, seed, step, attn_drift, value_drift), "shares": rows (arm, seed, step,
    share_*), "weighted": every share row is η-weighted}."""
    drifts, shares, weighted = [], [], True
    for arm, rs in arms_of(runs).items():
        for r in rs:
            tag = {"arm": arm, "seed": seed_arm(r)[0], "run": r.id}
            df = drift_rows(r)
            if df is not None and len(df):
                drifts.append(df.assign(**tag))
            # panel (c): the two arms the paper compares; the ×10 controls have their own figure
            sh, w = descent_shares(r) if arm == "sgd" or is_em(arm) else (None, True)
            if sh is not None and len(sh):
                shares.append(sh.assign(**tag))
                weighted &= w
    need(drifts, "no run had both attention and values at ≥ 3 recorded steps")
    return {"drifts": pd.concat(drifts, ignore_index=True),
            "shares": pd.concat(shares, ignore_index=True) if shares else pd.DataFrame(),
            "weighted": bool(shares) and weighted}


@figure("f7_frame_precision", "Frame and precision measures: attention drift, value drift, η-weighted "
        "gradient-energy shares", KIND,
        needs="a sticky-markov study recording attn (crop or pooled) and values at ≥ 3 steps; the "
              "diag_grad_norm_* metrics (and config.lrs) add the energy-share panel", group="dynamics",
        pick=main_study, check=_check_f7)
def f7_frame_precision(runs, **opts):
    data = frame_precision_data(runs)
    return frame_precision_figure(data["drifts"], "sticky chain", data["shares"], data["weighted"])


def frame_precision_figure(drifts: pd.DataFrame, what: str, shares: pd.DataFrame | None = None,
                           weighted: bool = False):
    """Three panels: drift rows from :func:`interval_measures` (columns arm, seed, step, ...) and
    share rows (arm, seed, step, share_*; default: the share columns of ``drifts``)."""
    if shares is None or not len(shares):
        shares = drifts[[c for c in drifts if c in ("arm", "seed", "step") or c.startswith("share_")]]
    fig = draw(drifts, shares)
    long = pd.concat([drifts.assign(table="drift"), shares.assign(table="share")], ignore_index=True)
    return fig, long, caption(drifts, shares, what, weighted)


def _pivot(df: pd.DataFrame, arm: str, col: str) -> pd.DataFrame | None:
    sub = df[df["arm"] == arm] if len(df) else df
    if not len(sub) or col not in sub or sub[col].isna().all():
        return None
    return sub.pivot_table(index="seed", columns="step", values=col)


def _per_seed(ax, piv: pd.DataFrame, color, label: str, ls="-") -> None:
    """One thin line per seed and their mean, thicker (no sd band: on a log axis it misleads)."""
    x = piv.columns.to_numpy()
    for row in piv.to_numpy():
        ax.plot(x, row, color=color, lw=0.5, alpha=0.35, ls=ls)
    ax.plot(x, mean_std(piv.to_numpy())[0], color=color, lw=1.3, ls=ls, label=label)


def draw(drifts: pd.DataFrame, shares: pd.DataFrame):
    arms = list(dict.fromkeys(list(drifts["arm"]) + (list(shares["arm"]) if len(shares) else [])))
    fig = style.figure(style.DOUBLE, 2.6)
    axs = fig.subplots(1, 3)
    for ax, (col, ylabel) in zip(axs[:2], _DRIFTS):
        for k, arm in enumerate(arms):
            piv = _pivot(drifts, arm, col)
            if piv is not None:
                _per_seed(ax, piv, style.arm_color(arm, k), f"{style.arm_label(arm)} (n = {len(piv)})")
        ax.set_yscale("log")
        ax.set_xlabel(f"{style.STEP} [steps]")
        ax.set_ylabel(ylabel, fontsize=6.5)
    style.panel_label(axs[0], "a")
    style.panel_label(axs[1], "b")
    cx = axs[2]
    lines = {"share_routing": "-", "share_values": "--", "share_readout": ":"}
    for k, arm in enumerate(arms):
        for col, ls in lines.items():
            piv = _pivot(shares, arm, col)
            if piv is not None:
                _per_seed(cx, piv, style.arm_color(arm, k), None, ls)
    for col, ls in lines.items():
        cx.plot([], [], ls=ls, color="black", lw=1.0, label=col.replace("share_", ""))
    cx.set_ylim(0, 1)
    cx.set_xlabel(f"{style.STEP} [steps]")
    cx.set_ylabel("share of first-order ΔL (η‖g‖²)", fontsize=6.5)
    cx.legend(loc="best", fontsize=6)
    style.panel_label(cx, "c")
    h, lab = axs[0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=max(1, len(lab)))
    return fig


def caption(drifts: pd.DataFrame, shares: pd.DataFrame, what: str, weighted: bool) -> str:
    arms = list(dict.fromkeys(drifts["arm"]))
    words, order = [], []
    for arm in arms:
        pa, pv = _pivot(drifts, arm, "attn_drift"), _pivot(drifts, arm, "value_drift")
        if pa is not None and pv is not None:
            order.append(ordering_phrase(pa.columns.to_numpy(), mean_std(pa.to_numpy())[0],
                                         mean_std(pv.reindex(columns=pa.columns).to_numpy())[0],
                                         style.arm_label(arm)))
        for col, piv in (("attn drift", pa), ("value drift", pv)):
            if piv is not None:
                words.append(describe_change(piv.columns.to_numpy(), mean_std(piv.to_numpy())[0],
                                             f"{style.arm_label(arm)} {col}", "{:.2g}"))
    for arm in dict.fromkeys(shares["arm"] if len(shares) else []):
        piv = _pivot(shares, arm, "share_values")
        if piv is not None:
            words.append(describe_change(piv.columns.to_numpy(), mean_std(piv.to_numpy())[0],
                                         f"{style.arm_label(arm)} values' share"))
    n_seeds = drifts.groupby("arm")["seed"].nunique()
    n_share = shares.groupby("arm")["seed"].nunique() if len(shares) else pd.Series(dtype=int)
    share_def = ("each group's share of Σ_p η_p‖∂L/∂W_p‖², the first-order loss decrease of a "
                 "gradient step with the run's own learning rates (EM-like: η_V = 10η)" if weighted else
                 "unweighted gradient-energy shares ‖g‖²/Σ‖g‖² (no per-parameter learning rates recorded)")
    return (f"Frame and precision measures on the {what}, between neighbouring recorded steps (no final-state "
            "reference); thin lines are seeds, thick lines their mean. (a) attention drift: mean over recorded "
            "query rows of JS(α_i(t) ‖ α_i(t−Δ)) in nats, divided by the Δ training steps between records "
            "(rows renormalised over the recorded keys). (b) value drift ‖V(t) − V(t−Δ)‖/‖V(t−Δ)‖ per step "
            f"((a, b): {_counts(n_seeds)} seeds with recorded arrays). (c) routing (W_Q, W_K), values (W_V) "
            f"and readout (W_O): {share_def} ({_counts(n_share)} seeds, every logged step). Measured: "
            + "; ".join(words) + ". Does attention settle before the values? " +
            ("; ".join(order) if order else "not measurable") + ".")


def _counts(n: pd.Series) -> str:
    vals = sorted(set(int(x) for x in n.to_numpy()))
    return "/".join(str(v) for v in vals) if vals else "0"
