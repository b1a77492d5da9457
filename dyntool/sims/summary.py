"""The sticky-chain study's ``summary.json`` and printed table (spec §4.2, §4.5, §7)."""
from __future__ import annotations

import math

import numpy as np

from ..stats import mean_std


def steps_to_threshold(losses: np.ndarray, thr: float) -> int:
    """First index k with losses[k] < thr, or len(losses) if never (the authors' rule)."""
    below = np.nonzero(losses < thr)[0]
    return int(below[0]) if below.size else int(len(losses))


def _mean_std(x) -> dict:
    m, s = mean_std(x)                                               # sample std (ddof=1)
    return {"mean": m, "std": s}


def summarise(cfg, runs, result, hmin: float) -> dict:
    from scipy import stats
    losses = result.losses.numpy()
    final = {k: v.numpy() for k, v in result.final.items()}
    log_n = math.log(cfg.n_symbols)
    idx = {(seed, a.name): i for i, (seed, a) in enumerate(runs)}
    per_seed = []
    for seed in cfg.seeds:
        row = {"seed": seed}
        for a in cfg.arms:
            i = idx[(seed, a)]
            row[a] = {"final_loss": float(final["loss"][i]), "entropy": float(final["entropy"][i]),
                      "accuracy": float(final["accuracy"][i]), "losses": losses[i].tolist()}
        per_seed.append(row)
    out: dict = {"h_min": hmin, "log_n": log_n, "steps": cfg.steps, "T": cfg.T, "seeds": list(cfg.seeds),
                 "construction": cfg.construction, "per_seed": per_seed}
    out["final"] = {a: {m: _mean_std([r[a][m] for r in per_seed]) for m in ("final_loss", "entropy", "accuracy")}
                    for a in cfg.arms}
    out["entropy_gap"] = {a: {"raw": _mean_std([r[a]["entropy"] - hmin for r in per_seed]),
                              "normalised": _mean_std([(r[a]["entropy"] - hmin) / (log_n - hmin) for r in per_seed])}
                          for a in cfg.arms}
    if "sgd" in cfg.arms:
        thr = float(np.mean([r["sgd"]["final_loss"] for r in per_seed]))
        out["sgd_final_threshold"] = thr
        for a in [a for a in cfg.arms if a != "sgd"]:
            steps = [steps_to_threshold(np.asarray(r[a]["losses"]), thr) for r in per_seed]
            key = "em_steps_to_sgd_final" if a == "em" else f"{a}_steps_to_sgd_final"
            out[key] = {**_mean_std(steps), "per_seed": steps}
            if a == "em":
                out["speedup"] = cfg.steps / max(np.mean(steps), 1e-9)
                if len(per_seed) >= 2:
                    t = stats.ttest_rel([r["em"]["final_loss"] for r in per_seed],
                                        [r["sgd"]["final_loss"] for r in per_seed])
                    out["t_test"] = {"t": float(t.statistic), "p": float(t.pvalue)}
        if cfg.sweep:
            sweep = []
            for m in cfg.sweep:
                steps = [steps_to_threshold(losses[idx[(s, f"em-x{m:g}")]], thr) for s in cfg.seeds]
                sweep.append({"mult": m, "steps_mean": float(np.mean(steps)), "steps_std": mean_std(steps)[1],
                              "per_seed": steps,
                              "final_loss": _mean_std([final["loss"][idx[(s, f"em-x{m:g}")]] for s in cfg.seeds])})
            out["value_lr_sweep"] = sweep
    return out


def table(summary: dict) -> str:
    """A plain-text table of the study (printed by the CLI; the README quotes it)."""
    lines = [f"h_min = {summary['h_min']:.4f} nats   log n = "
             f"{summary['log_n']:.4f}   T = {summary['T']}, {summary['steps']} steps, seeds {summary['seeds']}"]
    arms = list(summary["final"])
    lines.append(f"{'arm':<16}{'final loss':>20}{'pred. entropy':>20}{'accuracy':>16}{'gap to h_min':>16}")
    for a in arms:
        f = summary["final"][a]
        g = summary["entropy_gap"][a]["raw"]
        lines.append(f"{a:<16}{f['final_loss']['mean']:>12.4f} ± {f['final_loss']['std']:.4f}"
                     f"{f['entropy']['mean']:>12.4f} ± {f['entropy']['std']:.4f}"
                     f"{f['accuracy']['mean']:>10.3f} ± {f['accuracy']['std']:.3f}{g['mean']:>16.4f}")
    if "em_steps_to_sgd_final" in summary:
        e = summary["em_steps_to_sgd_final"]
        lines.append(f"EM-like steps to SGD's final loss: {e['mean']:.0f} ± {e['std']:.0f} "
                     f"(per seed {e['per_seed']}); speed-up {summary['speedup']:.2f}x")
    if "t_test" in summary:
        lines.append(f"paired t-test (EM vs SGD final loss): t = {summary['t_test']['t']:.3f}, "
                     f"p = {summary['t_test']['p']:.4g}")
    for s in summary.get("value_lr_sweep", []):
        lines.append(f"value-LR x{s['mult']:g}: steps to SGD final {s['steps_mean']:.0f} ± {s['steps_std']:.0f}")
    return "\n".join(lines)
