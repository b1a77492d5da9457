"""LS-attention figures from WikiText training runs (arXiv 2505.15548):

* ``ls_loss_logits`` — training loss (validation overlaid) and model max|logit| per step for mhsa /
  ls / qknorm, mean ± std over seeds, divergence points marked (the paper's Fig. 1 analogue);
* ``ls_logit_heatmap`` — layer × step max|logit|, LS split into local-head and global-head maxima;
* ``ls_window_ablation`` / ``ls_global_ablation`` — final validation perplexity and peak max|logit|
  against the window p / the number of global heads, where such runs exist.

The ls-logits study's figures (per head type, per context length) are :mod:`dyntool.figures.ls_logits`.
"""
from __future__ import annotations


import numpy as np
import pandas as pd

from . import style
from ..stats import mean_std
from .common import metric, need
from .registry import figure
from .train_common import (KIND, attention, best_group, diverged, final_val, layer_logits, logit_series,
                           mean_curve, model_cfg, seed, smooth)

LS_TYPES = ("mhsa", "ls", "qknorm")


def _ls_runs(runs):
    """The study with the most attention types among mhsa/ls/qknorm; its runs of those types."""
    grp = best_group(runs, lambda rs: len({attention(r) for r in rs} & set(LS_TYPES)))
    return [r for r in grp if attention(r) in LS_TYPES]


def _variant(r) -> tuple:
    m = model_cfg(r)
    return (m.get("window"), m.get("n_local"), m.get("n_global")) if attention(r) == "ls" else ()


def main_variant(rs: list) -> list:
    """The runs of the most common configuration (LS: window / head split); ties go to the
    toolkit's default configuration, then to the first seen.  Ablation runs have their own figures."""
    groups: dict[tuple, list] = {}
    for r in rs:
        groups.setdefault(_variant(r), []).append(r)
    from ..train.config import ModelConfig      # imported here: figures load without the trainer's modules
    d = ModelConfig()
    default = (d.window, d.n_local, d.n_global)
    best = max(groups.items(), key=lambda kv: (len(kv[1]), kv[0] == default))
    return best[1]


def _by_type(runs) -> dict[str, list]:
    out = {}
    for t in LS_TYPES:
        rs = sorted([r for r in runs if attention(r) == t], key=seed)
        if rs:
            out[t] = main_variant(rs)
    return out


def _check_curves(runs):
    need(runs, "needs train runs with model.attention in mhsa / ls / qknorm")
    need(any(len(metric(r, "loss")[0]) and len(logit_series(r)[0]) for r in runs),
         "no mhsa/ls/qknorm run logged both 'loss' and a max-logit statistic (logit_max*)")
    return True, ""


@figure("ls_loss_logits", "Training loss and max logit: MHSA vs LS vs QK-norm", KIND,
        needs="train runs (model.attention mhsa / ls / qknorm) logging loss and logit_max per step",
        group="ls", pick=_ls_runs, check=_check_curves)
def ls_loss_logits(runs, **opts):
    types = _by_type(runs)
    fig = style.figure(style.SINGLE, 3.6)
    ax, bx = fig.subplots(2, 1, sharex=True)
    rows = []
    for k, (t, rs) in enumerate(types.items()):
        c = style.attn_color(t, k)
        loss = [metric(r, "loss") for r in rs if len(metric(r, "loss")[0])]
        lm = [logit_series(r) for r in rs if len(logit_series(r)[0])]
        val = [metric(r, "val_loss") for r in rs if len(metric(r, "val_loss")[0])]
        lab = f"{style.attn_label(t)} (n = {len(rs)})"
        if t == "ls":
            w, nl, ng = _variant(rs[0])
            lab = f"LS p={w}, {nl} local + {ng} global (n = {len(rs)})"
        if loss:
            s, mu, sd = mean_curve(loss)
            w = max(1, (len(s) // 60) | 1)
            ax.plot(s, mu, color=c, alpha=0.25, lw=0.5)
            ax.plot(s, smooth(mu, w), color=c, label=lab)
            if len(rs) > 1:
                ax.fill_between(s, smooth(mu - sd, w), smooth(mu + sd, w), color=c, alpha=0.15, lw=0)
        if val:
            s, mu, _ = mean_curve(val)
            ax.plot(s, mu, "o--", color=c, ms=2.5, lw=0.7, mfc="white")
        if lm:
            s, mu, sd = mean_curve(lm)
            style.band(bx, s, mu, sd, c, label=lab)
        for r in rs:
            d = diverged(r)
            sl, vl = metric(r, "loss")
            ok = np.isfinite(vl)
            if d is not None and ok.any():
                ax.plot(d, vl[ok][-1], "x", color=c, ms=6, mew=1.5)
                ls_, lv = logit_series(r)
                if len(ls_):
                    bx.plot(d, np.nanmax(lv), "x", color=c, ms=6, mew=1.5)
            for (s_, v_), col in ((metric(r, "loss"), "loss"), (metric(r, "val_loss"), "val_loss"),
                                  (logit_series(r), "logit_max")):
                rows.append(pd.DataFrame({"attention": t, "seed": seed(r), "run": r.id, "step": s_,
                                          "quantity": col, "value": v_}))
    ax.plot([], [], "o--", color=style.REF_COLOR, ms=2.5, lw=0.7, mfc="white", label="validation")
    ax.set_ylabel(style.LOSS)
    ax.legend(loc="upper right")
    style.panel_label(ax, "a")
    bx.set_yscale("log")
    style.plain_log(bx)
    bx.set_ylabel("max |q·k|/√d_h (model max)")
    bx.set_xlabel(f"{style.STEP} [steps]")
    style.panel_label(bx, "b")
    df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    peaks = "; ".join(f"{style.attn_label(t)} {np.nanmax([np.nanmax(logit_series(r)[1]) for r in rs if len(logit_series(r)[0])]):.1f}"
                      for t, rs in types.items() if any(len(logit_series(r)[0]) for r in rs))
    ndiv = sum(diverged(r) is not None for rs in types.values() for r in rs)
    caption = ("(a) Training loss per step (faint: mean over seeds; solid: moving average; band: ± std) with "
               "validation loss (open circles), and (b) the largest pre-softmax attention logit "
               "|q_i·k_j|/√d_h over all layers, heads and allowed (i, j) of the step's batch (log scale), "
               f"per attention type, mean ± std over seeds. Peak max-logit — {peaks}. "
               + (f"× marks the {ndiv} run(s) whose loss became non-finite." if ndiv else "No run diverged."))
    return fig, df, caption


def _check_heat(runs):
    need(runs, "needs train runs with model.attention in mhsa / ls / qknorm")
    need(any(layer_logits(r) for r in runs), "no run logged per-layer max logits (logit_max/L{l}...) or "
                                             "recorded the logit_max array")
    return True, ""


@figure("ls_logit_heatmap", "Layer × step max logit (local vs global heads)", KIND,
        needs="train runs (mhsa / ls / qknorm) logging logit_max/L{l} (LS: logit_max/L{l}H{h}) "
              "or recording the logit_max array", group="ls", pick=_ls_runs, check=_check_heat)
def ls_logit_heatmap(runs, **opts):
    from matplotlib.colors import LogNorm
    panels = []
    for t, rs in _by_type(runs).items():
        r = next((x for x in rs if layer_logits(x)), None)
        if r is None:
            continue
        for grp, (steps, mat) in sorted(layer_logits(r).items(), key=lambda kv: ("all", "local", "global").index(kv[0])
                                        if kv[0] in ("all", "local", "global") else 9):
            panels.append((t, grp, r, steps, mat))
    need(panels, "no per-layer max logits found")
    vals = np.concatenate([p[4][np.isfinite(p[4]) & (p[4] > 0)] for p in panels])
    norm = LogNorm(vmin=max(float(vals.min()), 1e-3), vmax=float(vals.max()))
    fig = style.figure(style.DOUBLE, max(1.7, 0.9 + 0.22 * max(p[4].shape[0] for p in panels)))
    axs = np.atleast_1d(fig.subplots(1, len(panels), sharey=True))
    rows = []
    for k, (t, grp, r, steps, mat) in enumerate(panels):
        ax = axs[k]
        L = mat.shape[0]
        im = ax.imshow(mat, aspect="auto", norm=norm, cmap="magma", interpolation="nearest",
                       extent=(steps[0] - 0.5, steps[-1] + 0.5, L - 0.5, -0.5))
        nl, ng = model_cfg(r).get("n_local", "?"), model_cfg(r).get("n_global", "?")
        heads = {"all": "all heads", "local": f"{nl} local head{'' if nl == 1 else 's'}",
                 "global": f"{ng} global head{'' if ng == 1 else 's'}"}[grp]
        ax.set_title(f"{style.attn_label(t)}: {heads}")
        ax.set_xlabel(f"{style.STEP} [steps]")
        ax.set_yticks(range(L))
        for l in range(L):
            rows.append(pd.DataFrame({"attention": t, "heads": grp, "run": r.id, "layer": l, "step": steps,
                                      "logit_max": mat[l]}))
    axs[0].set_ylabel("layer")
    cb = fig.colorbar(im, ax=list(axs), label="max |q·k|/√d_h", shrink=0.9, aspect=12)
    style.plain_log(cb.ax)
    caption = ("Largest pre-softmax logit per layer and step (colour, log scale), one run per attention type "
               "(lowest seed); for LS the maximum over the sliding-window (local) heads and over the "
               "full-causal (global) heads are shown separately.")
    return fig, pd.concat(rows, ignore_index=True), caption


def _ablation_runs(key):
    def pick(runs):
        def score(rs):
            return len({model_cfg(r).get(key) for r in rs if attention(r) == "ls"})
        grp = best_group(runs, score)
        return [r for r in grp if attention(r) in ("ls", "mhsa")]
    return pick


def _ablation_check(key, what):
    def check(runs):
        vals = {model_cfg(r).get(key) for r in runs if attention(r) == "ls"}
        need(len(vals) >= 2, f"needs LS runs with at least 2 different {what} (model.{key}); found "
                             f"{sorted(v for v in vals if v is not None) or 'none'}")
        return True, ""
    return check


def _ablation(runs, key, xlabel, what):
    """One-factor ablation: LS runs vary ``key`` with the other LS settings held at their most
    common value (so a window sweep is not mixed with a head-split sweep)."""
    others = {"window": ("n_local", "n_global"), "n_global": ("window",)}[key]
    ls_runs = [r for r in runs if attention(r) == "ls"]
    fixed = pd.Series([tuple(model_cfg(r).get(o) for o in others) for r in ls_runs]).mode()
    fixed = fixed.iloc[0] if len(fixed) else None
    runs = [r for r in runs if attention(r) != "ls" or tuple(model_cfg(r).get(o) for o in others) == fixed]
    rows = []
    for r in runs:
        if attention(r) == "ls":
            x = model_cfg(r).get(key)
        else:                                   # MHSA: every head global, no window
            x = model_cfg(r).get("n_head") if key == "n_global" else None
        vl, ppl = final_val(r)
        s, lm = logit_series(r)
        div = diverged(r)
        rows.append({"attention": attention(r), key: x, "seed": seed(r), "run": r.id,
                     "val_loss": vl if div is None else np.nan, "val_ppl": ppl if div is None else np.nan,
                     "peak_logit_max": float(np.nanmax(lm)) if len(lm) and np.isfinite(lm).any() else np.nan,
                     "diverged_at": div})
    df = pd.DataFrame(rows)
    ls_df = df[(df["attention"] == "ls") & df[key].notna()]
    g = ls_df.groupby(key)
    means, stds = g[["val_ppl", "peak_logit_max"]].mean(), g[["val_ppl", "peak_logit_max"]].agg(lambda s: mean_std(s)[1])
    xs = means.index.to_numpy(float)
    fig = style.figure(style.DOUBLE, 2.2)
    axs = fig.subplots(1, 2)
    c = style.attn_color("ls")
    for ax, col, ylab, log in ((axs[0], "val_ppl", "final validation perplexity", False),
                               (axs[1], "peak_logit_max", "peak max |q·k|/√d_h", True)):
        ax.errorbar(xs, means[col], yerr=stds[col].fillna(0), color=c, marker="o", capsize=2,
                    label="LS, mean ± std")
        ax.plot(ls_df[key], ls_df[col], ".", color="black", ms=2, alpha=0.6)
        mh = df[df["attention"] == "mhsa"]
        if len(mh) and mh[col].notna().any():
            if key == "n_global" and mh[key].notna().any():
                ax.errorbar([float(mh[key].iloc[0])], [mh[col].mean()], yerr=[mean_std(mh[col])[1]],
                            color=style.attn_color("mhsa"), marker="s", capsize=2, ls="none",
                            label="MHSA (all heads global)")
            else:
                style.hline(ax, float(mh[col].mean()), "MHSA", color=style.attn_color("mhsa"))
        if key == "window":
            ax.set_xscale("log", base=2)
        ticks = sorted(set(xs) | ({float(mh[key].iloc[0])} if key == "n_global" and len(mh) and mh[key].notna().any()
                                  else set()))
        ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylab)
        if log:
            ax.set_yscale("log")
            style.plain_log(ax)
        ax.legend(loc="best")
    style.panel_label(axs[0], "a")
    style.panel_label(axs[1], "b")
    held = ", ".join(f"{o} = {v}" for o, v in zip(others, fixed or ()))
    caption = (f"LS-attention ablation over {what} ({held} held fixed): (a) final validation perplexity and "
               "(b) the peak over training of the model-max pre-softmax logit, mean ± sample std (ddof = 1) over "
               "seeds (dots: seeds); MHSA for reference where such runs exist. Runs whose loss diverged "
               f"are left out of (a) ({int(df['diverged_at'].notna().sum())} here).")
    return fig, df, caption


@figure("ls_window_ablation", "LS ablation: window size", KIND,
        needs="LS train runs (model.attention = ls) with ≥ 2 different model.window", group="ls",
        pick=_ablation_runs("window"), check=_ablation_check("window", "window sizes"))
def ls_window_ablation(runs, **opts):
    return _ablation(runs, "window", "window p (keys per local head) [tokens]", "the local window p")


@figure("ls_global_ablation", "LS ablation: number of global heads", KIND,
        needs="LS train runs (model.attention = ls) with ≥ 2 different model.n_global", group="ls",
        pick=_ablation_runs("n_global"), check=_ablation_check("n_global", "numbers of global heads"))
def ls_global_ablation(runs, **opts):
    return _ablation(runs, "n_global", "global heads g", "the number of global heads g")
