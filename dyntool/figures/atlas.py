"""Figures of the attention atlas (``dyntool study atlas``, docs/atlas.md):

* ``atlas_grid`` — the atlas itself: one panel per (layer, head) of one run, its first-position
  mass, previous-token and induction scores over steps with their chance levels (dotted);
* ``atlas_olsson`` — Olsson et al.'s panels from the same study: training loss, the in-context
  loss gaps (WikiText, repeated sequences) and each run's largest induction score;
* ``atlas_gu`` — Gu et al.'s sink metric (share of heads with first-token mass > ε, their ε and
  ours) and the largest first-token mass, per run;
* ``atlas_drivers`` — what only per-step gradients show: per head of one run, the first column's
  advantage beside its mass, the copy key's advantage beside the induction score, the first
  token's value-gradient share.

Each is split as data (what the runs logged) → drawing → caption.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import style
from ..record import metric_names as mn
from ..train.atlas_scores import GU_EPS, OURS_FACTOR, chance_first_mass, chance_induction, chance_prev_token
from .common import need
from .registry import figure
from .train_common import KIND, attention, seed

NEEDS = "atlas study runs (dyntool study atlas) logging atlas_first_mass/L{l}H{h}"
SCORES = (("atlas_first_mass", "first-position mass", "blue"), ("atlas_prev_token", "previous token", "orange"),
          ("atlas_induction", "induction (prefix matching)", "vermillion"))


def _has_atlas(r) -> bool:
    return bool(mn.per_head(r.metrics.columns, "atlas_first_mass"))


def _atlas_runs(runs):
    """Every atlas run given (a study's arms and seeds may come from several study folders, as when
    seeds run as separate processes); MHSA first, then by arm and seed (the one-run figures draw the first)."""
    return sorted([r for r in runs if _has_atlas(r)], key=lambda r: (attention(r) != "mhsa", attention(r), seed(r)))


def _check(runs):
    need(runs, "needs " + NEEDS)
    return True, ""


def _T(r) -> int:
    return int(((r.config or {}).get("data") or {}).get("block_size", 0))


def _probed(r, col: str = "atlas_probe_loss") -> pd.DataFrame:
    """The rows where ``col`` was measured: the forward scores (``atlas_first_mass/...``, the sink
    metrics) and the gradient side (``atlas_probe_loss``, advantages) have their own schedules."""
    df = r.metrics
    return df[df[col].notna()].sort_values("step") if col in df else df.iloc[:0]


def _alpha(g) -> float:
    """Seeds of one arm share its colour and line style; later seeds are drawn lighter."""
    return 1.0 if int(g["seed"].iloc[0]) % 2 == 0 else 0.5


def _label(r) -> str:
    return f"{style.ATTN_LABELS.get(attention(r), attention(r))} s{seed(r)}"


def _long(r, bases) -> pd.DataFrame:
    """One run's per-head columns of ``bases`` as rows: step, layer, head, and one column per base
    (the rows where the first base was measured; a base on a sparser schedule is NaN between)."""
    df = _probed(r, "atlas_sink_gu")
    rows = []
    for (l, h), _ in sorted(mn.per_head(df.columns, bases[0]).items()):
        part = pd.DataFrame({"step": df["step"].to_numpy(), "layer": l, "head": h})
        for b in bases:
            col = mn.head(b, l, h)
            part[b] = df[col].to_numpy(float) if col in df else np.nan
        rows.append(part)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _grid(fig, n_layer, n_head):
    axes = np.atleast_2d(fig.subplots(n_layer, n_head, sharex=True, sharey=True, squeeze=False))
    return axes


# -- atlas_grid -------------------------------------------------------------------------------
@figure("atlas_grid", "The atlas: every head's sink, previous-token and induction scores over steps", KIND,
        needs=NEEDS, group="atlas", pick=_atlas_runs, check=_check)
def atlas_grid(runs, **opts):
    r = runs[0]
    data = _long(r, [b for b, _, _ in SCORES])
    need(len(data), f"run {r.id} has no probed step")
    T = _T(r)
    chance = {"atlas_first_mass": chance_first_mass(T), "atlas_prev_token": chance_prev_token(T),
              "atlas_induction": chance_induction(T // 2)}
    nl, nh = int(data["layer"].max()) + 1, int(data["head"].max()) + 1
    fig = style.figure(style.DOUBLE, 1.2 + 1.3 * nl)
    axes = _grid(fig, nl, nh)
    for (l, h), g in data.groupby(["layer", "head"]):
        ax = axes[l, h]
        for b, label, c in SCORES:
            ax.plot(g["step"], g[b], color=style.OKABE_ITO[c], lw=1, label=label)
            ax.axhline(chance[b], color=style.OKABE_ITO[c], lw=0.6, ls=":")
        ax.set_title(f"L{l}H{h}", fontsize="x-small")
        ax.set_ylim(0, 1)
    for ax in axes[-1]:
        ax.set_xlabel(style.STEP)
    axes[0, 0].legend(loc="upper left", fontsize="xx-small")
    last = data.sort_values("step").groupby(["layer", "head"]).last()
    best = {b: last[b].idxmax() for b, _, _ in SCORES}
    cap = (f"Run {r.id} ({_label(r)}, T = {T}): per head, on the fixed probe batches before each step's update, "
           f"the attention mass on the first position (WikiText windows), on the previous token, and on the "
           f"token after the previous occurrence of the current one (repeated random sequences); dotted: "
           f"uniform-attention chance (first {chance['atlas_first_mass']:.3f}, previous "
           f"{chance['atlas_prev_token']:.3f}, induction {chance['atlas_induction']:.3f}). At the last probed "
           f"step the highest are " + "; ".join(f"{lab}: L{best[b][0]}H{best[b][1]} {last[b].max():.3f}"
                                                 for b, lab, _ in SCORES) + ".")
    return fig, data, cap


# -- atlas_olsson -----------------------------------------------------------------------------
def _olsson_data(runs) -> pd.DataFrame:
    rows = []
    for r in runs:
        df = _probed(r)
        ind = df[list(mn.per_head(df.columns, "atlas_induction").values())].max(axis=1)
        rows.append(pd.DataFrame({"run": r.id, "arm": attention(r), "seed": seed(r), "step": df["step"],
                                  "loss": df["loss"], "icl_gap": df["atlas_icl_gap"],
                                  "rep_gap": df["atlas_rep_gap"], "max_induction": ind}))
    return pd.concat(rows, ignore_index=True)


@figure("atlas_olsson", "Olsson et al.'s panels: loss, in-context gaps and induction over steps", KIND,
        needs=NEEDS, group="atlas", pick=_atlas_runs, check=_check)
def atlas_olsson(runs, **opts):
    data = _olsson_data(runs)
    fig = style.figure(style.DOUBLE, 2.3)
    axes = fig.subplots(1, 4)
    cols = (("loss", "training loss [nats]"), ("icl_gap", "ICL score: late − early loss [nats]"),
            ("rep_gap", "repeat − first half loss [nats]"), ("max_induction", "largest induction score"))
    for k, (rid, g) in enumerate(data.groupby("run", sort=False)):
        c = style.attn_color(g["arm"].iloc[0], int(g["seed"].iloc[0]))
        for ax, (col, _) in zip(axes, cols):
            ax.plot(g["step"], g[col], color=c, lw=0.8, alpha=_alpha(g),
                    ls="-" if g["arm"].iloc[0] == "mhsa" else "--", label=rid)
    T = _T(runs[0])
    axes[3].axhline(chance_induction(T // 2), color=style.REF_COLOR, lw=0.6, ls=":")
    for ax, (col, lab) in zip(axes, cols):
        ax.set_xlabel(style.STEP)
        ax.set_title(lab, fontsize="x-small")
    axes[0].legend(fontsize="xx-small")
    end = data.sort_values("step").groupby("run").last()
    start = data.sort_values("step").groupby("run").first()
    cap = ("Olsson et al.'s quantities per run (solid MHSA, dashed QK-norm): training loss; the in-context-learning "
           "score (WikiText probe: mean loss at positions ≥ 0.9T minus at 0.08–0.12T); the same gap on repeated "
           "random sequences (loss on the repeat minus on the first half); the largest induction score over "
           "heads (dotted: chance). First → last: " + "; ".join(
               f"{rid}: ICL {start.loc[rid, 'icl_gap']:.3f}→{end.loc[rid, 'icl_gap']:.3f}, repeat "
               f"{start.loc[rid, 'rep_gap']:.3f}→{end.loc[rid, 'rep_gap']:.3f}, induction "
               f"{start.loc[rid, 'max_induction']:.3f}→{end.loc[rid, 'max_induction']:.3f}" for rid in end.index) + ".")
    return fig, data, cap


# -- atlas_gu -----------------------------------------------------------------------------------
@figure("atlas_gu", "Gu et al.'s sink metric over steps (their ε and ours)", KIND,
        needs=NEEDS, group="atlas", pick=_atlas_runs, check=_check)
def atlas_gu(runs, **opts):
    rows = []
    for r in runs:
        df = _probed(r, "atlas_sink_gu")
        fm = df[list(mn.per_head(df.columns, "atlas_first_mass").values())]
        rows.append(pd.DataFrame({"run": r.id, "arm": attention(r), "seed": seed(r), "step": df["step"],
                                  "sink_gu": df["atlas_sink_gu"], "sink_ours": df["atlas_sink_ours"],
                                  "max_first_mass": fm.max(axis=1), "mean_first_mass": fm.mean(axis=1)}))
    data = pd.concat(rows, ignore_index=True)
    T = _T(runs[0])
    fig = style.figure(style.DOUBLE, 2.3)
    axes = fig.subplots(1, 3)
    cols = (("sink_gu", f"sink metric, ε = {GU_EPS} (Gu)"), ("sink_ours", f"sink metric, ε = {OURS_FACTOR:g}×chance"),
            ("max_first_mass", "largest first-position mass"))
    for rid, g in data.groupby("run", sort=False):
        c = style.attn_color(g["arm"].iloc[0], int(g["seed"].iloc[0]))
        for ax, (col, _) in zip(axes, cols):
            ax.plot(g["step"], g[col], color=c, lw=0.8, alpha=_alpha(g), ls="-" if g["arm"].iloc[0] == "mhsa" else "--",
                    label=rid)
    axes[2].axhline(chance_first_mass(T), color=style.REF_COLOR, lw=0.6, ls=":")
    axes[2].axhline(GU_EPS, color=style.REF_COLOR, lw=0.6, ls="--")
    for ax, (_, lab) in zip(axes, cols):
        ax.set_xlabel(style.STEP)
        ax.set_title(lab, fontsize="x-small")
        ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize="xx-small")
    end = data.sort_values("step").groupby("run").last()
    cap = (f"Gu et al.'s sink metric: the share of all heads whose mean attention on the first position exceeds ε "
           f"(ε = {GU_EPS}, theirs; ε = {OURS_FACTOR:g} × chance = {OURS_FACTOR * chance_first_mass(T):.3f} at T = {T}, "
           "ours), and the largest per-head first-position mass (dotted: chance; dashed: ε = 0.3). Solid MHSA, "
           "dashed QK-norm. Last probed step: " + "; ".join(
               f"{rid}: {end.loc[rid, 'sink_gu']:.2f} / {end.loc[rid, 'sink_ours']:.2f}, max mass "
               f"{end.loc[rid, 'max_first_mass']:.3f}" for rid in end.index) + ".")
    return fig, data, cap


# -- atlas_drivers -------------------------------------------------------------------------------
DRIVERS = (("atlas_first_mass", "atlas_first_adv", "first-position mass", "first column's advantage"),
           ("atlas_induction", "atlas_copy_adv", "induction score", "copy key's advantage"),
           ("atlas_first_value_share", "atlas_first_ds_share", "first token's share of ‖∂L/∂V‖",
            "first column's share of ‖∂L/∂S‖"))


@figure("atlas_drivers", "The gradient terms beside the attention they drive (per head, one run)", KIND,
        needs=NEEDS, group="atlas", pick=_atlas_runs, check=_check)
def atlas_drivers(runs, **opts):
    r = runs[0]
    bases = [b for row in DRIVERS for b in row[:2]]
    data = _long(r, bases)
    need(len(data), f"run {r.id} has no probed step")
    fig = style.figure(style.DOUBLE, 5.6)
    axes = fig.subplots(len(DRIVERS), 2, sharex=True)
    heads = list(data.groupby(["layer", "head"]))
    for i, (fwd, bwd, fl, bl) in enumerate(DRIVERS):
        for k, ((l, h), g) in enumerate(heads):
            c = style.CYCLE[k % len(style.CYCLE)]
            for ax, col in ((axes[i, 0], fwd), (axes[i, 1], bwd)):      # each on its own schedule
                d = g[["step", col]].dropna()
                ax.plot(d["step"], d[col], color=c, lw=0.8, label=f"L{l}H{h}" if ax is axes[i, 0] else None)
        axes[i, 0].set_ylabel(fl, fontsize="x-small")
        axes[i, 1].set_ylabel(bl, fontsize="x-small")
        if i < 2:
            axes[i, 1].axhline(0, color=style.REF_COLOR, lw=0.6, ls=":")
            axes[i, 1].set_yscale("symlog", linthresh=1e-5)
    for ax in axes[-1]:
        ax.set_xlabel(style.STEP)
    axes[0, 0].legend(fontsize="xx-small", ncol=2)
    cap = (f"Run {r.id} ({_label(r)}), one line per head. Left: attention on the first position, on the copy key "
           "(induction), and the first token's share of the value gradient ‖∂L/∂V‖ (the value update is −η ∂L/∂V). "
           "Right: the driving gradient terms, the mean advantage A = E_α[b] − b of the first column and of the copy "
           "key (positive: gradient descent raises that score; symlog axis, dotted zero) and the first column's "
           "share of ‖∂L/∂S‖. Events (first sustained crossings and their lags) are in the study's summary.json.")
    return fig, data, cap


# -- atlas_logits ---------------------------------------------------------------------------------
@figure("atlas_logits", "Max-logit growth and entropy collapse per head (MHSA vs QK-norm)", KIND,
        needs=NEEDS + " and the cheap tier (logit_max, attn_entropy per head)", group="atlas", pick=_atlas_runs,
        check=_check)
def atlas_logits(runs, **opts):
    rows = []
    for r in runs:
        df = r.metrics.sort_values("step")
        lm = df[list(mn.per_head(df.columns, mn.LOGIT_MAX).values())]
        ent = df[list(mn.per_head(df.columns, mn.ATTN_ENTROPY).values())]
        need(lm.shape[1] and ent.shape[1], f"run {r.id} logs no per-head logit_max / attn_entropy")
        rows.append(pd.DataFrame({"run": r.id, "arm": attention(r), "seed": seed(r), "step": df["step"],
                                  "max_logit": lm.max(axis=1), "min_entropy": ent.min(axis=1),
                                  "mean_entropy": ent.mean(axis=1)}).dropna())
    data = pd.concat(rows, ignore_index=True)
    fig = style.figure(style.DOUBLE, 2.3)
    axes = fig.subplots(1, 3)
    cols = (("max_logit", "largest |q·k|/√d_h over heads"), ("min_entropy", "lowest head entropy [nats]"),
            ("mean_entropy", "mean head entropy [nats]"))
    for rid, g in data.groupby("run", sort=False):
        c = style.attn_color(g["arm"].iloc[0], int(g["seed"].iloc[0]))
        for ax, (col, _) in zip(axes, cols):
            ax.plot(g["step"], g[col], color=c, lw=0.8, alpha=_alpha(g), ls="-" if g["arm"].iloc[0] == "mhsa" else "--",
                    label=rid)
    for ax, (_, lab) in zip(axes, cols):
        ax.set_xlabel(style.STEP)
        ax.set_title(lab, fontsize="x-small")
    axes[0].legend(fontsize="xx-small")
    s = data.sort_values("step").groupby("run")
    first, peak, last = s.first(), s.max(), s.last()
    cap = ("Per step on the training batch (the cheap tier): the largest pre-softmax logit over all heads "
           "(Wortsman et al., Dehghani et al.), and the lowest and mean per-head attention entropy (Zhai et al.'s "
           "entropy collapse). Solid MHSA, dashed QK-norm. Max logit first → peak → last: " + "; ".join(
               f"{rid}: {first.loc[rid, 'max_logit']:.2f} → {peak.loc[rid, 'max_logit']:.2f} → "
               f"{last.loc[rid, 'max_logit']:.2f}" for rid in first.index) + ".")
    return fig, data, cap
