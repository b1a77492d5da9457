"""``dyntool study span``: the standard backward against readings of the span paper (Kim, Yun & Yoon,
arXiv 2512.13033; only its abstract was read, dyntool/span.py).  None of the readings is known to
be the paper's method; each arm says which reading it is.

Arms (``--arms`` picks a subset that includes ``baseline``; default: ``baseline`` and ``span``):

* ``baseline``: mhsa, the standard backward;
* ``span``: C1a (``c1_orthogonal``), α = 2, β = 1 on dQ and dK (the ``wikitext_span`` preset's reading);
* ``c1a-a0.5``: C1a, α = 0.5, β = 1 (the parallel part scaled *down*);
* ``ab2``: C1a, α = β = 2: a uniform rescale of dQ, dK.  AdamW undoes it on the attention's own
  weights; it changes training only through the layers below q, k (their gradient gets 2× the
  q/k path) and through the global-norm clip (tests/unit/test_span_adam.py), so it separates
  "the span split" from "a larger q/k gradient";
* ``c1b-a2``: C1b (``c1_oblique``, the partner k̄ / q̄: the abstract's "asymmetric"), α = 2, β = 1.

Per arm and seed, beside the validation losses: the clip factor min(1, clip / (‖g‖ + 1e-6)) of every
step (from the logged grad_norm; its mean, minimum and the share of steps it bound) and each head's
max |logit| (``logit_max/L{l}H{h}``: its last and largest value), since α changes the q, k
gradient's size and so, through the clip, every parameter's step.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import ConfigError
from ..record import metric_names as mn
from .study_runs import new_study_dir, train_arm

_C1A = {"span.candidate": "c1_orthogonal"}
ARMS = {
    "baseline": ({"model.attention": "mhsa"}, "standard backward (mhsa)"),
    "span": ({**_C1A, "span.alpha_q": 2.0, "span.beta_q": 1.0, "span.alpha_k": 2.0, "span.beta_k": 1.0},
             "C1a orthogonal, α = 2, β = 1 on dQ and dK"),
    "c1a-a0.5": ({**_C1A, "span.alpha_q": 0.5, "span.beta_q": 1.0, "span.alpha_k": 0.5, "span.beta_k": 1.0},
                 "C1a orthogonal, α = 0.5, β = 1 on dQ and dK"),
    "ab2": ({**_C1A, "span.alpha_q": 2.0, "span.beta_q": 2.0, "span.alpha_k": 2.0, "span.beta_k": 2.0},
            "α = β = 2 (uniform dQ, dK rescale: changes training only below q, k and through the clip)"),
    "c1b-a2": ({"span.candidate": "c1_oblique", "span.alpha_q": 2.0, "span.beta_q": 1.0, "span.alpha_k": 2.0,
                "span.beta_k": 1.0}, "C1b oblique (partner k̄, q̄), α = 2, β = 1 on dQ and dK"),
}
DEFAULT_ARMS = ("baseline", "span")


def pick_arms(arms: list[str] | None) -> dict:
    if arms is None:
        return {a: ARMS[a] for a in DEFAULT_ARMS}
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ConfigError("arms", f"{', '.join(unknown)} is not an arm of this study (its arms: {', '.join(ARMS)})")
    if "baseline" not in arms:
        raise ConfigError("arms", "the span study's Δ needs the baseline arm (add baseline to --arms)")
    return {a: v for a, v in ARMS.items() if a in arms}


def clip_and_logits(metrics, clip: float) -> dict:
    """From a run's metrics: the clip factor per step (mean, min, share of steps < 1) and each
    head's max |logit| (last logged value, largest)."""
    out: dict = {"clip": None, "logit_max": {}}
    if "grad_norm" in metrics and clip > 0:
        g = metrics["grad_norm"].dropna().to_numpy(float)
        if len(g):
            f = np.minimum(1.0, clip / (g + 1e-6))
            out["clip"] = {"mean": float(f.mean()), "min": float(f.min()), "bound_share": float((f < 1).mean()),
                           "steps": int(len(f))}
    for col in sorted(c for c in metrics.columns if c.startswith(mn.LOGIT_MAX + "/L") and "H" in c.split("/")[-1]):
        v = metrics[col].dropna().to_numpy(float)
        if len(v):
            out["logit_max"][col.split("/", 1)[1]] = {"last": float(v[-1]), "max": float(v.max())}
    return out


def run_span_study(out, study, preset, overrides, quiet, name, tags, configs, mean_std) -> dict:
    """The study (``configs``/``mean_std``: :mod:`.studies`' config loader and sample mean ± sd,
    handed in so that this module does not import its caller)."""
    _configs, _mean_std = configs, mean_std
    arms = pick_arms(study.arms)
    cfgs = _configs({a: "wikitext_span.toml" for a in arms}, {a: v[0] for a, v in arms.items()}, study, preset,
                    overrides)
    d = new_study_dir(out, "span", name)
    rows = []
    for seed in study.seeds:
        res = {"seed": seed}
        for arm in arms:
            cfg = cfgs[arm, seed]
            r = train_arm(d, f"{arm}-s{seed}", cfg, quiet, ["study-span", *tags])
            final = r.meta.get("final", {})
            vals = r.metrics["val_loss"].dropna() if "val_loss" in r.metrics else []
            last = float(vals.iloc[-1]) if len(vals) else None     # when final_eval is off
            res[arm] = {"run": r.id, "status": r.status, "final_val_loss": final.get("valid_loss", last),
                        "best_val_loss": float(min(vals)) if len(vals) else None,
                        "valid_ppl": final.get("valid_ppl"), "test_ppl": final.get("test_ppl"),
                        "final_eval": final.get("final_eval"), "final_eval_tokens": final.get("final_eval_tokens"),
                        **clip_and_logits(r.metrics, cfg.optim.grad_clip)}
        for arm in arms:
            if arm == "baseline":
                continue
            for key, src in (("rel_change_pct", "final_val_loss"), ("rel_change_best_pct", "best_val_loss")):
                b, s = res["baseline"][src], res[arm][src]
                res[arm][key] = 100 * (s - b) / b if b and s else None
        rows.append(res)
    per_arm = {}
    for arm in arms:
        if arm != "baseline":
            m, sd = _mean_std([r[arm]["rel_change_pct"] for r in rows])
            mb, sdb = _mean_std([r[arm]["rel_change_best_pct"] for r in rows])
            per_arm[arm] = {"reading": arms[arm][1], "span": dataclasses.asdict(cfgs[arm, study.seeds[0]].span),
                            "rel_change_pct_mean": m, "rel_change_pct_std": sd,
                            "rel_change_best_pct_mean": mb, "rel_change_best_pct_std": sdb}
    summary = {"study": "span", "dir": str(d), "preset": preset, "overrides": list(overrides),
               "seeds_requested": list(study.seeds), "max_steps": study.max_steps, "arms": per_arm,
               "seeds": rows, "paper_rel_change_pct": -0.56,
               "paper_note": "none of the arms is known to be the paper's method (its body was not read)"}
    if "span" in per_arm:                         # the keys of the two-arm study, kept for its readers
        s = per_arm["span"]
        summary.update(span=s["span"], rel_change_pct_mean=s["rel_change_pct_mean"],
                       rel_change_pct_std=s["rel_change_pct_std"], rel_change_best_pct_mean=s["rel_change_best_pct_mean"],
                       rel_change_best_pct_std=s["rel_change_best_pct_std"])
        for r in rows:
            r["rel_change_pct"], r["rel_change_best_pct"] = r["span"]["rel_change_pct"], r["span"]["rel_change_best_pct"]
    print("\n" + table(summary))
    return summary


def table(summary: dict) -> str:
    """The table the study prints, from its summary (also ``dyntool info STUDY``): each arm's
    reading, per seed and arm the validation loss, Δ against the baseline and the clip factor, then
    each arm's mean Δ."""
    per_arm, rows = summary["arms"], summary["seeds"]
    arms = ["baseline", *per_arm]
    f = lambda x, w, p=4: f"{x:{w}.{p}f}" if isinstance(x, (int, float)) and math.isfinite(x) else " " * (w - 1) + "-"   # noqa: E731
    pct = lambda x, e: f"{x:+.3f} ± {e:.3f} %" if isinstance(x, (int, float)) and math.isfinite(x) else "-"            # noqa: E731
    lines = [f"study span ({summary.get('dir')}); none of these readings is known to be the paper's method"]
    lines += [f"  {arm}: {v['reading']}" for arm, v in per_arm.items()]
    lines.append(f"{'seed':>4}  {'arm':>9}  {'val loss':>9}  {'Δ% final':>9}  {'Δ% best':>8}  {'clip mean':>9}  {'bound':>6}")
    for r in rows:
        for arm in arms:
            a = r[arm]
            c = a.get("clip") or {}
            lines.append(f"{r['seed']:>4}  {arm:>9}  {f(a['final_val_loss'], 9)}  {f(a.get('rel_change_pct'), 9, 3)}  "
                         f"{f(a.get('rel_change_best_pct'), 8, 3)}  {f(c.get('mean'), 9, 3)}  {f(c.get('bound_share'), 6, 2)}")
    if all(r[a]["final_val_loss"] is None for r in rows for a in arms):   # e.g. final_eval=off, eval_every=0
        lines.append("relative validation-loss change: - (no run evaluated on the validation split; "
                     "train.final_eval or train.eval_every turns it on); paper: -0.56 %")
    else:
        for arm, v in per_arm.items():
            lines.append(f"relative validation-loss change, {arm}: {pct(v['rel_change_pct_mean'], v['rel_change_pct_std'])} "
                         f"(final), {pct(v['rel_change_best_pct_mean'], v['rel_change_best_pct_std'])} (best); paper: -0.56 %")
    bounded = [r[a]["final_eval_tokens"]["valid"] for r in rows for a in arms if r[a].get("final_eval") == "bounded"]
    if bounded:                        # short runs: say that "final" is an estimate on part of the split
        lines.append(f"final = bounded final evaluation (first {max(bounded):,} validation tokens; these runs trained "
                     f"on fewer tokens than the splits hold); --train.final_eval=full reads the whole splits")
    return "\n".join(lines)
