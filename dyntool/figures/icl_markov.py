"""In-context Markov chain figures (Edelman et al. 2024, arXiv 2402.11004) from a ``dyntool sim icl-markov`` study:

* ``icl_kl_stages`` — KL(strategy ‖ model) on held-out chains for the uniform, unigram and bigram
  strategies over training, the stages (argmin KL, held 5 logged steps) shaded; the Dirichlet
  prior's first seed beside the control prior's;
* ``icl_cheap_heatmaps`` — layer × head by step heatmaps of the cheap tier (recorded on every
  step, averaged per logged window): attention entropy, log10 ‖∂L/∂S‖, max logit, max column usage;
* ``icl_attention_maps`` — the recorded α of every layer (head 0, first recorded sequence) at one
  full-tier step inside each stage (the seeded dense rerun when the inputs hold it);
* ``icl_key_type_lifts`` — per layer, the attention lift on same-token, induction, both and neither
  keys and lift(induction)/lift(neither) over training, the KL midpoint and the argmin stage start;
* ``icl_leading_indicator`` — (a) the previous-token head's ‖∂L/∂S‖ beside KL(bigram ‖ model);
  (b) the cross-correlation of their changes against the lag, per seed, with the shuffled-time
  control's 95 % level.

Each reads the first study among the inputs; data (``_*_data``) → drawing (``_*_draw``) →
caption (``_*_caption``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import masks
from ..record import metric_names as mn
from ..sims import icl_markov_analysis as an
from ..sims.icl_markov_task import STRATEGIES
from . import style
from .common import array, first_study, need, summary_of
from .registry import figure

KIND = "icl-markov"
CONTROL = "doubly_stochastic"
CONTROLS = (CONTROL, "birkhoff", "birkhoff_unigram", "unigram")     # the priors drawn after the main one
STAGE_COLORS = {"uniform": style.OKABE_ITO["sky"], "unigram": style.OKABE_ITO["orange"],
                "bigram": style.OKABE_ITO["green"]}
CHEAP = ((mn.ATTN_ENTROPY, "entropy [nats]", False), (mn.SCORE_GRAD_NORM, "log10 ‖∂L/∂S‖", True),
         (mn.LOGIT_MAX, "max logit", False), (mn.COLUMN_MAX, "max column usage / T", False))


def _prior(run) -> str:
    return str((run.config or {}).get("prior", ""))


def _is_dense(run) -> bool:
    return str(run.path).rstrip("/").endswith("-dense")


def _pick(runs):
    return first_study(runs)


def _main(runs, prior: str | None = None):
    """The non-dense run of ``prior`` (default: the Dirichlet prior's, else any run not of a control
    prior) with the lowest seed (the study's first seed: its dense rerun, if any, is of that seed)."""
    ordered = [r for r in sorted(runs, key=lambda r: int((r.config or {}).get("seed", 0))) if not _is_dense(r)]
    if prior:
        return next((r for r in ordered if _prior(r) == prior), None)
    return next((r for r in ordered if _prior(r) == "dirichlet"), None) or \
        next((r for r in ordered if _prior(r) not in CONTROLS), None)


def _check(runs):
    r = _main(runs)
    need(r is not None, "the icl-markov study has no run of its main prior")
    need(mn.icl_kl("bigram") in r.metrics.columns, f"{r.id} logged no KLs")
    return True, ""


def _shade(ax, stage_list: list[dict], end: int) -> None:
    for i, s in enumerate(stage_list):
        stop = stage_list[i + 1]["start"] if i + 1 < len(stage_list) else end
        ax.axvspan(s["start"], stop, color=STAGE_COLORS.get(s["stage"], "#dddddd"), alpha=0.18, lw=0)


# -- KL curves with stages ------------------------------------------------------------------------
@figure("icl_kl_stages", "ICL-MC: KL(strategy ‖ model) over training, stages shaded", KIND,
        needs="an icl-markov study (kl/uniform, kl/unigram, kl/bigram logged)", group="dynamics",
        pick=_pick, check=_check)
def icl_kl_stages(runs, **opts):
    data, extras = _kl_data(runs)
    return _kl_draw(extras), data, _kl_caption(extras)


def _kl_data(runs):
    panels, rows = [], []
    for r in (_main(runs), *(_main(runs, c) for c in CONTROLS)):
        if r is None:
            continue
        df = r.metrics
        lg = an.logged(df)
        steps = lg["step"].to_numpy(np.int64)
        kls = {s: lg[mn.icl_kl(s)].to_numpy(float) for s in STRATEGIES}
        st = an.stages(df)
        panels.append({"run": r.id, "prior": _prior(r), "steps": steps, "kls": kls, "stages": st})
        rows += [{"run": r.id, "prior": _prior(r), "step": int(s), "strategy": k, "kl": float(v[i])}
                 for k, v in kls.items() for i, s in enumerate(steps)]
    return pd.DataFrame(rows), {"panels": panels, "summary": summary_of(runs[0])}


def _kl_draw(extras):
    panels = extras["panels"]
    fig = style.figure(style.DOUBLE, 2.6 if len(panels) <= 2 else 2.2)
    axes = np.atleast_1d(fig.subplots(1, len(panels), sharey=True))
    for ax, p, letter in zip(axes, panels, "abcde"):
        _shade(ax, p["stages"], int(p["steps"][-1]))
        for k, c in zip(STRATEGIES, (style.OKABE_ITO["sky"], style.OKABE_ITO["orange"], style.OKABE_ITO["green"])):
            ax.plot(p["steps"], np.maximum(p["kls"][k], 1e-5), color=c, lw=1.0, label=f"KL({k} ‖ model)")
        ax.set_yscale("log")
        ax.set_xlabel(style.STEP)
        ax.set_title(f"{p['prior']} prior ({p['run']})", fontsize=7)
        style.panel_label(ax, letter)
    axes[0].set_ylabel("KL [nats], held-out mean")
    axes[0].legend(fontsize=6, frameon=False)
    return fig


def _kl_caption(extras):
    parts = []
    for p in extras["panels"]:
        st = ", ".join(f"{s['stage']} from step {s['start']}" for s in p["stages"])
        end = {k: float(np.nanmean(v[-an.HOLD:])) for k, v in p["kls"].items()}
        parts.append(f"{p['run']} ({p['prior']} prior): {st}; at the end KL to uniform/unigram/bigram "
                     f"{end['uniform']:.3g}/{end['unigram']:.3g}/{end['bigram']:.3g} nats (step 0: "
                     f"{p['kls']['uniform'][0]:.3g}/{p['kls']['unigram'][0]:.3g}/{p['kls']['bigram'][0]:.3g})")
    s = extras["summary"].get("priors", {})
    over = "; ".join(f"over {a['bigram_start']['of']} seeds ({pr}) the bigram stage starts at step "
                     f"{a['bigram_start']['mean']:.0f} ± {a['bigram_start']['std']:.0f}" for pr, a in s.items()
                     if a.get("bigram_start", {}).get("n"))
    return ("KL(strategy ‖ model) averaged over positions and held-out chains; shading: the stage (the strategy of "
            "smallest KL, a new stage once it holds for 5 logged steps). " + ". ".join(parts) + "." +
            (f" {over}." if over else ""))


# -- cheap-tier heatmaps --------------------------------------------------------------------------
@figure("icl_cheap_heatmaps", "ICL-MC: the cheap tier per layer × head over training (heatmaps)", KIND,
        needs="an icl-markov run (the cheap tier on every step)", group="dynamics", pick=_pick, check=_check)
def icl_cheap_heatmaps(runs, **opts):
    data, extras = _heat_data(runs)
    return _heat_draw(extras), data, _heat_caption(extras)


def _heat_data(runs):
    r = _main(runs)
    df = r.metrics
    mats, rows = {}, []
    for base, _, log in CHEAP:
        cols = mn.per_head(df.columns, base)
        need(cols, f"{r.id} logged no {base} per head")
        keys = sorted(cols)
        series = []
        for lh in keys:
            steps, v = an.on_logged_grid(df, cols[lh])
            series.append(np.log10(np.maximum(v, 1e-30)) if log else v)
            rows += [{"stat": base, "layer": lh[0], "head": lh[1], "step": int(s), "value": float(x)}
                     for s, x in zip(steps, v)]
        mats[base] = (keys, np.array(series))
    return pd.DataFrame(rows), {"run": r.id, "steps": steps, "mats": mats, "stages": an.stages(df)}


def _heat_draw(extras):
    steps = extras["steps"]
    fig = style.figure(style.DOUBLE, 3.8)
    axes = fig.subplots(len(CHEAP), 1, sharex=True)
    for ax, (base, label, _) in zip(axes, CHEAP):
        keys, m = extras["mats"][base]
        im = ax.imshow(m, aspect="auto", interpolation="nearest", cmap=style.SEQ_CMAP,
                       extent=(steps[0], steps[-1], len(keys) - 0.5, -0.5))
        ax.set_yticks(range(len(keys)), [f"L{l}H{h}" for l, h in keys], fontsize=6)
        for s in extras["stages"][1:]:
            ax.axvline(s["start"], color="white", lw=0.8, ls="--")
        fig.colorbar(im, ax=ax, pad=0.01, fraction=0.03).set_label(label, fontsize=6)
    axes[-1].set_xlabel(style.STEP)
    return fig


def _heat_caption(extras):
    bounds = ", ".join(f"{s['stage']} at {s['start']}" for s in extras["stages"][1:]) or "none"
    return (f"The cheap tier of {extras['run']} (recorded on every training step, averaged over each logged window "
            f"of the training batches): per layer × head, attention entropy, log10 of the score-gradient norm "
            f"‖∂L/∂S‖, the largest logit and the largest column usage Σ_i α_ij / T.  Dashed lines: stage boundaries ({bounds}).")


# -- attention maps per stage ---------------------------------------------------------------------
def _map_run(runs):
    dense = [r for r in runs if _is_dense(r) and array(r, "attn") is not None]
    main = _main(runs)
    return dense[0] if dense else main


def _check_maps(runs):
    _check(runs)
    r = _map_run(runs)
    need(array(r, "attn") is not None, f"{r.id} recorded no attn (record.arrays or record.every = 0?)")
    return True, ""


@figure("icl_attention_maps", "ICL-MC: attention of both layers at one recorded step inside each stage", KIND,
        needs="an icl-markov run with the full tier (attn) recorded", group="dynamics", pick=_pick, check=_check_maps)
def icl_attention_maps(runs, **opts):
    data, extras = _maps_data(runs)
    return _maps_draw(extras), data, _maps_caption(extras)


def _maps_data(runs, crop: int = 40):
    r = _map_run(runs)
    attn = array(r, "attn")
    rec = np.asarray(r.steps[: len(attn)], dtype=np.int64)
    st = an.stages(r.metrics)
    last = int(an.logged(r.metrics)["step"].max())
    picks = []
    for i, s in enumerate(st):
        stop = st[i + 1]["start"] if i + 1 < len(st) else last + 1
        inside = rec[(rec >= s["start"]) & (rec < stop)]
        if len(inside):
            step = int(inside[np.argmin(np.abs(inside - (s["start"] + stop) / 2))])
            picks.append((s["stage"], step))
    need(picks, f"{r.id} has no recorded step inside any stage")
    maps, rows = {}, []
    for stage, step in picks:
        a = np.asarray(attn[int(np.nonzero(rec == step)[0][0])], dtype=float)       # (L, H, S, T, T)
        n = min(crop, a.shape[-1])
        maps[(stage, step)] = a[:, 0, 0, :n, :n]
        rows += [{"stage": stage, "step": step, "layer": l, "query": i, "key": j, "attn": float(maps[(stage, step)][l, i, j])}
                 for l in range(a.shape[0]) for i in range(n) for j in range(i + 1)]
    return pd.DataFrame(rows), {"run": r.id, "maps": maps, "n_layer": attn.shape[1]}


def _maps_draw(extras):
    maps, L = extras["maps"], extras["n_layer"]
    fig = style.figure(style.DOUBLE, 1.9 * L + 0.3)
    axes = np.atleast_2d(fig.subplots(L, len(maps), squeeze=False))
    for c, ((stage, step), m) in enumerate(maps.items()):
        for l in range(L):
            ax = axes[l, c]
            ax.imshow(np.where(masks.causal().dense(m[l].shape[-1])[0].numpy(), m[l], np.nan), cmap=style.SEQ_CMAP, vmin=0,
                      vmax=max(float(np.nanmax(m[l][1:])), 1e-6), interpolation="nearest")
            ax.set_title(f"layer {l}, {stage} stage, step {step}", fontsize=6)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel("query", fontsize=6)
            if l == L - 1:
                ax.set_xlabel("key", fontsize=6)
    return fig


def _maps_caption(extras):
    picks = ", ".join(f"{st} stage at step {s}" for st, s in extras["maps"])
    return (f"Recorded attention α of {extras['run']} (head 0, the first recorded training sequence, the first 40 "
            f"positions; colour scale per panel from 0 to its largest value below the first row) at the full-tier "
            f"step nearest the middle of each stage: {picks}.  A previous-token head shows as the sub-diagonal, an "
            f"induction head as scattered mass on the keys that follow earlier occurrences of the current state.")


# -- leading indicator ------------------------------------------------------------------------------
@figure("icl_leading_indicator", "ICL-MC: does the previous-token head's ‖∂L/∂S‖ lead the bigram transition?",
        KIND, needs="an icl-markov study (summary.json with the lead test)", group="dynamics", pick=_pick, check=_check)
def icl_leading_indicator(runs, **opts):
    data, extras = _lead_data(runs)
    return _lead_draw(extras), data, _lead_caption(extras)


def _lead_data(runs):
    r = _main(runs)
    dense = summary_of(r).get("dense_rerun") or {}
    summ = summary_of(r).get("priors", {}).get(_prior(r), {})
    per = summ.get("per_seed", {})
    if not per:                                       # no summary: this run's test, computed here
        a = an.analyse_run(r.metrics, int(r.config["model"]["n_layer"]), int(r.config["model"]["n_head"]))
        per = {str(r.config.get("seed", 0)): a}
    a0 = next(iter(per.values()))
    pl, ph = a0["prev_token_head"]
    steps, g = an.on_logged_grid(r.metrics, mn.head(mn.SCORE_GRAD_NORM, pl, ph))
    kl = an.logged(r.metrics)[mn.icl_kl("bigram")].to_numpy(float)
    rows = [{"seed": s, "lag_steps": lag, "r": v, "null_r_95": a["lead"].get("null_r_95")}
            for s, a in per.items() for lag, v in zip(a["lead"].get("lags_steps", []), a["lead"].get("r_by_lag", []))]
    return pd.DataFrame(rows), {"run": r.id, "steps": steps, "g": g, "kl": kl, "head": (pl, ph),
                                "bigram_start": an.first_start(an.stages(r.metrics), "bigram"), "per": per,
                                "adv": dense.get("advantage_to_previous") or {}, "dense": dense}


def _lead_draw(extras):
    adv = extras["adv"]
    fig = style.figure(style.DOUBLE, 2.6)
    axes = fig.subplots(1, 3 if adv.get("steps") else 2)
    ax1, ax2 = axes[0], axes[1]
    if adv.get("steps"):
        ax3 = axes[2]
        ax3.plot(adv["steps"], adv["prev"], color=style.OKABE_ITO["vermillion"], marker="o", ms=2, lw=0.8,
                 label="A(i, i−1)")
        ax3.plot(adv["steps"], adv["all"], color=style.REF_COLOR, marker="o", ms=2, lw=0.8, label="mean over keys")
        for b in extras["dense"].get("boundaries", []):
            ax3.axvline(b, color=style.REF_COLOR, ls="--", lw=0.8)
        ax3.set_xlabel(style.STEP)
        ax3.set_ylabel("advantage (full tier, dense rerun)")
        ax3.legend(fontsize=5, frameon=False)
        style.panel_label(ax3, "c")
    ax1.plot(extras["steps"], extras["g"], color=style.OKABE_ITO["vermillion"], lw=1.0)
    ax1.set_ylabel(f"‖∂L/∂S‖, L{extras['head'][0]}H{extras['head'][1]}", color=style.OKABE_ITO["vermillion"])
    tw = ax1.twinx()
    tw.plot(extras["steps"], extras["kl"], color=style.OKABE_ITO["green"], lw=1.0)
    tw.set_ylabel("KL(bigram ‖ model) [nats]", color=style.OKABE_ITO["green"])
    if extras["bigram_start"] is not None:
        ax1.axvline(extras["bigram_start"], color=style.REF_COLOR, ls="--", lw=0.8)
    ax1.set_xlabel(style.STEP)
    for i, (seed, a) in enumerate(extras["per"].items()):
        c = style.CYCLE[i % len(style.CYCLE)]
        ax2.plot(a["lead"].get("lags_steps", []), a["lead"].get("r_by_lag", []), color=c, lw=0.9, label=f"seed {seed}")
        if a["lead"].get("null_r_95") is not None:
            ax2.axhline(a["lead"]["null_r_95"], color=c, lw=0.6, ls=":")
    ax2.axvline(0, color=style.REF_COLOR, lw=0.6)
    ax2.set_xlabel("lag [steps] (> 0: ‖∂L/∂S‖ changes first)")
    ax2.set_ylabel("corr(Δ‖∂L/∂S‖(t), −ΔKL_bigram(t + lag))")
    ax2.legend(fontsize=5, frameon=False, ncol=2)
    style.panel_label(ax1, "a")
    style.panel_label(ax2, "b")
    return fig


def _lead_caption(extras):
    per = extras["per"]
    lags = [a["lead"]["lag_steps"] for a in per.values() if a["lead"].get("lag_steps") is not None]
    ps = [a["lead"]["p"] for a in per.values() if a["lead"].get("p") is not None]
    return (f"(a) {extras['run']}: the score-gradient norm of the previous-token head (cheap tier, averaged per logged "
            f"window) beside KL(bigram ‖ model); dashed: the bigram stage's start "
            f"({extras['bigram_start']}).  (b) per seed, the correlation of the changes of ‖∂L/∂S‖ with the bigram "
            f"transition's progress at each lag; dotted: the 95th percentile of the best correlation with the "
            f"indicator's changes shuffled in time (500 permutations).  Best lags {lags} steps; permutation p "
            f"{[round(p, 3) for p in ps]}." + _adv_caption(extras))


def _adv_caption(extras) -> str:
    adv, d = extras["adv"], extras["dense"]
    if not adv.get("steps"):
        return ""
    return (f"  (c) the seeded rerun {d.get('run')} (full tier on {len(adv['steps'])} steps, densely around the first "
            f"run's stage boundaries {d.get('boundaries')}, dashed): the previous-token head's advantage toward the "
            f"previous position, mean over queries, beside the mean over all visible keys.")


# -- key-type lifts per layer ---------------------------------------------------------------------
LIFT_COLORS = {"same": style.OKABE_ITO["vermillion"], "induction": style.OKABE_ITO["green"],
               "both": style.OKABE_ITO["blue"], "neither": style.REF_COLOR}


def _check_lifts(runs):
    _check(runs)
    r = _main(runs)
    need(mn.head("lift_same", 0, 0) in r.metrics.columns, f"{r.id} logged no key-type lifts (written before them)")
    return True, ""


@figure("icl_key_type_lifts", "ICL-MC: attention lift on same-token, induction, both and neither keys, per layer",
        KIND, needs="an icl-markov study with key-type lifts (lift_*/L{l}H0 logged)", group="dynamics",
        pick=_pick, check=_check_lifts)
def icl_key_type_lifts(runs, **opts):
    data, extras = _lift_data(runs)
    return _lift_draw(extras), data, _lift_caption(extras)


def _lift_data(runs):
    r = _main(runs)
    n_layer = int(r.config["model"]["n_layer"])
    lg = an.logged(r.metrics)
    steps = lg["step"].to_numpy(np.int64)
    a = an.analyse_run(r.metrics, n_layer, int(r.config["model"]["n_head"]))
    layers, rows = [], []
    for l in range(n_layer):
        lifts = {kt: lg[mn.head(f"lift_{kt}", l, 0)].to_numpy(float) for kt in LIFT_COLORS}
        with np.errstate(invalid="ignore", divide="ignore"):
            spec = lifts["induction"] / lifts["neither"]
        layers.append({"lifts": lifts, "specific": spec, "heads": a["heads"][f"L{l}H0"]})
        rows += [{"layer": l, "step": int(s), "key_type": kt, "lift": float(v[i])}
                 for kt, v in lifts.items() for i, s in enumerate(steps)]
    return pd.DataFrame(rows), {"run": r.id, "steps": steps, "layers": layers, "bigram_start": a["bigram_start"],
                                "bigram_mid": a["bigram_mid"]}


def _lift_draw(extras):
    layers = extras["layers"]
    fig = style.figure(style.DOUBLE, 2.4)
    axes = np.atleast_1d(fig.subplots(1, len(layers), sharey=True))
    for l, (ax, d) in enumerate(zip(axes, layers)):
        for kt, c in LIFT_COLORS.items():
            ax.plot(extras["steps"], d["lifts"][kt], color=c, lw=0.9, label=kt)
        ax.plot(extras["steps"], d["specific"], color=style.OKABE_ITO["green"], lw=0.9, ls="--",
                label="induction / neither")
        ax.axhline(1.0, color=style.REF_COLOR, lw=0.5, ls=":")
        for x, ls in ((extras["bigram_mid"], "-"), (extras["bigram_start"], "--")):
            if x is not None:
                ax.axvline(x, color=style.REF_COLOR, lw=0.7, ls=ls)
        ax.set_yscale("log")
        ax.set_xlabel(style.STEP)
        ax.set_title(f"layer {l}, head 0", fontsize=7)
        style.panel_label(ax, "abcd"[l])
    axes[0].set_ylabel("lift (attention mass / share of keys)")
    axes[0].legend(fontsize=5, frameon=False, ncol=2)
    return fig


def _lift_caption(extras):
    def t(d, q):
        v = (d["heads"].get(q) or {}).get("t10")
        return "never" if v is None else f"step {v}"
    parts = []
    for l, d in enumerate(extras["layers"]):
        end = {kt: float(np.nanmean(v[-an.HOLD:])) for kt, v in d["lifts"].items()}
        parts.append(f"layer {l}: at the end same {end['same']:.2f}, induction {end['induction']:.2f}, both "
                     f"{end['both']:.2f}, neither {end['neither']:.2f}; lowest same-token lift "
                     f"{float(np.nanmin(d['lifts']['same'])):.2f}; 10 % of its change: induction/neither at "
                     f"{t(d, 'induction_specific')}, induction score at {t(d, 'induction')}")
    return (f"{extras['run']}: per layer, the attention mass on each exclusive key type over its share of the visible "
            f"keys, averaged over the held-out queries that have one (1, dotted: no preference); dashed green: "
            f"lift(induction)/lift(neither), the induction-specific measure. Solid vertical: the KL(bigram) drop's "
            f"midpoint (step {extras['bigram_mid']}); dashed: the argmin rule's bigram start "
            f"(step {extras['bigram_start']}). " + "; ".join(parts) + ".")
