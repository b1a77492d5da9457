"""Span-recon figures from WikiText training runs (arXiv 2512.13033, reconstruction):

* ``span_val_loss`` — (a) validation loss per step, baseline and each span setting, mean ± std
  over seeds; (b) the relative change of the final validation loss against the baseline of the same
  seed, (L_span − L_base) / L_base in %, per setting, mean ± std over seeds with the seeds as dots.

A *setting* is a span run's non-default ``span`` keys plus any other config key that differs
between the runs (e.g. the head dimension of a d_h ablation); a baseline is a non-span run (or one
tagged ``baseline``) with the same non-span keys and seed.

Split as data (:func:`_val_loss_data`) → drawing (:func:`_val_loss_draw`) → caption
(:func:`_val_loss_caption`).
"""
from __future__ import annotations

from dataclasses import fields

import numpy as np
import pandas as pd

from . import style
from ..span_config import SpanConfig        # not ..span: that pulls in torch
from ..stats import mean_std
from .common import metric, need
from .registry import figure
from .train_common import KIND, attention, best_group, final_val, mean_curve, seed

_IGNORE = {"seed", "device", "data.path", "train.stop_at", "train.threads", "record", "train.compile"}
_SHORT = {"alpha_q": "α_q", "beta_q": "β_q", "alpha_k": "α_k", "beta_k": "β_k", "alpha0": "α0",
          "alpha0_col": "α0_col", "apply_q": "q", "apply_k": "k"}


def _is_baseline(r) -> bool:
    return attention(r) != "span" or "baseline" in ((r.meta or {}).get("tags") or [])


def _span_runs(runs):
    grp = best_group(runs, lambda rs: (any(attention(r) == "span" and not _is_baseline(r) for r in rs)
                                       and any(_is_baseline(r) for r in rs),
                                       sum(attention(r) == "span" for r in rs)))
    return grp


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out


def _span_defaults() -> dict:
    return {f.name: getattr(SpanConfig(), f.name) for f in fields(SpanConfig)}


def _settings(runs) -> tuple[dict, dict]:
    """run id -> (setting label, context key) and the context keys that differ between runs."""
    flats = {r.id: _flat(r.config) for r in runs}
    keys = set().union(*flats.values()) if flats else set()
    differ = sorted(k for k in keys
                    if not k.startswith("span.") and not k.startswith("model.attention")
                    and not any(k == i or k.startswith(i + ".") for i in _IGNORE)
                    and len({flats[i].get(k) for i in flats}) > 1)
    dflt = _span_defaults()
    out = {}
    for r in runs:
        f = flats[r.id]
        ctx = tuple((k, f.get(k)) for k in differ)
        ctx_lab = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in ctx)
        if _is_baseline(r):
            out[r.id] = ("baseline", ctx, ctx_lab)
            continue
        sp = (r.config or {}).get("span", {}) or {}
        parts = [str(sp.get("candidate", "span"))]
        parts += [f"{_SHORT.get(k, k)}={v:g}" if isinstance(v, float) else f"{_SHORT.get(k, k)}={v}"
                  for k, v in sp.items() if k not in ("candidate", "impl", "eps") and dflt.get(k, object()) != v]
        lab = " ".join(parts) + (f" [{ctx_lab}]" if ctx_lab else "")
        out[r.id] = (lab, ctx, ctx_lab)
    return out, differ


def _check(runs):
    need(any(attention(r) == "span" and not _is_baseline(r) for r in runs),
         "needs train runs with model.attention = span")
    need(any(_is_baseline(r) for r in runs), "needs baseline runs (model.attention = mhsa) next to the span runs")
    return True, ""


@figure("span_val_loss", "Span-recon: relative validation-loss change per setting", KIND,
        needs="span train runs (model.attention = span) and baseline runs (mhsa) with matching seeds, "
              "each with a final validation loss (meta.final.valid_loss or a val_loss metric)",
        group="span", pick=_span_runs, check=_check)
def span_val_loss(runs, **opts):
    data, curves = _val_loss_data(runs)
    return _val_loss_draw(data, curves), data, _val_loss_caption(data, any(curves.values()))


def _val_loss_data(runs) -> tuple[pd.DataFrame, dict]:
    """-> (one row per run: setting, final validation loss as the run recorded it, its seed's
    baseline and the relative change; per setting, baseline first, its runs' val_loss curves)."""
    sets, _ = _settings(runs)
    base = {}
    for r in runs:
        lab, ctx, _ = sets[r.id]
        if lab == "baseline":
            base.setdefault((ctx, seed(r)), final_val(r)[0])
    rows = []
    for r in runs:
        lab, ctx, ctx_lab = sets[r.id]
        vl = final_val(r)[0]
        b = base.get((ctx, seed(r)))
        rel = 100.0 * (vl - b) / b if (lab != "baseline" and b is not None and np.isfinite(b)) else np.nan
        rows.append({"setting": lab, "context": ctx_lab, "seed": seed(r), "run": r.id, "val_loss": vl,
                     "baseline_val_loss": b if b is not None else np.nan, "rel_change_pct": rel})
    df = pd.DataFrame(rows).sort_values(["setting", "seed"], kind="stable").reset_index(drop=True)
    rel, order, _ = _rel_stats(df)
    need(len(rel), "no span run has a baseline run with the same seed and a finite final validation loss")
    curves = {}
    for lab in ["baseline"] + order:
        ids = set(df.loc[df["setting"] == lab, "run"])
        curves[lab] = [c for c in (metric(r, "val_loss") for r in runs if r.id in ids) if len(c[0])]
    return df, curves


def _rel_stats(df: pd.DataFrame) -> tuple[pd.DataFrame, list, pd.DataFrame]:
    """The span rows with a relative change, their settings in order, and per setting its mean,
    sample std (ddof = 1, dyntool.stats.mean_std, as the span study's summary.json; 0 for one
    seed) and number of seeds."""
    rel = df[(df["setting"] != "baseline") & df["rel_change_pct"].notna()]
    g = rel.groupby("setting", sort=False)["rel_change_pct"]
    stats = pd.DataFrame({"mean": g.mean(), "std": g.agg(lambda s: mean_std(s)[1]), "n": g.count()})
    return rel, list(dict.fromkeys(rel["setting"])), stats


def _val_loss_draw(df: pd.DataFrame, curves: dict):
    fig = style.figure(style.DOUBLE, 2.5)
    ax, bx = fig.subplots(1, 2, width_ratios=[1, 1.2])
    for k, (lab, cs) in enumerate(curves.items()):
        if not cs:
            continue
        s, mu, sd = mean_curve(cs)
        col = style.OKABE_ITO["black"] if lab == "baseline" else style.CYCLE[k % len(style.CYCLE)]
        style.band(ax, s, mu, sd, col, label=f"{lab} (n = {len(cs)})")
    ax.set_xlabel(f"{style.STEP} [steps]")
    ax.set_ylabel("validation loss [nats]")
    if any(curves.values()):
        ax.legend(loc="upper right", fontsize=6)
    else:                       # only final evaluations: panel (b) holds them
        ax.text(0.5, 0.5, "no validation curve recorded\n(train.eval_every = 0)", transform=ax.transAxes,
                ha="center", va="center", fontsize=7, color=style.REF_COLOR)
        ax.set_xticks([])
        ax.set_yticks([])
    style.panel_label(ax, "a")
    _rel_panel(bx, *_rel_stats(df))
    return fig


def _rel_panel(bx, rel: pd.DataFrame, order: list, stats: pd.DataFrame) -> None:
    """(b) the relative change per setting, mean ± std bars with the seeds as dots."""
    y = np.arange(len(order))
    cols = [style.CYCLE[(k + 1) % len(style.CYCLE)] for k in range(len(order))]
    bx.barh(y, stats.loc[order, "mean"], xerr=stats.loc[order, "std"], color=cols, capsize=2,
            height=0.6)
    for k, lab in enumerate(order):
        pts = rel.loc[rel["setting"] == lab, "rel_change_pct"].to_numpy()
        bx.plot(pts, np.full(len(pts), k) + np.linspace(-0.12, 0.12, len(pts)), "o", color="black", ms=2)
    bx.axvline(0, color="black", lw=0.6)
    bx.set_yticks(y, order, fontsize=6)
    bx.invert_yaxis()
    bx.set_xlabel("Δ final validation loss vs baseline [%]")
    bx.ticklabel_format(axis="x", useOffset=False)
    style.panel_label(bx, "b")


def _val_loss_caption(df: pd.DataFrame, has_curves: bool = True) -> str:
    stats = _rel_stats(df)[2]
    best = stats["mean"].idxmin()
    a = ("Validation loss per step, mean ± std over seeds." if has_curves else
         "Empty: the runs evaluated only at the end (train.eval_every = 0).")
    return (f"Span-recon (a reconstruction of the span-variant backward) on WikiText-2. (a) {a} "
            "(b) Relative change of the final validation loss against the baseline run of the same seed, "
            "(L_span − L_base)/L_base in %, mean ± sample std over seeds; "
            f"dots are seeds; negative is better. Best: {best} "
            f"{stats.loc[best, 'mean']:+.3g} ± {stats.loc[best, 'std']:.2g} % (n = {int(stats.loc[best, 'n'])}).")
