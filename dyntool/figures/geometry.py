"""Sticky-chain study figures, structure (arXiv 2512.22473: figures F5–F6; diagnostics D5–D7):

* ``f5_attention`` — α on the recorded crop at the end, per arm, raw and sorted by the previous
  symbol (content routing shows as blocks), plus mean attention entropy per step;
* ``f6_value_pca`` — PCA of the values of the training sequence at the final step (one basis per
  run), coloured by the Bayes posterior-predictive entropy of each position, with r(PC1, entropy) ≥ 0
  by orientation, beside r(PC1, entropy) on held-out positions (:mod:`.manifold_panel`).

F7 (frame and precision over training) is :mod:`dyntool.figures.frame_precision`.
"""
from __future__ import annotations

import numpy as np

from ..manifold import pca
from ..stats import pearson
from . import manifold_panel as mp
from . import style
from .common import (align, arms_of, array, diag, first_head, main_study, mean_std, need, normalise_rows,
                     offsets, seed_arm)
from .registry import figure

KIND = "sticky-markov"


def _representatives(runs, has=None) -> dict[str, object]:
    """arm -> the run of the smallest seed present in every arm (else each arm's first), among the
    runs for which ``has(run)`` holds (a study records arrays for a few seeds and arms only)."""
    arms = arms_of([r for r in runs if has is None or has(r)])
    common = set.intersection(*[{seed_arm(r)[0] for r in rs} for rs in arms.values()]) if arms else set()
    out = {}
    for arm, rs in arms.items():
        pick = [r for r in rs if seed_arm(r)[0] == min(common)] if common else rs
        out[arm] = pick[0]
    return out


def _check_arrays(*names, static=None):
    def check(runs):
        ok = [r for r in runs if all(array(r, n) is not None for n in names)
              and (static is None or r.static(static) is not None)]
        what = ", ".join(names) + (f" and static {static}" if static else "")
        need(ok, f"no run of the study recorded {what}")
        return True, ""
    return check


def _check_f5(runs):
    ok = [r for r in runs if array(r, "attn") is not None or array(r, "attn_pooled") is not None]
    need(ok, "no run of the study recorded attn (crop) or attn_pooled")
    return True, ""


def _entropy_curve(run) -> tuple[np.ndarray, np.ndarray]:
    s, v = diag(run, "diag_attn_entropy")
    if len(s):
        return s, v
    a = array(run, "attn_entropy")
    if a is not None:
        return run.steps[: len(a)], np.nanmean(np.asarray(a[:, 0, 0, 0], dtype=np.float64), axis=-1)
    return s, v


# ------------------------------------------------------------------------------------------------
# F5
# ------------------------------------------------------------------------------------------------

@figure("f5_attention", "Attention structure on the sticky chain", KIND,
        needs="a sticky-markov study recording attn on a crop (or attn_pooled); static prev_symbol for "
              "the sorted view; diag_attn_entropy or attn_entropy for the entropy curve",
        group="dynamics", pick=main_study, check=_check_f5)
def f5_attention(runs, **opts):
    data, arrays = _f5_data(runs)
    return _f5_draw(data, arrays), data, _f5_caption(data)


def _f5_data(runs) -> tuple[dict, dict]:
    """-> (data written beside the figure, what only the drawing needs: per arm α / uniform as
    log₂, the previous symbols and their sort orders, and per entropy curve its colour index and
    number of seeds); all read from the recorded runs."""
    reps = _representatives(runs, has=lambda r: array(r, "attn") is not None or array(r, "attn_pooled") is not None)
    data = {"arms": {}, "entropy": {}}
    mats = {}
    for arm, r in reps.items():
        data["arms"][arm], mats[arm] = _f5_arm(r)
    for arm, info in data["arms"].items():
        mats[arm]["rel"] = _log2_ratio_to_uniform(mats[arm].pop("m"), info)
    curves = {}                                              # arm -> (colour index, seeds)
    for k, (arm, rs) in enumerate(arms_of(runs).items()):
        cs = [c for c in (_entropy_curve(r) for r in rs) if len(c[0])]
        if cs:
            steps, mat = align(cs)
            mu, sd = mean_std(mat)
            data["entropy"][arm] = {"step": steps.tolist(), "mean": mu.tolist(), "std": sd.tolist()}
            curves[arm] = (k, len(cs))
    T = _n_positions(reps) if data["entropy"] else None
    if T:
        data["uniform_entropy"] = float(np.mean(np.log(np.arange(1, T + 1))))
    return data, {"mats": mats, "curves": curves}


def _f5_arm(r) -> tuple[dict, dict]:
    """One arm's representative run: its last recorded α and, where the window and prev_symbol
    allow, the same-symbol attention mass against chance."""
    a = array(r, "attn")
    pooled = a is None
    if pooled:
        a = array(r, "attn_pooled")
    q0, k0 = offsets(a)
    m = first_head(a, -1)
    block = int(a.attrs.get("block", 1)) if pooled else 1
    prev = r.static("prev_symbol")
    mat = {"m": m, "pq": None, "pk": None, "order_q": None, "order_k": None}
    same = chance = None
    if prev is not None and not pooled and len(prev) >= q0 + m.shape[0] and len(prev) >= k0 + m.shape[1]:
        pq, pk = np.asarray(prev[q0:q0 + m.shape[0]]), np.asarray(prev[k0:k0 + m.shape[1]])
        rn = normalise_rows(m)
        eq = pq[:, None] == pk[None, :]
        live = rn.sum(1) > 0
        same = float(np.mean((rn * eq).sum(1)[live]))
        vis = m > 0
        chance = float(np.mean(((vis & eq).sum(1) / np.maximum(vis.sum(1), 1))[live]))
        mat.update(pq=pq, pk=pk, order_q=np.argsort(pq, kind="stable"), order_k=np.argsort(pk, kind="stable"))
    info = {"run": r.id, "seed": seed_arm(r)[0], "step": int(r.steps[len(a) - 1]),
            "pooled_block": block if pooled else None, "query_offset": q0, "key_offset": k0,
            "same_symbol_mass": same, "same_symbol_chance": chance if same is not None else None,
            "attn": m.tolist() if m.size <= 40_000 else None}
    return info, mat


def _log2_ratio_to_uniform(m: np.ndarray, info: dict) -> np.ndarray:
    """α relative to uniform attention over the visible keys: log₂ α_ij·(i+1) (causal), 0 = chance;
    records its 1st–99th percentile in ``info``.  A log colour scale centred on chance shows both the
    keys a query prefers and those it avoids, where raw α (≈ 1/i, tiny at T = 2000) shows only noise."""
    blk = info["pooled_block"] or 1
    qpos = info["query_offset"] + (np.arange(m.shape[0]) + 0.5) * blk
    kpos = info["key_offset"] + (np.arange(m.shape[1]) + 0.5) * blk
    vis = kpos[None, :] <= qpos[:, None] + (0.5 * blk if blk > 1 else 0)
    rel = np.log2(np.where(vis & (m > 0), m * (qpos[:, None] + 0.5), np.nan))
    info["log2_ratio_to_uniform_p1_p99"] = [float(np.nanpercentile(rel, 1)), float(np.nanpercentile(rel, 99))]
    return rel


def _f5_draw(data: dict, arrays: dict):
    mats = arrays["mats"]
    arms = list(data["arms"])
    n = len(arms)
    fig = style.figure(style.DOUBLE, 3.9)
    gs = fig.add_gridspec(2, n + 1, width_ratios=[1] * n + [1.25])
    lim = max(max(abs(v) for v in d["log2_ratio_to_uniform_p1_p99"]) for d in data["arms"].values()) or 1.0
    for c, arm in enumerate(arms):
        im = _f5_matrix(fig.add_subplot(gs[0, c]), arm, data["arms"][arm], mats[arm]["rel"], lim, c == 0)
        _f5_sorted(fig.add_subplot(gs[1, c]), data["arms"][arm], mats[arm], lim, c == 0)
    cb = fig.colorbar(im, ax=fig.axes[: 2 * n: 2], label="log₂(α / uniform)   (0 = chance)", shrink=0.8)
    cb.ax.axhline(0, color="black", lw=0.8)
    _f5_entropy_panel(fig.add_subplot(gs[:, n]), data, arrays["curves"])
    return fig


def _f5_matrix(ax, arm: str, info: dict, rel: np.ndarray, lim: float, first: bool):
    """(a) α / uniform on the recorded window, in positions."""
    blk = info["pooled_block"] or 1
    ext = (info["key_offset"] - 0.5, info["key_offset"] + rel.shape[1] * blk - 0.5,
           info["query_offset"] + rel.shape[0] * blk - 0.5, info["query_offset"] - 0.5)
    im = ax.imshow(rel, cmap=style_cmap(), vmin=-lim, vmax=lim, extent=ext, interpolation="nearest")
    ax.set_title(style.arm_label(arm, short=True) + (" (pooled)" if info["pooled_block"] else ""))
    ax.set_xlabel("key position j")
    if first:
        ax.set_ylabel("query position i")
        style.panel_label(ax, "a")
    return im


def _f5_sorted(bx, info: dict, mat: dict, lim: float, first: bool) -> None:
    """(b) the same rows and columns sorted by the previous symbol."""
    oq, ok, pq, pk = mat["order_q"], mat["order_k"], mat["pq"], mat["pk"]
    if oq is not None:
        bx.imshow(mat["rel"][np.ix_(oq, ok)], cmap=style_cmap(), vmin=-lim, vmax=lim, interpolation="nearest",
                  aspect="auto")
        for edges, line in ((np.nonzero(np.diff(pk[ok]))[0], bx.axvline),
                            (np.nonzero(np.diff(pq[oq]))[0], bx.axhline)):
            for e in edges:
                line(e + 0.5, color="black", lw=0.3, alpha=0.6)
        sk, sq = pk[ok], pq[oq]
        syms = np.unique(sk)
        bx.set_xticks([np.mean(np.nonzero(sk == v)[0]) for v in syms], [str(v) for v in syms], fontsize=5.5)
        symq = np.unique(sq)
        bx.set_yticks([np.mean(np.nonzero(sq == v)[0]) for v in symq], [str(v) for v in symq], fontsize=5.5)
        bx.tick_params(length=0)
        chance = info.get("same_symbol_chance")
        bx.set_xlabel(f"key symbol y_(j−1)\nsame-symbol mass {info['same_symbol_mass']:.2f}"
                      + (f" (chance {chance:.2f})" if chance is not None else ""), fontsize=6)
        if first:
            bx.set_ylabel("query symbol y_(i−1)")
    else:
        bx.text(0.5, 0.5, "no prev_symbol / window\nfor a sorted view", ha="center", va="center",
                transform=bx.transAxes, fontsize=7)
        bx.set_axis_off()
    if first:
        style.panel_label(bx, "b")


def _f5_entropy_panel(ex, data: dict, curves: dict) -> None:
    """(c) mean attention entropy per step, mean ± std over seeds, and uniform attention's."""
    for arm, e in data["entropy"].items():
        k, n = curves[arm]
        style.band(ex, np.asarray(e["step"]), np.asarray(e["mean"]), np.asarray(e["std"]),
                   style.arm_color(arm, k), label=f"{style.arm_label(arm)} (n = {n})")
    if data["entropy"]:
        if "uniform_entropy" in data:
            uni = data["uniform_entropy"]
            ex.axhline(uni, color=style.REF_COLOR, ls=":", lw=0.8)
            ex.annotate("uniform α (chance)", (0.02, uni), xycoords=("axes fraction", "data"), fontsize=6,
                        va="bottom", color=style.REF_COLOR)
        ex.set_xlabel(f"{style.STEP} [steps]")
        ex.set_ylabel("mean attention entropy [nats]")
        ex.legend(loc="best")
    else:
        ex.text(0.5, 0.5, "attention entropy\nnot recorded", ha="center", va="center", transform=ex.transAxes)
        ex.set_axis_off()
    style.panel_label(ex, "c")


def _f5_caption(data: dict) -> str:
    arms = list(data["arms"])
    sm = "; ".join(f"{style.arm_label(a)} {d['same_symbol_mass']:.2f}" for a, d in data["arms"].items()
                   if d["same_symbol_mass"] is not None)
    ch = next((d.get("same_symbol_chance") for d in data["arms"].values() if d.get("same_symbol_chance")), None)
    rng = "; ".join(f"{style.arm_label(a)} {2 ** d['log2_ratio_to_uniform_p1_p99'][0]:.2f}–"
                    f"{2 ** d['log2_ratio_to_uniform_p1_p99'][1]:.2f}× uniform" for a, d in data["arms"].items())
    ent = "; ".join(f"{style.arm_label(a)} {e['mean'][0]:.3f} → {e['mean'][-1]:.3f}" for a, e in data["entropy"].items())
    return ("(a) Attention weights on the recorded crop at the last recorded step "
            f"({data['arms'][arms[0]]['step']}), per arm (seed {data['arms'][arms[0]]['seed']}), shown as "
            "log₂ of α_ij over the uniform weight 1/(i+1) of a causal row (0 = chance; blank: masked). "
            f"1st–99th percentile of α/uniform: {rng}. (b) The same rows and columns sorted by the previous "
            "symbol each input encodes (tick labels); content routing would show as brighter diagonal "
            "blocks" + (f"; fraction of each row's crop mass on same-symbol keys: {sm}" if sm else "") +
            (f", against {ch:.2f} under uniform attention" if ch else "") +
            ". (c) Mean attention entropy per step, mean ± std over seeds (dotted: uniform attention): " +
            ent + " nats." + _sharpening(data["entropy"]))


def _sharpening(ent: dict) -> str:
    """Caption sentence from the data: does each arm's attention end sharper than SGD's?  'Sharper'
    only if its final mean entropy is below SGD's by more than the larger of the two seed stds."""
    if "sgd" not in ent:
        return ""
    s = ent["sgd"]
    out = []
    for a, e in ent.items():
        if a == "sgd":
            continue
        d = e["mean"][-1] - s["mean"][-1]
        tol = max(e["std"][-1], s["std"][-1])
        tol = tol if np.isfinite(tol) else 0.0
        verdict = "sharper than SGD" if d < -tol else "not sharper than SGD (within the seed std)" if d <= tol \
            else "less sharp than SGD"
        out.append(f"{style.arm_label(a)} {verdict} (final entropy {d:+.3f} nats vs SGD, std {tol:.3f})")
    return " At the last step: " + "; ".join(out) + "." if out else ""


def style_cmap():
    return style.DIV_CMAP


def _n_positions(reps) -> int | None:
    for r in reps.values():
        a = array(r, "attn") if array(r, "attn") is not None else array(r, "attn_pooled")
        if a is not None and a.attrs.get("T"):
            return int(a.attrs["T"])
    return None


# ------------------------------------------------------------------------------------------------
# F6
# ------------------------------------------------------------------------------------------------

def pca_oriented(x: np.ndarray, h: np.ndarray, n: int = 5):
    """PCA of x (positions × dims) -> (scores, explained ratios, |r| per PC), each PC's sign chosen
    so that r(PC_k, h) ≥ 0 (:func:`dyntool.manifold.pca`)."""
    p = pca(x, n=n, orient_by=h)
    k = p.scores.shape[1]
    r = np.array([pearson(p.scores[:, i], h) for i in range(k)])
    return p.scores, p.explained_ratio[:k], np.abs(r)


def _values_entropy(run, idx=-1):
    """(values (positions × d_v) at step index idx, Bayes entropy per position) or a reason."""
    v = array(run, "values")
    h = run.static("bayes_entropy")
    if v is None or h is None:
        return None, "values or bayes_entropy missing"
    x = first_head(v, idx)
    k0 = int(v.attrs.get("key_offset", 0))
    h = np.asarray(h, dtype=np.float64).ravel()[k0:k0 + x.shape[0]]
    if len(h) != x.shape[0]:
        return None, f"values ({x.shape[0]} positions) and bayes_entropy ({len(h)}) don't align"
    ok = np.isfinite(x).all(1) & np.isfinite(h)
    return (x[ok], h[ok]), ""


@figure("f6_value_pca", "Value geometry on the training sequence; manifold metrics on held-out positions", KIND,
        needs="a sticky-markov study recording values (all positions) and static bayes_entropy; the held-out "
              "panel uses the logged heldout_v_* / heldout_g_* metrics where present",
        group="dynamics", pick=main_study, check=_check_arrays("values", static="bayes_entropy"))
def f6_value_pca(runs, **opts):
    data, arrays = _f6_data(runs)
    return _f6_draw(data, arrays), data, _f6_caption(data)


def _f6_data(runs) -> tuple[dict, dict]:
    """-> (data written beside the figure: per run the PCA numbers of the training-sequence values
    and the held-out metrics the simulation logged, and the shown runs' points; what only the
    drawing needs: the shown runs' unrounded scores and the arms' colour order)."""
    per_run, shown = [], {}
    reps = _representatives(runs, has=lambda r: array(r, "values") is not None)
    for arm, rs in arms_of(runs).items():
        for r in rs:
            got, why = _values_entropy(r)
            if got is None:
                continue
            x, h = got
            z, evr, rr = pca_oriented(x, h)
            per_run.append({"run": r.id, "arm": arm, "seed": seed_arm(r)[0], "step": int(r.steps[-1]),
                            "explained_variance_ratio": evr.tolist(), "r_pc_entropy": rr.tolist(),
                            "pc1_share": float(evr[0]), "r_pc1_entropy": float(rr[0]), "n_positions": int(len(h)),
                            **mp.heldout_row(r)})
            if reps.get(arm) is r:
                shown[arm] = {"run": r.id, "seed": seed_arm(r)[0], "step": int(r.steps[-1]),
                              "z": z, "h": h, "evr": evr, "rr": rr}
    need(shown, "values and bayes_entropy of the study's runs don't align")
    data = {"runs": per_run,
            "heldout_steps": sorted({p["heldout_step"] for p in per_run if p.get("heldout_step") is not None}),
            "points": {arm: {"run": v["run"], "sequence": "training",
                             "pc1": v["z"][:, 0].round(6).tolist(),
                             "pc2": (v["z"][:, 1] if v["z"].shape[1] > 1 else v["z"][:, 0] * 0).round(6).tolist(),
                             "bayes_entropy": v["h"].round(6).tolist()} for arm, v in shown.items()}}
    return data, {"shown": shown, "order": list(arms_of(runs))}


def _f6_draw(data: dict, arrays: dict):
    shown = arrays["shown"]
    arms = list(shown)
    fig = style.figure(style.DOUBLE, 2.7)
    n = len(arms)
    gs = fig.add_gridspec(1, n + 3, width_ratios=[1] * n + [0.05, 0.1, 1.15])   # colorbar, spacer, (c)
    axs = [fig.add_subplot(gs[0, k]) for k in range(n)] + [fig.add_subplot(gs[0, n + 2])]
    hs = np.concatenate([v["h"] for v in shown.values()])
    lo, hi = float(np.percentile(hs, 1)), float(np.percentile(hs, 99))
    for k, arm in enumerate(arms):
        v = shown[arm]
        z, h, evr, rr = v["z"], v["h"], v["evr"], v["rr"]
        ax = axs[k]
        o = np.argsort(h)                                   # uncertain positions drawn last and larger
        size = 1.5 + 10 * np.clip((h[o] - lo) / ((hi - lo) or 1.0), 0, 1)
        sc = ax.scatter(z[o, 0], z[o, 1] if z.shape[1] > 1 else np.zeros(len(o)), c=h[o], s=size, cmap="cividis",
                        vmin=lo, vmax=hi, lw=0, rasterized=True)
        ax.set_title(f"{style.arm_label(arm)}, seed {v['seed']}, step {v['step']}\n"
                     f"training sequence: r(PC1, H) = {rr[0]:.2f}")
        ax.set_xlabel(f"PC1 ({evr[0]:.0%} of variance)")
        ax.set_ylabel(f"PC2 ({evr[1]:.0%})" if len(evr) > 1 else "")
        style.panel_label(ax, "abcdefg"[k])
        ax.set_title(ax.get_title(loc="left"), loc="left", fontsize=6.5)     # two lines side by side
    fig.colorbar(sc, cax=fig.add_subplot(gs[0, n]), label="Bayes predictive entropy [nats]")
    bx = axs[-1]
    mp.draw(bx, arrays["order"], data["runs"], arms)
    bx.set_title("training | held-out sequence")
    style.panel_label(bx, "abcdefg"[len(arms)])
    bx.set_title(bx.get_title(loc="left"), loc="left", fontsize=6.5)
    return fig


def _f6_caption(data: dict) -> str:
    per_run, arms, ho_steps = data["runs"], list(data["points"]), data["heldout_steps"]
    groups = mp.groups(per_run)
    ho_txt = (" and, from the simulation's log on the HELD-OUT sequence (another path of the same chain; "
              f"dyntool.manifold at step {', '.join(map(str, ho_steps))}), the same r for the values (heldout_v_r_pc1) "
              "and the head outputs (heldout_g_r_pc1)" if any(g.startswith("heldout") for g in groups)
              else "; this study logged no held-out manifold metrics")
    return ("Scatter panels: value vectors v_j of every position of the TRAINING sequence at the last recorded "
            "step, projected on their own PCA basis (one basis per run, fitted on that step), coloured by the "
            "exact Bayes posterior-predictive entropy of the position; each PC is oriented so that its "
            "correlation with the entropy is non-negative; point size also grows with the entropy. Last panel: "
            "r(PC1, entropy) per seed (dots) with mean ± std (black), for the training-sequence values of the "
            "scatter" + (", the training-sequence head outputs g_i (diag_r_pc1_entropy)"
                         if "train_g" in groups else "") + ho_txt +
            f". Means over seeds — {mp.caption_numbers(per_run, arms)}.")
