"""LS-attention figures of the ls-logits study (arXiv 2505.15548; ``dyntool.train.ls_logits``):

* ``ls_logits_head_type`` — max|logit| per step per arm and head type (LS local / global), and every
  head of one LS run;
* ``ls_logits_context`` — its peak against the context length T.

Each is split as data (what the runs logged) → drawing → caption.

The other LS figures (loss and max logit per attention type, heat map, ablations) are
:mod:`dyntool.figures.ls`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import style
from ..record import metric_names as mn
from .common import need
from .ls import LS_TYPES, main_variant
from .registry import figure
from .train_common import KIND, attention, best_group, diverged, layer_logits, mean_curve, model_cfg, seed


def _arm(r) -> str:
    """Study arm: mhsa / mhsa_eager (materialised attention, the paper's fp32 baseline) / ls / qknorm."""
    t = attention(r)
    return "mhsa_eager" if t == "mhsa" and model_cfg(r).get("backend") == "manual" else t


ARM_LABEL = {"mhsa": "MHSA", "mhsa_eager": "MHSA eager", "ls": "LS", "qknorm": "QK-norm"}


def _T(r) -> int:
    return int(((r.config or {}).get("data") or {}).get("block_size", 0))


def _head_curves(r) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Head type ("local" | "global") -> (steps, max over layers and heads of that type per step)."""
    out = {}
    for grp, (steps, mat) in layer_logits(r).items():
        out["global" if grp == "all" else grp] = (steps, np.nanmax(mat, axis=0))
    return out


def _head_type_runs(runs):
    grp = best_group(runs, lambda rs: len({_arm(r) for r in rs if any(k in ("local", "global", "all")
                                                                       for k in layer_logits(r))}))
    grp = [r for r in grp if attention(r) in LS_TYPES and layer_logits(r)]
    if not grp:
        return []
    T = max(_T(r) for r in grp)                      # the longest context of a sweep
    grp = [r for r in grp if _T(r) == T]
    ls_main = main_variant([r for r in grp if attention(r) == "ls"]) if any(attention(r) == "ls" for r in grp) else []
    return [r for r in grp if attention(r) != "ls"] + ls_main      # LS ablation variants left out


def _check_head_type(runs):
    need(any(attention(r) == "ls" and "local" in layer_logits(r) for r in runs),
         "needs an LS train run logging per-head max logits (logit_max/L{l}H{h})")
    return True, ""


@figure("ls_logits_head_type", "Max logit per step by head type (ls-logits study)", KIND,
        needs="ls-logits study runs logging logit_max/L{l}H{h} (an LS run and at least one other arm)",
        group="ls", pick=_head_type_runs, check=_check_head_type)
def ls_logits_head_type(runs, **opts):
    data, extras = _head_type_data(runs)
    return _head_type_draw(extras), data, _head_type_caption(extras)


def _head_type_data(runs) -> tuple[pd.DataFrame, dict]:
    """-> (per arm and head type the max logit per step, mean and std over seeds, then every head
    of one LS run as logged; the same curves for the drawing, with the LS run's T, head dim, window)."""
    rows, curves = [], []
    arms = sorted({_arm(r) for r in runs}, key=lambda a: list(ARM_LABEL).index(a) if a in ARM_LABEL else 9)
    for k, arm in enumerate(arms):
        rs = sorted([r for r in runs if _arm(r) == arm], key=seed)
        for kind in ("global", "local"):
            cs = [c[kind] for c in map(_head_curves, rs) if kind in c]
            if not cs:
                continue
            s, mu, sd = mean_curve(cs)
            curves.append({"arm": arm, "k": k, "kind": kind, "n": len(cs), "step": s, "mean": mu, "std": sd})
            rows.append(pd.DataFrame({"arm": arm, "heads": kind, "step": s, "max_logit_mean": mu, "std": sd}))
    ls_run = next(r for r in sorted(runs, key=seed) if attention(r) == "ls" and "local" in layer_logits(r))
    m = model_cfg(ls_run)
    n_local = int(m.get("n_local", 0))
    heads = []
    for (l, h), col in sorted(mn.per_head(ls_run.metrics.columns, mn.LOGIT_MAX).items()):   # every LS head
        sub = ls_run.metrics[["step", col]].dropna()
        kind = "local" if h < n_local else "global"
        heads.append((kind, sub["step"], sub[col]))
        rows.append(pd.DataFrame({"arm": "ls", "heads": f"L{l}H{h} {kind}", "step": sub["step"],
                                  "max_logit_mean": sub[col], "std": 0.0}))
    extras = {"curves": curves, "heads": heads, "ls_run": ls_run.id, "T": _T(ls_run), "window": m.get("window"),
              "head_dim": m.get("n_embd", 0) // max(m.get("n_head", 1), 1)}
    return pd.concat(rows, ignore_index=True), extras


def _who(c: dict) -> str:
    return f"{ARM_LABEL.get(c['arm'], c['arm'])} {c['kind']} heads"


def _head_type_draw(extras: dict):
    fig = style.figure(style.DOUBLE, 2.4)
    ax, bx = fig.subplots(1, 2, sharey=True)
    for c in extras["curves"]:
        color = style.attn_color("mhsa" if c["arm"] == "mhsa_eager" else c["arm"], c["k"])
        style.band(ax, c["step"], c["mean"], c["std"], color, ls="--" if c["kind"] == "local" else "-",
                   label=f"{_who(c)} ({c['n']} run{'s' if c['n'] > 1 else ''})")
    for kind, steps, values in extras["heads"]:
        bx.plot(steps, values, lw=0.6 if kind == "local" else 1.2, color=style.attn_color("ls"),
                ls="--" if kind == "local" else "-")
    bx.plot([], [], color=style.attn_color("ls"), lw=0.6, ls="--", label="local head")
    bx.plot([], [], color=style.attn_color("ls"), lw=1.2, label="global head")
    bx.set_title(f"LS run {extras['ls_run']}: every head", fontsize="small")
    for a, letter in ((ax, "a"), (bx, "b")):
        a.set_yscale("log")
        style.plain_log(a)
        a.set_xlabel(f"{style.STEP} [steps]")
        a.legend(loc="best", fontsize="x-small")
        style.panel_label(a, letter)
    ax.set_ylabel("max |q·k|/√d_h")
    return fig


def _head_type_caption(extras: dict) -> str:
    T, hd = extras["T"], extras["head_dim"]
    peaks = [f"{_who(c)} {np.nanmax(c['mean']):.2f}" for c in extras["curves"]]
    return (f"Largest pre-softmax logit |q_i·k_j|/√d_h over allowed (i, j) of each step's training batch, "
            f"T = {T}, head dim {hd} (n/d = {T / max(hd, 1):g}). (a) Per arm and head type, "
            "the maximum over layers and heads of that type (LS: local = sliding-window heads, window "
            f"{extras['window']}; global = causal heads; MHSA/QK-norm heads are all causal), mean ± std over "
            f"seeds. Peak of the mean — {'; '.join(peaks)}. (b) Every head of one LS run (one line per "
            "layer and head).")


def _context_runs(runs):
    grp = best_group(runs, lambda rs: len({_T(r) for r in rs if attention(r) in LS_TYPES}))
    return [r for r in grp if attention(r) in LS_TYPES and layer_logits(r)]


def _check_context(runs):
    Ts = {_T(r) for r in runs}
    need(len(Ts) >= 2, f"needs ls-logits runs at ≥ 2 context lengths (data.block_size); found {sorted(Ts) or 'none'}")
    return True, ""


@figure("ls_logits_context", "Peak max logit vs context length (ls-logits study)", KIND,
        needs="ls-logits study runs at ≥ 2 data.block_size values logging per-head max logits",
        group="ls", pick=_context_runs, check=_check_context)
def ls_logits_context(runs, **opts):
    data = _context_data(runs)
    return _context_draw(data), data, _context_caption(data)


def _context_data(runs) -> pd.DataFrame:
    """One row per run and head type: T, the peak and the last of its per-step max logit."""
    rows = []
    for r in runs:
        for kind, (s, v) in _head_curves(r).items():
            if len(v) and np.isfinite(v).any():
                rows.append({"arm": _arm(r), "heads": kind, "T": _T(r), "seed": seed(r), "run": r.id,
                             "peak_max_logit": float(np.nanmax(v)), "last_max_logit": float(v[np.isfinite(v)][-1]),
                             "diverged_at": diverged(r)})
    df = pd.DataFrame(rows)
    need(len(df), "no per-head max logits in these runs")
    return df


def _context_stats(df: pd.DataFrame):
    """(arm, head type, colour index, per-T mean and std of the peak over seeds)."""
    for k, ((arm, kind), g) in enumerate(df.groupby(["arm", "heads"], sort=True)):
        yield arm, kind, k, g.groupby("T")["peak_max_logit"].agg(["mean", "std"]).fillna(0.0)


def _context_draw(df: pd.DataFrame):
    fig = style.figure(style.SINGLE, 2.4)
    ax = fig.subplots()
    for arm, kind, k, st in _context_stats(df):
        c = style.attn_color("mhsa" if arm == "mhsa_eager" else arm, k)
        ax.errorbar(st.index, st["mean"], yerr=st["std"], marker="o", capsize=2, color=c,
                    ls="--" if kind == "local" else "-", label=f"{ARM_LABEL.get(arm, arm)} {kind}")
    ax.set_xscale("log", base=2)
    Ts = sorted(df["T"].unique())
    ax.set_xticks(Ts, [str(int(t)) for t in Ts])
    ax.minorticks_off()
    ax.set_yscale("log")
    style.plain_log(ax)
    ax.set_xlabel("context length T [tokens]")
    ax.set_ylabel("peak max |q·k|/√d_h")
    ax.legend(loc="best", fontsize="x-small")
    return fig


def _context_caption(df: pd.DataFrame) -> str:
    desc = [f"{ARM_LABEL.get(arm, arm)} {kind}: " + ", ".join(f"{int(t)}→{m:.2f}" for t, m in st["mean"].items())
            for arm, kind, _, st in _context_stats(df)]
    return ("Peak over training of the per-step largest pre-softmax logit, per arm and head type, against the "
            "context length T (mean ± std over seeds; dashed: LS sliding-window heads). Values (T→peak): "
            + "; ".join(desc) + ".")
