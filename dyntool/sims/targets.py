"""Steps to a loss target, over seeds: the first step below a threshold, the targets at fractions of
SGD's loss drop (training and held-out), paired tests between arms (t-test, Wilcoxon) and their
markdown table; shared by the sticky-chain study (:mod:`dyntool.sims.summary`) and the separable
model (:mod:`dyntool.sims.separable`)."""
from __future__ import annotations

import numpy as np

from ..stats import mean_std


def steps_to_threshold(losses: np.ndarray, thr: float) -> int:
    """First index k with losses[k] < thr, or len(losses) if never (the authors' rule)."""
    below = np.nonzero(losses < thr)[0]
    return int(below[0]) if below.size else int(len(losses))


def seed_mean_std(x) -> dict:
    m, s = mean_std(x)                                               # sample std (ddof=1)
    return {"mean": m, "std": s}


def first_below(curve: list[tuple[int, float]], thr: float, n_steps: int) -> int:
    """First evaluated step whose held-out loss is below thr, else n_steps."""
    return next((k for k, v in curve if v < thr), n_steps)


def paired_tests(a, b) -> dict | None:
    """Paired comparison of a and b over seeds: the paired t-test (two-sided, ``t``/``p``) and the
    Wilcoxon signed-rank test (two-sided, ``wilcoxon_p``; zero differences dropped, scipy's
    default), mean ± sample std of a − b and how many seeds have a < b / a > b."""
    from scipy import stats
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    d = a - b
    out = {"mean_diff": float(d.mean()), "std_diff": float(d.std(ddof=1)), "n": int(len(d)),
           "n_lower": int((d < 0).sum()), "n_higher": int((d > 0).sum()),
           "t": None, "p": None, "wilcoxon_stat": None, "wilcoxon_p": None}
    if np.allclose(d, d[0]):                    # constant difference: t undefined
        return out
    t = stats.ttest_rel(a, b)
    out.update(t=float(t.statistic), p=float(t.pvalue))
    if (d != 0).any():
        w = stats.wilcoxon(a, b)
        out.update(wilcoxon_stat=float(w.statistic), wilcoxon_p=float(w.pvalue))
    return out


def loss_targets(start: float, end: float, fracs) -> dict[str, float]:
    """{frac: start − frac·(start − end)}: the loss after ``frac`` of SGD's drop (1 -> ``end`` exactly)."""
    return {f"{f:g}": (end if f == 1 else start - f * (start - end)) for f in fracs}


def steps_to_targets(cfg, per_seed, heldout, idx, name_of, ref: str = "em") -> tuple[dict, dict]:
    """Steps to 25/50/75/100 % (``cfg.target_fracs``) of SGD's mean loss drop over the budget, on
    the training loss (every step) and on the held-out loss (its evaluation grid), per arm, with
    paired tests against ``ref`` (em; ref itself: against sgd).  A seed that never reaches a target counts as
    ``cfg.steps`` (censored; ``not_reached`` says how many)."""
    fracs = list(getattr(cfg, "target_fracs", None) or [1.0])
    sgd = [r["sgd"] for r in per_seed]
    tr = loss_targets(float(np.mean([r["losses"][0] for r in sgd])), float(np.mean([r["final_loss"] for r in sgd])),
                      fracs)
    tg = {"fracs": fracs, "train": tr,
          "rule": "target = L0 − f·(L0 − L_end), L0 / L_end: SGD's mean loss at step 0 / after the last step; "
                  "steps: first step whose loss is below it (training: every step; held-out: its evaluation "
                  f"grid), {cfg.steps} if never (censored)"}
    curves = {"train": lambda s, a, thr: steps_to_threshold(np.asarray(per_seed[s][a]["losses"]), thr)}
    h0, h1 = ((float(np.mean([r["heldout_losses"][0][1] for r in sgd])), float(np.mean([r["heldout_loss"] for r in sgd])))
              if heldout is not None and "heldout_loss" in sgd[0] else (None, None))
    if h0 is not None and not h1 < h0:
        tg["heldout_note"] = f"SGD's mean held-out loss did not drop ({h0:.4f} -> {h1:.4f}): no held-out targets"
    elif h0 is not None:
        tg["heldout"] = loss_targets(h0, h1, fracs)
        curves["heldout"] = lambda s, a, thr: first_below(
            heldout[idx[(cfg.seeds[s], name_of[a])]], thr, cfg.steps)
    per_arm = {}
    for a in cfg.arms:
        per_arm[a] = {}
        for which, fn in curves.items():
            per_arm[a][which] = {}
            for f, thr in tg[which].items():
                st = [fn(s, a, thr) for s in range(len(per_seed))]
                per_arm[a][which][f] = {**seed_mean_std(st), "per_seed": st,
                                        "not_reached": int(sum(v >= cfg.steps for v in st))}
    for a in cfg.arms:
        other = "sgd" if a == ref else ref
        if other not in per_arm or a == other:
            continue
        for which in curves:
            for f, e in per_arm[a][which].items():
                e[f"vs_{other}"] = paired_tests(e["per_seed"], per_arm[other][which][f]["per_seed"])
    return tg, per_arm


def _pct(f: str) -> str:
    return f"{float(f):.0%}"


def _p(v) -> str:
    return "–" if v is None else f"{v:.2g}"


def targets_markdown(summary: dict) -> str:
    """Two markdown tables from summary['targets'] / arms[*]['targets']: steps to each fraction of
    SGD's loss drop (train and held-out) per arm, and the paired differences against EM-like
    (EM-like: against SGD) with the paired t-test and Wilcoxon signed-rank p-values.  ``summary['ref']``
    names the reference arm when it is not ``em`` (the separable model's ``values``)."""
    tg, arms, ref = summary["targets"], summary["arms"], summary.get("ref", "em")
    whichs = [w for w in ("train", "heldout") if w in tg]
    cols = [(w, f) for w in whichs for f in tg[w]]
    name = {"train": "train", "heldout": "held-out"}
    head = ["arm"] + [f"{name[w]} {_pct(f)} ({tg[w][f]:.4f})" for w, f in cols]
    out = ["Steps to a fraction of SGD's loss drop (target loss in nats in brackets; mean ± sample std over "
           f"{len(summary['seeds'])} seeds; [k] = k seeds not within {summary['steps']} steps, counted as "
           f"{summary['steps']}):", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a, e in arms.items():
        cells = [a]
        for w, f in cols:
            st = e["targets"][w][f]
            cells.append(f"{st['mean']:.0f} ± {st['std']:.0f}" + (f" [{st['not_reached']}]" if st["not_reached"] else ""))
        out.append("| " + " | ".join(cells) + " |")
    out += ["", f"Paired differences in steps (arm − {ref}; for {ref}: {ref} − sgd), mean ± sample std, "
            "k/n seeds where the arm is faster, paired t-test p / Wilcoxon signed-rank p (two-sided):", "",
            "| arm | " + " | ".join(f"{name[w]} {_pct(f)}" for w, f in cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for a, e in arms.items():
        if a == "sgd":                                   # the em row already holds em − sgd
            continue
        cells = [f"{a} − {'sgd' if a == ref else ref}"]
        for w, f in cols:
            v = e["targets"][w][f].get("vs_sgd" if a == ref else f"vs_{ref}")
            cells.append("–" if not v else f"{v['mean_diff']:+.0f} ± {v['std_diff']:.0f}, {v['n_lower']}/{v['n']}, "
                                           f"p {_p(v['p'])} / {_p(v['wilcoxon_p'])}")
        if any(c != "–" for c in cells[1:]):
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)
