"""Wind-tunnel figures (arXiv 2512.22473 figure F8; the wind tunnel of arXiv 2512.22471) from a ``dyntool sim bijection`` run:

* ``f8_manifold`` — PCA (PC1 vs PC2) of the residual stream after every block at the L key
  positions of held-out sequences, coloured by the exact posterior entropy H_Bayes, at the first and
  the last recorded step; each panel states its PC1 share and r(PC1, H_Bayes);
* ``f8_wind_tunnel`` — per layer at the first and last recorded step: (a) key orthogonality (mean
  |cos| between the keys of distinct key tokens, with the isotropic random baseline), (b) mean
  attention entropy with the uniform level, and (c) the model's predictive entropy per target
  position against H_Bayes = log(V − k + 1);
* ``f8_dynamics`` — over training: held-out loss against the Bayes-optimal loss, and per layer the
  residual-stream PC1 share, r(PC1, H_Bayes), key orthogonality and attention entropy.

The figures read the first ``bijection`` run among the inputs.  Titles name what is plotted; the
captions carry the measured numbers.  Each is split as data (``_f8*_data``: what the run recorded,
plus what only the drawing needs) → drawing (``_f8*_draw``) → caption (``_f8*_caption``).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..manifold import random_abs_cos
from ..record import metric_names as mn
from ..sims.bijection_phase import LOOKUP_ACCURACY, phase
from . import style
from .common import array, metric, need
from .registry import figure

KIND = "bijection"
_W = 0.38                     # bar width of the wind tunnel's per-layer panels


def _first_run(runs):
    return runs[:1]


def _n_layer(run) -> int:
    return int(run.config.get("model", {}).get("n_layer", 0))


def _head_dim(run) -> int:
    m = run.config.get("model", {})
    return int(m.get("n_embd", 0)) // max(int(m.get("n_head", 1)), 1)


def _check_pcs(runs):
    r = runs[0]
    need(array(r, "bij_pcs_resid") is not None and r.static("point_entropy") is not None,
         "the bijection run recorded no PCA scores (bij_pcs_resid / static point_entropy; plot_seqs = 0?)")
    return True, ""


def _check_metrics(runs):
    r = runs[0]
    need(len(metric(r, mn.key_orth("ctx", 0))[0]) > 0, "the bijection run logged no per-layer analyses")
    need(array(r, "bij_model_entropy") is not None, "the bijection run recorded no bij_model_entropy")
    return True, ""


def _layer_series(run, name, n_layer: int):
    """{layer: (steps, values)} of the metric ``name(layer)``."""
    return {l: metric(run, name(l)) for l in range(n_layer)}


def _resid(stat: str):
    """The residual stream's manifold metric ``stat`` as a function of the layer."""
    return lambda l: mn.bijection_manifold("resid", l, stat)


def _at(run, name: str, step: int) -> float:
    s, v = metric(run, name)
    hit = np.nonzero(s == step)[0]
    return float(v[hit[0]]) if len(hit) else float("nan")


@figure("f8_manifold", "Wind tunnel: residual-stream PCA per layer, coloured by posterior entropy", KIND,
        needs="a bijection run with plot_seqs > 0 (records bij_pcs_resid)", group="dynamics",
        pick=_first_run, check=_check_pcs)
def f8_manifold(runs, **opts):
    data, extras = _f8m_data(runs)
    return _f8m_draw(extras), data, _f8m_caption(extras)


def _f8m_data(runs) -> tuple[pd.DataFrame, dict]:
    """-> (one row per step, layer and point: its PC scores and H_Bayes; what the drawing and the
    caption need: per drawn step (step, (layer, point, 2) scores), H_Bayes per point, the recorded
    (PC1 share, r(PC1, H_Bayes)) per (step, layer), and the run's sequence counts)."""
    run = runs[0]
    pcs = array(run, "bij_pcs_resid")
    steps = run.steps[: len(pcs)]
    h = np.asarray(run.static("point_entropy"), dtype=float)
    n_layer = pcs.shape[1]
    idx = [0, len(steps) - 1] if len(steps) > 1 else [0]
    panels, stats, rows = [], {}, []
    for si in idx:
        z = np.asarray(pcs[si], dtype=float)                     # (layer, point, 2)
        step = int(steps[si])
        panels.append((step, z))
        for l in range(n_layer):
            stats[(step, l)] = (_at(run, _resid("pc1_share")(l), step), _at(run, _resid("r_pc1")(l), step))
            for p in range(z.shape[1]):
                rows.append({"step": step, "layer": l, "point": p, "pc1": z[l, p, 0], "pc2": z[l, p, 1],
                             "h_bayes": h[p]})
    extras = {"panels": panels, "h": h, "n_layer": n_layer, "stats": stats,
              "L": run.config.get("L", 19), "analysis_seqs": run.config.get("analysis_seqs"),
              "acc_query_last": _at(run, mn.bijection_heldout("acc_query"), panels[-1][0])}
    return pd.DataFrame(rows), extras


def _f8m_draw(extras: dict):
    panels, h, n_layer = extras["panels"], extras["h"], extras["n_layer"]
    fig = style.figure(style.DOUBLE, 1.55 * len(panels) + 0.5)
    axes = np.atleast_2d(fig.subplots(len(panels), n_layer, squeeze=False))
    sc = None
    for r_i, (step, z) in enumerate(panels):
        for l in range(n_layer):
            ax = axes[r_i, l]
            share, r = extras["stats"][(step, l)]
            sc = ax.scatter(z[l, :, 0], z[l, :, 1], c=h, cmap=style.SEQ_CMAP, s=3, lw=0, alpha=0.8,
                            vmin=float(h.min()), vmax=float(h.max()), rasterized=True)
            ax.set_title(f"step {step}, block {l}\nPC1 {100 * share:.0f} %, r = {r:.2f}", fontsize=6.5)
            ax.set_xticks([])
            ax.set_yticks([])
            if r_i == len(panels) - 1:
                ax.set_xlabel("PC1", fontsize=6.5)
            if l == 0:
                ax.set_ylabel("PC2", fontsize=6.5)
    fig.colorbar(sc, ax=axes.ravel().tolist(), label="H_Bayes [nats]", shrink=0.8)
    return fig


def _f8m_caption(extras: dict) -> str:
    first, last = extras["panels"][0][0], extras["panels"][-1][0]
    lastL = extras["n_layer"] - 1
    s0, r0 = extras["stats"][(first, lastL)]
    s1, r1 = extras["stats"][(last, lastL)]
    n_pts = len(extras["h"])
    return (f"PCA of the residual stream after each block at the key positions (where the model "
            f"predicts π(x_k)) of {n_pts // max(extras['L'], 1)} held-out sequences "
            f"({n_pts} points; the PCA basis is fitted on {extras['analysis_seqs']} sequences), "
            f"coloured by the exact posterior entropy H_Bayes = log(V − k + 1). Signs are oriented so "
            f"r(PC1, H_Bayes) ≥ 0. Last block: PC1 share {100 * s0:.1f} % and r = {r0:.2f} at step "
            f"{first}; {100 * s1:.1f} % and r = {r1:.2f} at step {last}. "
            + _paper_clause(extras["acc_query_last"], last, "Paper I reports PC1 84–90 % for its 6×6×192 model "
                                                            "after 100k+ steps."))


def _paper_clause(acc_query, step: int, text: str) -> str:
    """Paper I's values only beside a step at its phase (the lookup learned, bijection_phase)."""
    if phase(acc_query) == "lookup learned":
        return f"{text} (Held-out query accuracy {acc_query:.2f} at step {step}: the lookup is learned, as in Paper I.)"
    acc = "unknown" if acc_query is None or acc_query != acc_query else f"{acc_query:.2f}"
    return (f"Paper I's values are not shown: they are for a model that has learned the lookup, and this run's "
            f"held-out query accuracy at step {step} is {acc} (below {LOOKUP_ACCURACY}).")


@figure("f8_wind_tunnel", "Wind tunnel: key orthogonality, attention entropy and predictive entropy per layer",
        KIND, needs="a bijection run (per-layer analyses in metrics.jsonl, bij_model_entropy)",
        group="dynamics", pick=_first_run, check=_check_metrics)
def f8_wind_tunnel(runs, **opts):
    data, extras = _f8w_data(runs)
    return _f8w_draw(data, extras), data, _f8w_caption(data, extras)


def _f8w_data(runs) -> tuple[dict, dict]:
    """-> (per layer at the first and last analysed step: key orthogonality, attention entropy;
    H_Bayes and the model's predictive entropy per target at the first and last recorded step;
    what only the drawing and caption need: those entropies unrounded, the recorded steps, the
    head dimension)."""
    run = runs[0]
    layers = np.arange(_n_layer(run))
    s_all, _ = metric(run, mn.key_orth("ctx", 0))
    first, last = int(s_all[0]), int(s_all[-1])
    per_layer = lambda name: {st: [_at(run, name(l), st) for l in layers] for st in (first, last)}  # noqa: E731
    ent = array(run, "bij_model_entropy")
    hb = run.static("bayes_entropy_target")
    if hb is None:            # runs written before the per-target name: stored per target there
        hb = run.static("bayes_entropy")
    hb = np.asarray(hb, dtype=float)
    e_first = np.asarray(ent[0], dtype=float)
    e_last = np.asarray(ent[len(ent) - 1], dtype=float)
    data = {"layers": layers.tolist(), "steps": [first, last],
            "key_orth_ctx": per_layer(lambda l: mn.key_orth("ctx", l)),
            "key_orth_vocab": per_layer(lambda l: mn.key_orth("vocab", l)),
            "random_abs_cos": random_abs_cos(_head_dim(run)),
            "attn_entropy": per_layer(lambda l: mn.layer(mn.ATTN_ENTROPY, l)),
            "attn_entropy_uniform": _at(run, mn.ATTN_ENTROPY_UNIFORM, last),
            "bayes_entropy": hb.tolist(), "model_entropy_first": e_first.tolist(),
            "model_entropy_last": e_last.tolist(),
            "entropy_mae_bits_last": float(np.abs(e_last - hb).mean() / math.log(2))}
    extras = {"layers": layers, "hb": hb, "e_first": e_first, "e_last": e_last,
              "rec_steps": run.steps[: len(ent)], "head_dim": _head_dim(run),
              "acc_query_last": _at(run, mn.bijection_heldout("acc_query"), last)}
    return data, extras


def _f8w_draw(data: dict, extras: dict):
    fig = style.figure(style.DOUBLE, 2.5)
    ax, bx, cx = fig.subplots(1, 3, width_ratios=[1, 1, 1.4])
    _f8w_bars(ax, data, extras["layers"], "key_orth_ctx")
    ax.plot(extras["layers"] - _W / 2, data["key_orth_vocab"][data["steps"][0]], "x", color="k", ms=4,
            label="vocabulary keys E W_K")
    ax.plot(extras["layers"] + _W / 2, data["key_orth_vocab"][data["steps"][1]], "x", color="k", ms=4)
    style.hline(ax, data["random_abs_cos"], f"random, d = {extras['head_dim']}", ls=":")
    ax.set_ylabel("mean |cos| between keys")
    ax.set_title("key orthogonality")
    style.panel_label(ax, "a")
    _f8w_bars(bx, data, extras["layers"], "attn_entropy")
    style.hline(bx, data["attn_entropy_uniform"], "uniform", ls=":")
    bx.set_ylabel(f"attention {style.ENTROPY}")
    bx.set_title("attention entropy")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = bx.get_legend_handles_labels()
    keep = {lab: hd for hd, lab in zip(h1 + h2, l1 + l2)}
    fig.legend(list(keep.values()), list(keep.keys()), loc="outside lower center", ncol=len(keep))
    style.panel_label(bx, "b")
    _f8w_predictive(cx, extras)
    return fig



def _f8w_bars(ax, data: dict, layers: np.ndarray, key: str) -> None:
    """Per-layer bars of ``data[key]`` at the first and the last analysed step."""
    first, last = data["steps"]
    ax.bar(layers - _W / 2, data[key][first], _W, color=style.CYCLE[0], label=f"step {first}")
    ax.bar(layers + _W / 2, data[key][last], _W, color=style.CYCLE[1], label=f"step {last}")
    ax.set_xticks(layers, [str(l) for l in layers])
    ax.set_xlabel("layer")


def _f8w_predictive(cx, extras: dict) -> None:
    """(c) the model's predictive entropy per target position against H_Bayes."""
    hb, rec_steps = extras["hb"], extras["rec_steps"]
    L = len(hb) - 1
    k = np.arange(1, L + 2)
    labels = [str(i) for i in range(1, L + 1)] + ["q"]
    cx.plot(k, hb, "k--", lw=1.0, label="H_Bayes = log(V − k + 1)")
    cx.plot(k, extras["e_first"], "o-", color=style.CYCLE[0], ms=2.5, lw=0.8, label=f"model, step {int(rec_steps[0])}")
    cx.plot(k, extras["e_last"], "o-", color=style.CYCLE[1], ms=2.5, lw=0.8, label=f"model, step {int(rec_steps[-1])}")
    ticks = sorted({1, *range(5, L + 1, 5), L, L + 1})
    cx.set_xticks(ticks, [labels[t - 1] for t in ticks])
    cx.set_xlabel("target position k (q = query)")
    cx.set_ylabel(f"predictive {style.ENTROPY}")
    cx.set_title("predictive entropy (held-out)")
    cx.legend(fontsize=5.5)
    style.panel_label(cx, "c")


def _f8w_caption(data: dict, extras: dict) -> str:
    first, last = data["steps"]
    ko, kov, ae = data["key_orth_ctx"], data["key_orth_vocab"], data["attn_entropy"]
    L = len(data["bayes_entropy"]) - 1
    red_l0 = 1 - ae[last][-1] / ae[last][0] if ae[last][0] > 0 else float("nan")
    red_init = [1 - a / b if b > 0 else float("nan") for a, b in zip(ae[last], ae[first])]
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)           # noqa: E731
    learned = phase(extras.get("acc_query_last")) == "lookup learned"
    return (f"(a) Mean |cos| between the keys of the {L} distinct key tokens of each held-out sequence "
            f"(per head, averaged over heads and sequences) per layer: [{fmt(ko[first])}] at step {first}, "
            f"[{fmt(ko[last])}] at step {last}; crosses: vocabulary keys E W_K^h (Paper I's definition), "
            f"[{fmt(kov[last])}] at step {last}; dotted: isotropic random keys E|cos| = {data['random_abs_cos']:.3f}. "
            + (f"Paper I: 0.09–0.12 trained vs 0.40–0.45 at init. " if learned else "") +
            f"(b) Mean attention entropy per layer (heads and query positions i ≥ 1): [{fmt(ae[first])}] → "
            f"[{fmt(ae[last])}] nats, uniform {data['attn_entropy_uniform']:.2f}; at step {last} the last layer is "
            f"{100 * red_l0:.0f} % below layer 0 (negative: above) and the layers are [{fmt([100 * x for x in red_init])}] % "
            f"below their step-{first} values" + (" (Paper I: 85–90 % reduction). " if learned else ". ") +
            f"(c) Model predictive entropy per target position vs H_Bayes; mean absolute error at step "
            f"{int(extras['rec_steps'][-1])}: {data['entropy_mae_bits_last']:.3f} bits. "
            + ("" if learned else _paper_clause(extras["acc_query_last"], last, "")))


def _f8d_panels():
    """(b–e): (metric name as a function of the layer, y label, draw the random-keys baseline)."""
    return ((_resid("pc1_share"), "residual PC1 share", False),
            (_resid("r_pc1"), "r(PC1, H_Bayes)", False),
            (lambda l: mn.key_orth("ctx", l), "key mean |cos|", True),
            (lambda l: mn.layer(mn.ATTN_ENTROPY, l), f"attention {style.ENTROPY}", False))


@figure("f8_dynamics", "Wind tunnel: held-out loss and per-layer geometry over training", KIND,
        needs="a bijection run (held-out evaluation and per-layer analyses in metrics.jsonl)",
        group="dynamics", pick=_first_run, check=_check_metrics)
def f8_dynamics(runs, **opts):
    data, extras = _f8d_data(runs)
    return _f8d_draw(extras), data, _f8d_caption(extras)


def _f8d_data(runs) -> tuple[dict, dict]:
    """-> (held-out loss, each per-layer metric of (b–e) and |H_model − H_Bayes| over steps, as
    logged; the same series as arrays with the training loss, the run's recorded Bayes-optimal
    loss, V, head dimension and held-out sequence count for the drawing and caption)."""
    run = runs[0]
    n_layer = _n_layer(run)
    s_loss, v_loss = metric(run, mn.bijection_heldout("loss"))
    data = {"step_heldout": s_loss.tolist(), "heldout_loss": v_loss.tolist()}
    series = []
    for name, _, _ in _f8d_panels():
        series.append(_layer_series(run, name, n_layer))
        for l, (s, v) in series[-1].items():
            data[name(l)] = {"step": s.tolist(), "value": v.tolist()}
    s_mae, v_mae = metric(run, mn.bijection_heldout("entropy_mae_bits"))
    data["entropy_mae_bits"] = {"step": s_mae.tolist(), "value": v_mae.tolist()}
    extras = {"train": metric(run, "loss"), "heldout": (s_loss, v_loss), "series": series, "mae": (s_mae, v_mae),
              "bayes": float(run.meta.get("bayes_loss", float("nan"))), "V": int(run.config.get("V", 20)),
              "head_dim": _head_dim(run), "n_layer": n_layer, "heldout_seqs": run.config.get("heldout_seqs")}
    return data, extras


def _f8d_draw(extras: dict):
    fig = style.figure(style.DOUBLE, 3.6)
    axes = fig.subplots(2, 3).ravel()
    _f8d_loss(axes[0], extras)
    n_layer = extras["n_layer"]
    cmap = __import__("matplotlib").colormaps["viridis"]
    for p_i, ((_, lab, random), per_layer) in enumerate(zip(_f8d_panels(), extras["series"])):
        bx = axes[p_i + 1]
        for l, (s, v) in per_layer.items():
            bx.plot(s, v, "o-", ms=2, lw=0.9, color=cmap(l / max(n_layer - 1, 1)), label=f"layer {l}")
        if random:
            style.hline(bx, random_abs_cos(extras["head_dim"]), "random", ls=":")
        bx.set_xlabel(f"{style.STEP} [steps]")
        bx.set_ylabel(lab)
        bx.ticklabel_format(axis="y", useOffset=False)
        style.panel_label(bx, "bcde"[p_i])
    axes[1].legend(fontsize=5.5)
    fx = axes[5]
    fx.plot(*extras["mae"], color=style.CYCLE[1], lw=1.2)
    fx.set_xlabel(f"{style.STEP} [steps]")
    fx.set_ylabel("|H_model − H_Bayes| [bits]")
    fx.ticklabel_format(axis="y", useOffset=False)
    style.panel_label(fx, "f")
    return fig


def _f8d_loss(ax, extras: dict) -> None:
    """(a) training-batch and held-out loss against the Bayes-optimal loss and log V."""
    bayes = extras["bayes"]
    ax.plot(*extras["train"], color=style.REF_COLOR, lw=0.5, alpha=0.6, label="training batch")
    ax.plot(*extras["heldout"], color=style.CYCLE[0], lw=1.2, label="held-out")
    style.hline(ax, bayes, f"Bayes-optimal {bayes:.3f}", color=style.H_MIN_COLOR)
    style.hline(ax, math.log(extras["V"]), "uniform", ls=":")
    ax.set_xlabel(f"{style.STEP} [steps]")
    ax.set_ylabel(style.LOSS)
    ax.legend(fontsize=5.5, loc="center right")
    style.panel_label(ax, "a")


def _f8d_caption(extras: dict) -> str:
    s_loss, v_loss = extras["heldout"]
    v_mae = extras["mae"][1]
    lastL = extras["n_layer"] - 1
    sh, rr = extras["series"][0][lastL][1], extras["series"][1][lastL][1]
    return (f"(a) Cross-entropy on the training batch and on {extras['heldout_seqs']} held-out "
            f"sequences, against the Bayes-optimal loss {extras['bayes']:.3f} nats (mean of H_Bayes over the L + 1 "
            f"targets) and log V; held-out loss {v_loss[0]:.3f} → {v_loss[-1]:.3f} nats over "
            f"{int(s_loss[-1])} steps. (b–e) Per layer on recorded steps: residual-stream PC1 share "
            f"(last block {sh[0]:.2f} → {sh[-1]:.2f}), r(PC1, H_Bayes) (last block {rr[0]:.2f} → "
            f"{rr[-1]:.2f}), key mean |cos| and attention entropy. (f) |H_model − H_Bayes| averaged over the "
            f"L + 1 target positions (the L key positions 0, 2, …, 2L − 2 and the query at 2L), where "
            f"H_model is first averaged over the held-out sequences at each position: "
            f"{v_mae[0]:.3f} → {v_mae[-1]:.3f} bits.")
