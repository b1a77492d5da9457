"""LS-attention figures from WikiText training runs (arXiv 2505.15548):

* ``ls_loss_logits`` — training loss (validation overlaid) and model max|logit| per step for mhsa /
  ls / qknorm, mean ± std over seeds, divergence points marked (the paper's Fig. 1 analogue);
* ``ls_logit_heatmap`` — layer × step max|logit|, LS split into local-head and global-head maxima;
* ``ls_window_ablation`` / ``ls_global_ablation`` — final validation perplexity and peak max|logit|
  against the window p / the number of global heads, where such runs exist.

Each figure is split as data (what the runs logged and recorded) → drawing → caption.

The ls-logits study's figures (per head type, per context length) are :mod:`dyntool.figures.ls_logits`.
"""
from __future__ import annotations


import numpy as np
import pandas as pd

from . import style
from ..stats import mean_std
from ..train.config import ModelConfig
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
    data, types = _loss_logits_data(runs)
    return _loss_logits_draw(types), data, _loss_logits_caption(types)


def _loss_logits_data(runs) -> tuple[pd.DataFrame, list[dict]]:
    """-> (one row per run, step and quantity: loss, val_loss, logit_max as logged; per attention
    type its runs' curves, where and at what loss / max logit a run diverged, and its peak max logit)."""
    rows, types = [], []
    for k, (t, rs) in enumerate(_by_type(runs).items()):
        info = {"attention": t, "k": k, "n": len(rs), "variant": _variant(rs[0]),
                "loss": [metric(r, "loss") for r in rs if len(metric(r, "loss")[0])],
                "lm": [logit_series(r) for r in rs if len(logit_series(r)[0])],
                "val": [metric(r, "val_loss") for r in rs if len(metric(r, "val_loss")[0])],
                "marks": [], "n_diverged": 0}
        info["peak"] = np.nanmax([np.nanmax(v) for _, v in info["lm"]]) if info["lm"] else None
        for r in rs:
            d = diverged(r)
            vl = metric(r, "loss")[1]
            ok = np.isfinite(vl)
            info["n_diverged"] += d is not None
            if d is not None and ok.any():
                lv = logit_series(r)[1]
                info["marks"].append((d, vl[ok][-1], np.nanmax(lv) if len(lv) else None))
            for (s_, v_), col in ((metric(r, "loss"), "loss"), (metric(r, "val_loss"), "val_loss"),
                                  (logit_series(r), "logit_max")):
                rows.append(pd.DataFrame({"attention": t, "seed": seed(r), "run": r.id, "step": s_,
                                          "quantity": col, "value": v_}))
        types.append(info)
    return (pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()), types


def _loss_logits_draw(types: list[dict]):
    fig = style.figure(style.SINGLE, 3.6)
    ax, bx = fig.subplots(2, 1, sharex=True)
    for info in types:
        _loss_logits_type(ax, bx, info)
    ax.plot([], [], "o--", color=style.REF_COLOR, ms=2.5, lw=0.7, mfc="white", label="validation")
    ax.set_ylabel(style.LOSS)
    ax.legend(loc="upper right")
    style.panel_label(ax, "a")
    bx.set_yscale("log")
    style.plain_log(bx)
    bx.set_ylabel("max |q·k|/√d_h (model max)")
    bx.set_xlabel(f"{style.STEP} [steps]")
    style.panel_label(bx, "b")
    return fig


def _loss_logits_type(ax, bx, info: dict) -> None:
    """One attention type: (a) its loss (faint mean, moving average, ± std) and validation loss,
    (b) its max logit, mean ± std; × where a run diverged."""
    t, n = info["attention"], info["n"]
    c = style.attn_color(t, info["k"])
    lab = f"{style.attn_label(t)} (n = {n})"
    if t == "ls":
        w, nl, ng = info["variant"]
        lab = f"LS p={w}, {nl} local + {ng} global (n = {n})"
    if info["loss"]:
        s, mu, sd = mean_curve(info["loss"])
        w = max(1, (len(s) // 60) | 1)
        ax.plot(s, mu, color=c, alpha=0.25, lw=0.5)
        ax.plot(s, smooth(mu, w), color=c, label=lab)
        if n > 1:
            ax.fill_between(s, smooth(mu - sd, w), smooth(mu + sd, w), color=c, alpha=0.15, lw=0)
    if info["val"]:
        s, mu, _ = mean_curve(info["val"])
        ax.plot(s, mu, "o--", color=c, ms=2.5, lw=0.7, mfc="white")
    if info["lm"]:
        s, mu, sd = mean_curve(info["lm"])
        style.band(bx, s, mu, sd, c, label=lab)
    for d, loss, logit in info["marks"]:
        ax.plot(d, loss, "x", color=c, ms=6, mew=1.5)
        if logit is not None:
            bx.plot(d, logit, "x", color=c, ms=6, mew=1.5)


def _loss_logits_caption(types: list[dict]) -> str:
    peaks = "; ".join(f"{style.attn_label(i['attention'])} {i['peak']:.1f}" for i in types if i["lm"])
    ndiv = sum(i["n_diverged"] for i in types)
    return ("(a) Training loss per step (faint: mean over seeds; solid: moving average; band: ± std) with "
            "validation loss (open circles), and (b) the largest pre-softmax attention logit "
            "|q_i·k_j|/√d_h over all layers, heads and allowed (i, j) of the step's batch (log scale), "
            f"per attention type, mean ± std over seeds. Peak max-logit — {peaks}. "
            + (f"× marks the {ndiv} run(s) whose loss became non-finite." if ndiv else "No run diverged."))


def _check_heat(runs):
    need(runs, "needs train runs with model.attention in mhsa / ls / qknorm")
    need(any(layer_logits(r) for r in runs), "no run logged per-layer max logits (logit_max/L{l}...) or "
                                             "recorded the logit_max array")
    return True, ""


@figure("ls_logit_heatmap", "Layer × step max logit (local vs global heads)", KIND,
        needs="train runs (mhsa / ls / qknorm) logging logit_max/L{l} (LS: logit_max/L{l}H{h}) "
              "or recording the logit_max array", group="ls", pick=_ls_runs, check=_check_heat)
def ls_logit_heatmap(runs, **opts):
    data, panels = _heatmap_data(runs)
    return _heatmap_draw(panels), data, _heatmap_caption(data)


def _heatmap_data(runs) -> tuple[pd.DataFrame, list[dict]]:
    """-> (one row per panel, layer and step: the logged max logit; per panel (attention type ×
    head group, one run per type) its steps and (layer, step) matrix and the run's head split)."""
    order = ("all", "local", "global")
    panels = []
    for t, rs in _by_type(runs).items():
        r = next((x for x in rs if layer_logits(x)), None)
        if r is None:
            continue
        for grp, (steps, mat) in sorted(layer_logits(r).items(),
                                        key=lambda kv: order.index(kv[0]) if kv[0] in order else 9):
            panels.append({"attention": t, "heads": grp, "run": r.id, "steps": steps, "mat": mat,
                           "n_local": model_cfg(r).get("n_local", "?"), "n_global": model_cfg(r).get("n_global", "?")})
    need(panels, "no per-layer max logits found")
    rows = [pd.DataFrame({"attention": p["attention"], "heads": p["heads"], "run": p["run"], "layer": l,
                          "step": p["steps"], "logit_max": p["mat"][l]})
            for p in panels for l in range(p["mat"].shape[0])]
    return pd.concat(rows, ignore_index=True), panels


def _heatmap_draw(panels: list[dict]):
    from matplotlib.colors import LogNorm
    vals = np.concatenate([p["mat"][np.isfinite(p["mat"]) & (p["mat"] > 0)] for p in panels])
    norm = LogNorm(vmin=max(float(vals.min()), 1e-3), vmax=float(vals.max()))
    fig = style.figure(style.DOUBLE, max(1.7, 0.9 + 0.22 * max(p["mat"].shape[0] for p in panels)))
    axs = np.atleast_1d(fig.subplots(1, len(panels), sharey=True))
    for ax, p in zip(axs, panels):
        steps, mat = p["steps"], p["mat"]
        L = mat.shape[0]
        im = ax.imshow(mat, aspect="auto", norm=norm, cmap="magma", interpolation="nearest",
                       extent=(steps[0] - 0.5, steps[-1] + 0.5, L - 0.5, -0.5))
        nl, ng = p["n_local"], p["n_global"]
        heads = {"all": "all heads", "local": f"{nl} local head{'' if nl == 1 else 's'}",
                 "global": f"{ng} global head{'' if ng == 1 else 's'}"}[p["heads"]]
        ax.set_title(f"{style.attn_label(p['attention'])}: {heads}")
        ax.set_xlabel(f"{style.STEP} [steps]")
        ax.set_yticks(range(L))
    axs[0].set_ylabel("layer")
    cb = fig.colorbar(im, ax=list(axs), label="max |q·k|/√d_h", shrink=0.9, aspect=12)
    style.plain_log(cb.ax)
    return fig


def _heatmap_caption(data: pd.DataFrame) -> str:
    return ("Largest pre-softmax logit per layer and step (colour, log scale), one run per attention type "
            "(lowest seed); for LS the maximum over the sliding-window (local) heads and over the "
            "full-causal (global) heads are shown separately.")


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


_HELD = {"window": ("n_local", "n_global"), "n_global": ("window",)}     # ablated key -> LS settings held fixed


def _ablation(runs, key, xlabel, what):
    """One-factor ablation: LS runs vary ``key`` with the other LS settings held at their most
    common value (so a window sweep is not mixed with a head-split sweep)."""
    data, fixed = _ablation_data(runs, key)
    return _ablation_draw(data, key, xlabel), data, _ablation_caption(data, key, fixed, what)


def _ablation_data(runs, key) -> tuple[pd.DataFrame, tuple | None]:
    """-> (one row per run: its ``key`` value, final validation loss and perplexity (as the run
    recorded them; NaN if it diverged), peak max logit, divergence step; the held LS settings)."""
    others = _HELD[key]
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
    return pd.DataFrame(rows), fixed


def _ablation_draw(df: pd.DataFrame, key: str, xlabel: str):
    ls_df = df[(df["attention"] == "ls") & df[key].notna()]
    g = ls_df.groupby(key)
    means, stds = g[["val_ppl", "peak_logit_max"]].mean(), g[["val_ppl", "peak_logit_max"]].agg(lambda s: mean_std(s)[1])
    fig = style.figure(style.DOUBLE, 2.2)
    axs = fig.subplots(1, 2)
    for ax, col, ylab, log in ((axs[0], "val_ppl", "final validation perplexity", False),
                               (axs[1], "peak_logit_max", "peak max |q·k|/√d_h", True)):
        _ablation_panel(ax, df, ls_df, means[col], stds[col], key, col)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylab)
        if log:
            ax.set_yscale("log")
            style.plain_log(ax)
        ax.legend(loc="best")
    style.panel_label(axs[0], "a")
    style.panel_label(axs[1], "b")
    return fig


def _ablation_panel(ax, df: pd.DataFrame, ls_df: pd.DataFrame, mean: pd.Series, std: pd.Series,
                    key: str, col: str) -> None:
    """LS mean ± std over seeds against ``key`` (dots: seeds), MHSA for reference."""
    xs = mean.index.to_numpy(float)
    ax.errorbar(xs, mean, yerr=std.fillna(0), color=style.attn_color("ls"), marker="o", capsize=2,
                label="LS, mean ± std")
    ax.plot(ls_df[key], ls_df[col], ".", color="black", ms=2, alpha=0.6)
    mh = df[df["attention"] == "mhsa"]
    mh_x = key == "n_global" and len(mh) and mh[key].notna().any()       # MHSA has a g: all its heads
    if len(mh) and mh[col].notna().any():
        if mh_x:
            ax.errorbar([float(mh[key].iloc[0])], [mh[col].mean()], yerr=[mean_std(mh[col])[1]],
                        color=style.attn_color("mhsa"), marker="s", capsize=2, ls="none",
                        label="MHSA (all heads global)")
        else:
            style.hline(ax, float(mh[col].mean()), "MHSA", color=style.attn_color("mhsa"))
    if key == "window":
        ax.set_xscale("log", base=2)
    ticks = sorted(set(xs) | ({float(mh[key].iloc[0])} if mh_x else set()))
    ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
    ax.minorticks_off()


def _ablation_caption(df: pd.DataFrame, key: str, fixed: tuple | None, what: str) -> str:
    held = ", ".join(f"{o} = {v}" for o, v in zip(_HELD[key], fixed or ()))
    return (f"LS-attention ablation over {what} ({held} held fixed): (a) final validation perplexity and "
            "(b) the peak over training of the model-max pre-softmax logit, mean ± sample std (ddof = 1) over "
            "seeds (dots: seeds); MHSA for reference where such runs exist. Runs whose loss diverged "
            f"are left out of (a) ({int(df['diverged_at'].notna().sum())} here).")


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
