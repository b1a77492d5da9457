"""Sticky-chain study figures, curves (arXiv 2512.22473: sticky chain, figures F3–F4):

* ``f3_em_vs_sgd`` — loss per step, mean ± std over seeds per arm, H_min line, and a marker at the
  mean step where EM-like first goes below SGD's mean final loss (the authors' metric);
* ``f4_entropy`` — predictive entropy per step and at the end, against H_min and log 8, on the
  training sequence (solid) and the held-out sequence (dashed / open markers) where logged.

The value-LR sweep and the learning-rate controls (from ``summary.json``): :mod:`dyntool.figures.controls`.

The figures read one study: the runs of the first study directory among the inputs.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import style
from .common import align, arms_of, h_min, is_em, main_study, mean_std, metric, n_symbols, need, seed_arm, summary_of
from .registry import figure

KIND = "sticky-markov"


def _check_metric(name):
    def check(runs):
        ok = [r for r in runs if len(metric(r, name)[0])]
        need(ok, f"no run of the study logged the '{name}' metric")
        return True, ""
    return check


def _curves(runs, name) -> dict[str, list[tuple[int, np.ndarray, np.ndarray]]]:
    """arm -> [(seed, steps, values)] for the runs that logged ``name``."""
    out = {}
    for arm, rs in arms_of(runs).items():
        cs = []
        for r in rs:
            s, v = metric(r, name)
            if len(s):
                cs.append((seed_arm(r)[0], s, v))
        if cs:
            out[arm] = cs
    return out


def crossing(curves: dict) -> dict | None:
    """Authors' speed-up metric (arXiv 2512.22473, sticky Markov-chain task): thr = mean over seeds of SGD's final loss; per EM seed
    the first step whose loss is below thr (else the number of steps); mean ± sample std (ddof = 1)."""
    sgd = curves.get("sgd")
    em_arm = next((a for a in curves if is_em(a)), None)
    if not sgd or em_arm is None:
        return None
    thr = float(np.mean([v[np.isfinite(v)][-1] for _, _, v in sgd if np.isfinite(v).any()]))
    per = {}
    for seed, s, v in curves[em_arm]:
        hit = np.nonzero(v < thr)[0]
        per[seed] = int(s[hit[0]]) if len(hit) else int(s[-1] + 1)
    vals = np.array(list(per.values()), dtype=float)
    n = max(int(s[-1]) + 1 for _, s, _ in sgd)
    return {"threshold": thr, "per_seed": per, "mean": float(vals.mean()), "std": float(mean_std(vals)[1]),
            "speedup": n / float(vals.mean()) if vals.mean() > 0 else float("nan"), "arm": em_arm,
            "n_steps": n}


def _wide(curves: dict, value: str) -> pd.DataFrame:
    """step, {arm}_mean, {arm}_std, {arm}_seed{S}... on the union of logged steps."""
    all_c = [(arm, seed, s, v) for arm, cs in curves.items() for seed, s, v in cs]
    steps, mat = align([(s, v) for _, _, s, v in all_c])
    cols = {"step": steps}
    for arm in curves:
        rows = [i for i, c in enumerate(all_c) if c[0] == arm]
        m, sd = mean_std(mat[rows])
        cols[f"{arm}_{value}_mean"] = m
        cols[f"{arm}_{value}_std"] = sd
        for i in rows:
            cols[f"{arm}_seed{all_c[i][1]}"] = mat[i]
    return pd.DataFrame(cols)


def _bands(ax, df: pd.DataFrame, curves: dict, value: str) -> None:
    for k, arm in enumerate(curves):
        n = len(curves[arm])
        style.band(ax, df["step"], df[f"{arm}_{value}_mean"], df[f"{arm}_{value}_std"],
                   style.arm_color(arm, k), label=f"{style.arm_label(arm)} (n = {n})")


@figure("f3_em_vs_sgd", "EM-like vs SGD convergence on the sticky chain", KIND,
        needs="a sticky-markov study: runs per (seed, arm) logging 'loss' per step",
        group="dynamics", pick=main_study, check=_check_metric("loss"))
def f3_em_vs_sgd(runs, **opts):
    df, aids = _f3_data(runs)
    return _f3_draw(df, aids), df, _f3_caption(aids)


def _f3_data(runs) -> tuple[pd.DataFrame, dict]:
    """-> (the loss curves per arm and seed, wide; what the drawing and caption also need: the
    curves, H_min, log n, and the crossing, from the study's summary.json where it has one)."""
    curves = _curves(runs, "loss")
    df = _wide(curves, "loss")
    cr = crossing(curves)
    study = summary_of(runs[0])
    summ = study.get("em_steps_to_sgd_final")
    if cr is not None and isinstance(summ, dict) and "mean" in summ:      # the study's own numbers win
        cr.update(mean=float(summ["mean"]), std=float(summ.get("std", cr["std"])), source="summary.json")
        if isinstance(study.get("sgd_final_threshold"), (int, float)):
            cr["threshold"] = float(study["sgd_final_threshold"])
        if isinstance(study.get("steps"), int):
            cr["n_steps"] = study["steps"]
    n = n_symbols(runs[0])
    return df, {"curves": curves, "hm": h_min(runs), "cr": cr, "n_symbols": n, "logn": math.log(n)}


def _f3_draw(df: pd.DataFrame, aids: dict):
    curves, hm, cr, logn = aids["curves"], aids["hm"], aids["cr"], aids["logn"]
    fig = style.figure(style.SINGLE, 3.0)
    ax = fig.add_subplot()
    _bands(ax, df, curves, "loss")
    if hm is not None:
        style.hline(ax, hm, f"H_min = {hm:.4f}", color=style.H_MIN_COLOR)
    style.hline(ax, logn, f"log {aids['n_symbols']} (uniform)", ls=":")
    if cr is not None:
        _f3_crossing(ax, cr)
    ax.set_xlabel(f"{style.STEP} [steps]")
    ax.set_ylabel(style.LOSS)
    top = max(float(np.nanmax(df.filter(like="_seed").to_numpy())), logn)
    bottom = min(float(np.nanmin(df.filter(like="_seed").to_numpy())), hm if hm is not None else np.inf)
    pad = 0.05 * (top - bottom)
    ax.set_ylim(bottom - pad, top + pad)
    h, lab = ax.get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=2)
    return fig


def _f3_crossing(ax, cr: dict) -> None:
    """SGD's final loss (dotted), the mean step EM-like reaches it (dash-dotted) ± std, annotated."""
    ax.axhline(cr["threshold"], color=style.arm_color("sgd"), lw=0.6, ls=":")
    ax.axvline(cr["mean"], color=style.arm_color(cr["arm"]), lw=0.9, ls="-.")
    ax.axvspan(cr["mean"] - cr["std"], cr["mean"] + cr["std"], color=style.arm_color(cr["arm"]),
               alpha=0.08, lw=0)
    ax.annotate(f"EM-like reaches SGD's step-{cr['n_steps']} loss\nat step {cr['mean']:.0f} ± {cr['std']:.0f}",
                (cr["mean"], cr["threshold"]), xytext=(0.04, 0.3), textcoords="axes fraction", fontsize=6.5,
                va="center", color=style.arm_color(cr["arm"]),
                bbox=dict(boxstyle="square,pad=0.2", fc="white", ec="none", alpha=0.85),
                arrowprops=dict(arrowstyle="->", color=style.arm_color(cr["arm"]), lw=0.6))


def _f3_caption(aids: dict) -> str:
    cr, hm = aids["cr"], aids["hm"]
    note = ""
    if cr is not None:
        note = (f" Dash-dotted line: mean step at which EM-like first goes below SGD's mean final loss "
                f"({cr['threshold']:.4f} nats, dotted): {cr['mean']:.0f} ± {cr['std']:.0f} steps "
                f"(sample std over seeds, ddof = 1): EM-like reaches SGD's step-{cr['n_steps']} loss at step "
                f"{cr['mean']:.0f} (a ratio of steps would depend on the budget, so none is given).")
    seeds = sorted({s for cs in aids["curves"].values() for s, _, _ in cs})
    return (f"Training loss (before each update) on the sticky chain, mean ± 1 std over {len(seeds)} "
            f"seed(s) {seeds}, per arm. Black dashed: minimum Bayesian entropy H_min = "
            f"{hm if hm is not None else float('nan'):.4f} nats; grey dotted: log {aids['n_symbols']} = "
            f"{aids['logn']:.4f} nats." + note)


def _finals(runs, curves: dict, key: str) -> dict:
    """arm -> {per_seed, mean, std} of the final ``key``: per seed from summary.json's per_seed, else
    the last logged value; mean ± std as summary.json's ``final`` records them where its seeds are
    the curves' seeds, else over the per-seed values."""
    summ = summary_of(runs[0])
    per_seed = {(int(p.get("seed", -1))): p for p in summ.get("per_seed", []) or [] if isinstance(p, dict)}
    recorded = summ.get("final") if isinstance(summ.get("final"), dict) else {}
    study_seeds = sorted(int(s) for s in summ.get("seeds", []) or [])
    out = {}
    for arm, cs in curves.items():
        vals, all_recorded = [], True
        for seed, _, v in cs:
            rec = per_seed.get(seed, {}).get(arm) or per_seed.get(seed, {}).get("em" if is_em(arm) else arm) or {}
            fin = rec.get(key) if isinstance(rec, dict) else None
            all_recorded &= isinstance(fin, (int, float))
            vals.append(float(fin) if isinstance(fin, (int, float)) else float(v[np.isfinite(v)][-1]))
        seeds = [s for s, _, _ in cs]
        rf = (recorded.get(arm) or recorded.get("em" if is_em(arm) else arm) or {}).get(key)
        if isinstance(rf, dict) and all_recorded and sorted(seeds) == study_seeds:
            mean, std = float(rf["mean"]), float(rf["std"])          # the study's own numbers
        else:
            mean, std = float(np.mean(vals)), float(mean_std(vals)[1])
        out[arm] = {"per_seed": dict(zip(seeds, vals)), "mean": mean, "std": std}
    return out


@figure("f4_entropy", "Predictive entropy on the training and held-out sequences vs minimum Bayesian entropy",
        KIND, needs="a sticky-markov study: runs per (seed, arm) logging 'entropy' (nats) per step; "
                    "'heldout_entropy' (held-out sequence) is drawn dashed where logged",
        group="dynamics", pick=main_study, check=_check_metric("entropy"))
def f4_entropy(runs, **opts):
    data, aids = _f4_data(runs)
    return _f4_draw(data, aids), data, _f4_caption(data, aids)


def _f4_data(runs) -> tuple[dict, dict]:
    """-> (data written beside the figure: entropy curves per step, final entropies from the study's
    summary.json, H_min and log n; what only the drawing and caption need: n, seeds per arm)."""
    curves = _curves(runs, "entropy")
    df = _wide(curves, "entropy")
    hm = h_min(runs)
    n = n_symbols(runs[0])
    data = {"curves": {c: df[c].tolist() for c in df.columns}, "final": _finals(runs, curves, "entropy"),
            "h_min": hm, "log_n": math.log(n),
            "final_source": "summary.json per_seed" if summary_of(runs[0]).get("per_seed") else "last logged step"}
    ho = _curves(runs, "heldout_entropy")
    if ho:
        ho_df = _wide(ho, "heldout_entropy")
        data["heldout_curves"] = {c: ho_df[c].tolist() for c in ho_df.columns}
        data["heldout_final"] = _finals(runs, ho, "heldout_entropy")
    return data, {"n_symbols": n, "seeds": {arm: len(cs) for arm, cs in curves.items()}}


def _f4_draw(data: dict, aids: dict):
    fig = style.figure(style.DOUBLE, 2.7)
    ax, bx = fig.subplots(1, 2, width_ratios=[2.2, 1])
    _f4_curves(ax, data, aids)
    h, lab = ax.get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=min(len(lab), 4))
    style.panel_label(ax, "a")
    _f4_finals(bx, data, aids["n_symbols"])
    style.panel_label(bx, "b")
    return fig


def _f4_curves(ax, data: dict, aids: dict) -> None:
    """(a) entropy per step: training mean ± std (solid), held-out mean (dashed)."""
    hm, logn, n = data["h_min"], data["log_n"], aids["n_symbols"]
    df = pd.DataFrame(data["curves"])
    for k, arm in enumerate(aids["seeds"]):
        style.band(ax, df["step"], df[f"{arm}_entropy_mean"], df[f"{arm}_entropy_std"],
                   style.arm_color(arm, k), label=f"{style.arm_label(arm)} (n = {aids['seeds'][arm]})")
    ho = "heldout_curves" in data
    if ho:
        ho_df = pd.DataFrame(data["heldout_curves"])
        for k, arm in enumerate(data["heldout_final"]):
            ax.plot(ho_df["step"], ho_df[f"{arm}_heldout_entropy_mean"], color=style.arm_color(arm, k), ls="--",
                    lw=0.9)
        ax.plot([], [], color="grey", ls="-", lw=1.2, label="training sequence (solid, ± 1 std)")
        ax.plot([], [], color="grey", ls="--", lw=0.9, label="held-out sequence (dashed, mean)")
    if hm is not None:
        style.hline(ax, hm, f"H_min = {hm:.4f}", color=style.H_MIN_COLOR)
    style.hline(ax, logn, f"log {n} = {logn:.4f}", ls=":")
    ax.set_xlabel(f"{style.STEP} [steps]")
    ax.set_ylabel("mean predictive entropy [nats]" if ho else
                  "mean predictive entropy [nats]\n(training sequence)")


def _f4_finals(bx, data: dict, n: int) -> None:
    """(b) final entropy per arm: training (filled) and held-out (open), mean ± std, seeds as dots."""
    final, ho_final, hm, logn = data["final"], data.get("heldout_final", {}), data["h_min"], data["log_n"]
    x = np.arange(len(final))
    dx = 0.17 if ho_final else 0.0
    for k, (arm, f) in enumerate(final.items()):
        c = style.arm_color(arm, k)
        bx.errorbar(k - dx, f["mean"], yerr=f["std"], color=c, marker="D", ms=4.5, capsize=2.5, lw=1.1)
        pts = list(f["per_seed"].values())
        bx.plot(np.full(len(pts), k - dx - 0.12), pts, "o", color=c, ms=2.2, alpha=0.7, mew=0)
        g = ho_final.get(arm)
        if g is not None:
            bx.errorbar(k + dx, g["mean"], yerr=g["std"], color=c, marker="D", ms=4.5, mfc="white", capsize=2.5,
                        lw=1.1, ls="none")
    if ho_final:
        bx.plot([], [], "D", color="grey", ms=4, label="training")
        bx.plot([], [], "D", color="grey", mfc="white", ms=4, label="held-out")
        bx.legend(loc="upper right", fontsize=6, handletextpad=0.2, borderaxespad=0.2)
    if hm is not None:
        style.hline(bx, hm, "H_min", color=style.H_MIN_COLOR)
    style.hline(bx, logn, f"log {n}", ls=":")
    bx.set_xticks(x, [style.arm_label(a, short=True) for a in final], rotation=20)
    bx.set_xlim(-0.6, len(final) - 0.4)
    allv = [f["mean"] - f["std"] for f in list(final.values()) + list(ho_final.values())]
    lo = min(allv + ([hm] if hm is not None else []))
    bx.set_ylim(lo - 0.05 * (logn - lo) - 0.01, logn + 0.22 * (logn - lo) + 0.01)
    bx.set_ylabel("final predictive entropy [nats]")


def _f4_caption(data: dict, aids: dict) -> str:
    final, ho_final, hm, logn, n = (data["final"], data.get("heldout_final", {}), data["h_min"], data["log_n"],
                                    aids["n_symbols"])
    ho = "heldout_curves" in data

    def gap_txt(fin):
        return "; ".join(f"{style.arm_label(a)} {f['mean'] - hm:.3f} nats ({(f['mean'] - hm) / (logn - hm):.2f} of "
                         f"the way from H_min to log {n})" for a, f in fin.items())
    gaps = (" Gap ΔH = H_pred − H_min at the end, training sequence: " + gap_txt(final) + "." +
            (" Held-out sequence: " + gap_txt(ho_final) + "." if ho_final else "")) if hm is not None else ""
    seq = ("solid lines with ± 1 std bands: the training sequence; dashed lines: the held-out sequence (another "
           "path of the same chain), mean over seeds" if ho else "the training sequence, mean ± 1 std over seeds")
    return (f"(a) Mean predictive entropy per step ({seq}) and (b) at the end of training "
            + ("(filled diamonds: training sequence, open diamonds: held-out sequence, mean ± std over seeds; "
               "dots: training-sequence seeds)" if ho_final else "(diamonds: mean ± std over seeds; dots: seeds)")
            + f" against the minimum Bayesian entropy H_min = {hm if hm is not None else float('nan'):.4f} nats "
            f"(black dashed) and the uniform predictor log {n} = {logn:.4f} nats (grey dotted)." + gaps)
