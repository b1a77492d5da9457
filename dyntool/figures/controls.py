"""Sticky-chain study figures that compare learning rates across arms, read from the study's
``summary.json`` (arXiv 2512.22473, sticky Markov-chain task):

* ``value_lr_sweep`` — EM steps to SGD's final loss against the value-LR multiplier;
* ``controls`` — steps to SGD's final loss and final held-out loss per arm (sgd, em and the
  learning-rate controls readout / routing / all / sgd_tuned), from ``summary.json``; skipped with a
  one-line reason when the study ran no control arm (the default study), drawn for the arms present.

Each reads one study: the first study directory among the inputs that has what it draws.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import style
from .common import by_parent, fmt_pm, is_sweep, main_study, need, summary_of
from .registry import figure

KIND = "sticky-markov"


def _sweep_study(runs):
    for rs in _by_study(runs):
        if summary_of(rs[0]).get("value_lr_sweep"):
            return rs
    return main_study(runs)


def _by_study(runs):
    return list(by_parent(runs).values())


def _check_sweep(runs):
    sw = summary_of(runs[0]).get("value_lr_sweep")
    need(isinstance(sw, list) and sw, "the study's summary.json has no value_lr_sweep")
    need(all(isinstance(p, dict) and "mult" in p and "steps_mean" in p for p in sw),
         "summary.json value_lr_sweep entries need 'mult' and 'steps_mean'")
    return True, ""


@figure("value_lr_sweep", "EM steps to SGD's final loss vs the value learning-rate multiplier", KIND,
        needs="a sticky-markov study whose summary.json has value_lr_sweep [{mult, steps_mean, steps_std, "
              "per_seed}]", group="dynamics", pick=_sweep_study, check=_check_sweep)
def value_lr_sweep(runs, **opts):
    summ = summary_of(runs[0])
    df = _sweep_data(summ)
    return _sweep_draw(df, summ.get("steps")), df, _sweep_caption(df)


def _sweep_data(summ: dict) -> pd.DataFrame:
    """One row per value-LR multiplier of the study's summary.json: steps mean, std, per seed."""
    sw = sorted(summ["value_lr_sweep"], key=lambda p: float(p["mult"]))
    seeds = summ.get("seeds") or []
    rows = []
    for p in sw:
        row = {"mult": float(p["mult"]), "steps_mean": float(p["steps_mean"]),
               "steps_std": float(p.get("steps_std", 0.0) or 0.0)}
        per = p.get("per_seed") or []
        if isinstance(per, list) and len(per) == len(seeds):
            per = dict(zip(seeds, per))
        for k, v in (per.items() if isinstance(per, dict) else enumerate(per)):
            if isinstance(v, (int, float)):
                row[f"per_seed_{k}"] = float(v)
        rows.append(row)
    return pd.DataFrame(rows)


def _sweep_draw(df: pd.DataFrame, budget):
    fig = style.figure(style.SINGLE, 2.3)
    ax = fig.add_subplot()
    c = style.arm_color("em")
    ax.errorbar(df["mult"], df["steps_mean"], yerr=df["steps_std"], color=c, marker="o", capsize=2,
                label="mean ± std over seeds")
    for col in df.columns:
        if col.startswith("per_seed_"):
            ax.plot(df["mult"] * 1.08, df[col], ".", color="black", ms=2.5, alpha=0.6)
    ax.plot([], [], ".", color="black", ms=2.5, label="seeds")
    if isinstance(budget, int):
        style.hline(ax, budget, f"not reached in {budget} steps", ls=":")
    ax.set_xscale("log")
    ax.set_xticks(df["mult"], [f"{m:g}×" for m in df["mult"]])
    ax.minorticks_off()
    ax.axvline(1.0, color=style.REF_COLOR, lw=0.6, ls=":")
    ax.set_xlabel("value learning rate / routing learning rate")
    ax.set_ylabel("steps to SGD's final loss [steps]")
    ax.legend(loc="best")
    return fig


def _sweep_caption(df: pd.DataFrame) -> str:
    best = df.loc[df["steps_mean"].idxmin()]
    return (f"Steps for the EM-like arm to reach SGD's mean final loss against the value-LR multiplier "
            f"(mean ± std over seeds; dots: seeds; 1× is SGD itself). Fastest at {best['mult']:g}× with "
            f"{fmt_pm(best['steps_mean'], best['steps_std'], 0)} steps.")


# the learning-rate control arms of dyntool.sims.sticky_config.CONTROLS (a test keeps the two equal; not
# imported, so that drawing figures does not import the simulation and torch)
CONTROLS = ("readout", "routing", "all", "sgd_tuned")
NO_CONTROLS = ("the study has no learning-rate control arm (readout, routing, all, sgd_tuned) in summary.json "
               "'arms'; run dyntool sim sticky-markov --controls")


def _control_arms(runs) -> list[str]:
    arms = summary_of(runs[0]).get("arms") if runs else None
    return [a for a in CONTROLS if isinstance(arms, dict) and isinstance(arms.get(a), dict)]


def _controls_study(runs):
    """The first study among the inputs that ran a control arm, else the first study (then skipped)."""
    for rs in _by_study(runs):
        if _control_arms(rs):
            return [r for r in rs if not is_sweep(r)]
    return main_study(runs)


def _check_controls(runs):
    need(_control_arms(runs), NO_CONTROLS)
    arms = summary_of(runs[0])["arms"]
    need(all(isinstance(e.get("steps_to_target"), dict) for e in arms.values()),
         "summary.json 'arms' entries need 'steps_to_target'")
    return True, ""


@figure("controls", "Steps to SGD's final loss and final held-out loss, per learning-rate arm", KIND,
        needs="a sticky-markov study with learning-rate control arms (readout, routing, all, sgd_tuned) in "
              "summary.json 'arms': dyntool sim sticky-markov --controls (or --arms sgd,em,routing,...); "
              "drawn for the arms the study ran",
        group="dynamics", pick=_controls_study, check=_check_controls)
def controls(runs, **opts):
    df, study = _controls_data(runs)
    return _controls_draw(df, study), df, _controls_caption(df, study)


def _controls_data(runs) -> tuple[pd.DataFrame, dict]:
    """-> (one row per arm of summary.json 'arms': LRs, steps to SGD's final loss (mean, std, seeds),
    final held-out loss, the paired difference against em; the study numbers the caption quotes)."""
    summ = summary_of(runs[0])
    rows = []
    for a, e in summ["arms"].items():
        st = e["steps_to_target"]
        row = {"arm": a, "lrs": "/".join(f"{v:g}" for v in e.get("lrs", [])), "steps_mean": st["mean"],
               "steps_std": st["std"]}
        for k, v in enumerate(st.get("per_seed", [])):
            row[f"steps_seed{k}"] = v
        fh = e.get("final_heldout_loss")
        if fh:
            row.update(heldout_mean=fh["mean"], heldout_std=fh["std"])
        vs = (e.get("vs_em") or {}).get("steps_to_target")
        if vs:
            row.update(vs_em_diff=vs["mean_diff"], vs_em_p=vs["p"])
        rows.append(row)
    study = {"n_steps": int(summ.get("steps", 0)), "threshold": summ.get("sgd_final_threshold", float("nan")),
             "h_min": summ.get("h_min", float("nan")), "sgd_tuned": summ.get("sgd_tuned") or {},
             "missing": [a for a in CONTROLS if a not in summ["arms"]]}
    return pd.DataFrame(rows), study


def _controls_draw(df: pd.DataFrame, study: dict):
    names, n_steps = list(df["arm"]), study["n_steps"]
    fig = style.figure(style.DOUBLE, 2.4)
    ax, bx = fig.subplots(1, 2)
    x = np.arange(len(names))
    cols = [style.arm_color(a, k) for k, a in enumerate(names)]
    # SGD defines the target (its own mean final loss), so its bar would only restate the budget
    shown = np.array([a != "sgd" for a in names])
    ax.bar(x[shown], df["steps_mean"][shown], yerr=df["steps_std"][shown], color=[c for c, k in zip(cols, shown) if k],
           capsize=2, alpha=0.85)
    for k in range(len(names)):
        if not shown[k]:
            ax.text(k, 0.02 * max(n_steps, 1), "sets the\ntarget", ha="center", va="bottom", fontsize=6)
            continue
        pts = [v for c, v in df.iloc[k].items() if str(c).startswith("steps_seed")]
        ax.plot(np.full(len(pts), k) + np.linspace(-0.15, 0.15, len(pts)), pts, ".", color="black", ms=2.5)
    if n_steps:
        style.hline(ax, n_steps, f"not reached in {n_steps} steps", ls=":")
        ax.text(-0.45, n_steps, f"not reached in {n_steps} steps", va="bottom", fontsize=6, color=style.REF_COLOR)
        ax.set_ylim(0, 1.12 * n_steps)
    ticks = [style.arm_label(a, short=True) for a in names]
    ax.set_xticks(x, ticks, rotation=20)
    ax.set_xlim(-0.65, len(names) - 0.35)
    ax.set_ylabel("steps to SGD's mean final loss")
    style.panel_label(ax, "a")
    if "heldout_mean" in df:
        bx.errorbar(x, df["heldout_mean"], yerr=df["heldout_std"], fmt="none", ecolor="black", capsize=2)
        bx.scatter(x, df["heldout_mean"], c=cols, s=18, zorder=3)
        bx.set_xticks(x, ticks, rotation=20)
        bx.set_ylabel("final held-out loss [nats]")
        style.panel_label(bx, "b")
    else:
        bx.set_axis_off()
    return fig


def _controls_caption(df: pd.DataFrame, study: dict) -> str:
    names, tuned, missing = list(df["arm"]), study["sgd_tuned"], study["missing"]
    parts = [f"{style.arm_label(a)} " + ("(target)" if a == "sgd" else f"{r.steps_mean:.0f} ± {r.steps_std:.0f}") +
             (f" (held-out {r.heldout_mean:.4f})" if "heldout_mean" in df else "") for a, r in zip(names, df.itertuples())]
    return ("Learning-rate controls on the sticky chain (mean ± sample std over seeds, ddof = 1; dots: seeds). "
            "(a) steps until the training loss first falls below SGD's mean final training loss "
            f"({study['threshold']:.4f} nats; {study['n_steps']} if never). (b) final loss on "
            "the held-out sequence (H_min = " + f"{study['h_min']:.4f} nats, off the axis). Learning rates "
            "W_Q/W_K/W_V/W_O: " + "; ".join(f"{style.arm_label(a)} {r}" for a, r in zip(names, df["lrs"])) + ". "
            + ("sgd_tuned uses one uniform learning rate, " + f"{tuned.get('picked_lr', float('nan')):g}, picked from "
               f"{tuned.get('grid')}: {tuned.get('rule', 'lowest mean final held-out loss over seeds')}. "
               if tuned else "")
            + "Measured: " + "; ".join(parts) + "."
            + (f" Control arms not in this study: {', '.join(missing)}." if missing else ""))
