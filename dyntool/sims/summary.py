"""The sticky-chain study's ``summary.json`` and printed table (arXiv 2512.22473: sticky Markov-chain task and the numbers to reproduce)."""
from __future__ import annotations

import math

import numpy as np

from ..stats import mean_std


# SGD's mean final training loss IS the target, so its own "steps to target" only restates the budget
SGD_TARGET = "(sets the target)"


def steps_to_threshold(losses: np.ndarray, thr: float) -> int:
    """First index k with losses[k] < thr, or len(losses) if never (the authors' rule)."""
    below = np.nonzero(losses < thr)[0]
    return int(below[0]) if below.size else int(len(losses))


def _mean_std(x) -> dict:
    m, s = mean_std(x)                                               # sample std (ddof=1)
    return {"mean": m, "std": s}


def _first_below(curve: list[tuple[int, float]], thr: float, n_steps: int) -> int:
    """First evaluated step whose held-out loss is below thr, else n_steps."""
    return next((k for k, v in curve if v < thr), n_steps)


def _paired(a, b) -> dict | None:
    from scipy import stats
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    if np.allclose(a - b, (a - b)[0]):          # constant difference: t undefined
        return {"t": None, "p": None, "mean_diff": float((a - b).mean())}
    t = stats.ttest_rel(a, b)
    return {"t": float(t.statistic), "p": float(t.pvalue), "mean_diff": float((a - b).mean())}


def summarise(cfg, runs, result, hmin: float, heldout=None, grid=None, bayes=None) -> dict:
    """``heldout``: per run [(step, held-out loss)]; ``grid``: sgd_tuned grid LR -> run name;
    ``bayes``: the forward filter's Bayes NLL per seed (train / held-out) and H_Bayes spread."""
    from scipy import stats
    losses = result.losses.numpy()
    final = {k: v.numpy() for k, v in result.final.items()}
    fev = {k: v.numpy() for k, v in (result.final_eval or {}).items()}
    log_n = math.log(cfg.n_symbols)
    idx = {(seed, a.name): i for i, (seed, a) in enumerate(runs)}
    out: dict = {"h_min": hmin, "log_n": log_n, "steps": cfg.steps, "T": cfg.T, "seeds": list(cfg.seeds),
                 "construction": cfg.construction, "noise_std": cfg.noise_std,
                 "heldout": ({"offset": cfg.heldout_offset, "every": cfg.heldout_every,
                              "rule": "seed s is evaluated on generate(s + offset): same chain and symbol "
                                      "means, another path and noise"} if fev else None),
                 "std": "sample (ddof = 1) over seeds"}
    name_of = {a: a for a in cfg.arms}
    if grid:
        mean_final = {g: float(np.mean([fev["loss"][idx[(s, n)]] for s in cfg.seeds])) for g, n in grid.items()}
        finite = {g: v for g, v in mean_final.items() if math.isfinite(v)}
        pick = min(finite, key=finite.get)
        name_of["sgd_tuned"] = grid[pick]
        out["sgd_tuned"] = {"grid": [float(g) for g in grid], "picked_lr": float(pick),
                            "picked_run": grid[pick], "rule": "lowest mean final held-out loss over seeds",
                            "mean_final_heldout_loss": {f"{g:g}": v for g, v in mean_final.items()}}
    per_seed = []
    for seed in cfg.seeds:
        row = {"seed": seed}
        for a in cfg.arms:
            i = idx[(seed, name_of[a])]
            row[a] = {"final_loss": float(final["loss"][i]), "entropy": float(final["entropy"][i]),
                      "accuracy": float(final["accuracy"][i]), "losses": losses[i].tolist(),
                      "lrs": list(runs[i][1].lrs), "run": f"seed{seed}-{name_of[a]}"}
            if fev:
                row[a].update({f"heldout_{k}": float(fev[k][i]) for k in ("loss", "entropy", "accuracy")})
                row[a]["heldout_losses"] = [[k, v] for k, v in heldout[i]]
        per_seed.append(row)
    out["per_seed"] = per_seed
    if bayes:
        # excess loss over the Bayes-optimal causal predictor (forward filter), per arm; the
        # minimum achievable loss, unlike H_min, which assumes y_{t−1} is observed exactly
        bn = {r["seed"]: r for r in bayes["per_seed"]}
        out["bayes"] = {**bayes, "train_mean": _mean_std([bn[s]["train"] for s in cfg.seeds])}
        if fev:
            out["bayes"]["heldout_mean"] = _mean_std([bn[s]["heldout"] for s in cfg.seeds])
        for r in per_seed:
            for a in cfg.arms:
                r[a]["excess_loss"] = r[a]["final_loss"] - bn[r["seed"]]["train"]
                if fev:
                    r[a]["heldout_excess_loss"] = r[a]["heldout_loss"] - bn[r["seed"]]["heldout"]
    metrics = ("final_loss", "entropy", "accuracy") + (("heldout_loss", "heldout_entropy", "heldout_accuracy")
                                                       if fev else ())
    metrics += tuple(m for m in ("excess_loss", "heldout_excess_loss") if m in per_seed[0][cfg.arms[0]])
    out["final"] = {a: {m: _mean_std([r[a][m] for r in per_seed]) for m in metrics} for a in cfg.arms}
    out["entropy_gap"] = {a: {"raw": _mean_std([r[a]["entropy"] - hmin for r in per_seed]),
                              "normalised": _mean_std([(r[a]["entropy"] - hmin) / (log_n - hmin) for r in per_seed])}
                          for a in cfg.arms}
    if fev:
        for a in cfg.arms:
            out["entropy_gap"][a]["heldout"] = _mean_std([r[a]["heldout_entropy"] - hmin for r in per_seed])
    if "sgd" in cfg.arms:
        thr = float(np.mean([r["sgd"]["final_loss"] for r in per_seed]))
        out["sgd_final_threshold"] = thr
        arms_steps = {}
        for a in [a for a in cfg.arms if a != "sgd"]:
            steps = [steps_to_threshold(np.asarray(r[a]["losses"]), thr) for r in per_seed]
            arms_steps[a] = steps
            key = "em_steps_to_sgd_final" if a == "em" else f"{a}_steps_to_sgd_final"
            out[key] = {**_mean_std(steps), "per_seed": steps}
            if a == "em":
                out["speedup"] = cfg.steps / max(np.mean(steps), 1e-9)
                if len(per_seed) >= 2:
                    t = stats.ttest_rel([r["em"]["final_loss"] for r in per_seed],
                                        [r["sgd"]["final_loss"] for r in per_seed])
                    out["t_test"] = {"t": float(t.statistic), "p": float(t.pvalue)}
        # one table per arm: steps to SGD's final TRAIN loss (authors' rule) and to SGD's final
        # HELD-OUT loss (on the held-out grid), final held-out loss, paired tests against em
        arms_out = {}
        hthr = float(np.mean([r["sgd"]["heldout_loss"] for r in per_seed])) if fev else None
        for a in cfg.arms:
            st = arms_steps.get(a) or [steps_to_threshold(np.asarray(r[a]["losses"]), thr) for r in per_seed]
            e = {"lrs": per_seed[0][a]["lrs"], "steps_to_target": {**_mean_std(st), "per_seed": st}}
            if fev:
                hs = [_first_below(heldout[idx[(s, name_of[a])]], hthr, cfg.steps) for s in cfg.seeds]
                e["heldout_steps_to_target"] = {**_mean_std(hs), "per_seed": hs}
                e["final_heldout_loss"] = out["final"][a]["heldout_loss"]
            arms_out[a] = e
        if "em" in cfg.arms:
            for a, e in arms_out.items():
                if a == "em":
                    continue
                e["vs_em"] = {"steps_to_target": _paired(e["steps_to_target"]["per_seed"],
                                                         arms_out["em"]["steps_to_target"]["per_seed"])}
                if fev:
                    e["vs_em"]["final_heldout_loss"] = _paired([r[a]["heldout_loss"] for r in per_seed],
                                                               [r["em"]["heldout_loss"] for r in per_seed])
        out["arms"] = arms_out
        out["heldout_threshold"] = hthr
        if cfg.sweep:
            sweep = []
            for m in cfg.sweep:
                steps = [steps_to_threshold(losses[idx[(s, f"em-x{m:g}")]], thr) for s in cfg.seeds]
                sweep.append({"mult": m, "steps_mean": float(np.mean(steps)), "steps_std": mean_std(steps)[1],
                              "per_seed": steps,
                              "final_loss": _mean_std([final["loss"][idx[(s, f"em-x{m:g}")]] for s in cfg.seeds])})
            out["value_lr_sweep"] = sweep
    return out


def geometry_summary(cfg, runs, geometry: dict[int, list[dict]], keys) -> dict:
    """Held-out geometry numbers at the first recorded step (0: the untrained head) and the last,
    mean ± std over seeds per arm, for the head outputs g and values v, beside the baseline (raw
    input x) and its partial R² / ordering null (dyntool.manifold.baseline_comparison)."""
    first, last = min(geometry), max(geometry)
    out: dict = {"steps": [first, last], "baseline": "raw input x_t (heldout_x_*)",
                 "note": "r2_partial: held-out partial R² of H_Bayes beyond x; ordering_null_*: "
                         "ordering score of PC1 with H_Bayes shuffled (200 permutations)"}
    for a in cfg.arms:
        if a == "sgd_tuned":
            continue
        ii = [i for i, (_, ar) in enumerate(runs) if ar.name == a]
        arm = {}
        for rep in ("g", "v", "x"):
            for k in keys:
                name = f"heldout_{rep}_{k}"
                if name not in geometry[last][ii[0]]:
                    continue
                arm[name] = {f"step{st}": _mean_std([geometry[st][i][name] for i in ii]) for st in (first, last)}
        out[a] = arm
    return out


def table(summary: dict) -> str:
    """A plain-text table of the study (printed by the CLI; the README quotes it)."""
    lines = [f"h_min = {summary['h_min']:.4f} nats   log n = "
             f"{summary['log_n']:.4f}   T = {summary['T']}, {summary['steps']} steps, seeds {summary['seeds']}"]
    arms = list(summary["final"])
    ho = summary.get("heldout") is not None
    head = f"{'arm':<15}{'final loss':>18}{'pred. entropy':>18}{'accuracy':>15}{'gap':>8}"
    if ho:
        head += f"{'held-out loss':>18}{'held-out acc.':>15}{'gap':>8}"
    if "arms" in summary:
        head += f"{'steps to SGD final':>22}"
    lines.append(head)
    for a in arms:
        f = summary["final"][a]
        g = summary["entropy_gap"][a]
        line = (f"{a:<15}{f['final_loss']['mean']:>10.4f} ± {f['final_loss']['std']:.4f}"
                f"{f['entropy']['mean']:>10.4f} ± {f['entropy']['std']:.4f}"
                f"{f['accuracy']['mean']:>9.3f} ± {f['accuracy']['std']:.3f}{g['raw']['mean']:>8.4f}")
        if ho:
            line += (f"{f['heldout_loss']['mean']:>10.4f} ± {f['heldout_loss']['std']:.4f}"
                     f"{f['heldout_accuracy']['mean']:>9.3f} ± {f['heldout_accuracy']['std']:.3f}"
                     f"{g['heldout']['mean']:>8.4f}")
        if "arms" in summary:
            st = summary["arms"][a]["steps_to_target"]
            line += f"{SGD_TARGET:>22}" if a == "sgd" else f"{st['mean']:>15.0f} ± {st['std']:.0f}"
        lines.append(line)
    if "bayes" in summary:
        b = summary["bayes"]
        line = f"Bayes NLL (forward filter): train {b['train_mean']['mean']:.4f}"
        if "heldout_mean" in b:
            line += f", held-out {b['heldout_mean']['mean']:.4f}"
        ex = {a: summary["final"][a].get("excess_loss", {}).get("mean") for a in arms}
        line += "; final excess train loss " + ", ".join(f"{a} {v:.4f}" for a, v in ex.items() if v is not None)
        lines.append(line)
    if "sgd_tuned" in summary:
        t = summary["sgd_tuned"]
        lines.append(f"sgd_tuned: uniform LR {t['picked_lr']:g} picked from {t['grid']} on mean final held-out loss")
    if "em_steps_to_sgd_final" in summary:
        e = summary["em_steps_to_sgd_final"]
        lines.append(f"EM-like steps to SGD's final loss: {e['mean']:.0f} ± {e['std']:.0f} "
                     f"(per seed {e['per_seed']}); speed-up {summary['speedup']:.2f}x")
    if "t_test" in summary:
        lines.append(f"paired t-test (EM vs SGD final loss): t = {summary['t_test']['t']:.3f}, "
                     f"p = {summary['t_test']['p']:.4g}")
    for a, e in summary.get("arms", {}).items():
        vs = e.get("vs_em") or {}
        parts = [f"{k.replace('_', ' ')} {v['mean_diff']:+.4g} " +
                 (f"(t = {v['t']:.2f}, p = {v['p']:.3g})" if v["t"] is not None else "(constant difference)")
                 for k, v in vs.items() if v and not (a == "sgd" and k == "steps_to_target")]
        if parts:
            lines.append(f"{a} − em, paired: " + "; ".join(parts))
    geo = summary.get("geometry")
    if geo:
        s0, s1 = geo["steps"]
        for a in [k for k in geo if k not in ("steps", "baseline", "note")]:
            g = geo[a]

            def f(name, st):
                v = g.get(name, {}).get(f"step{st}", {}).get("mean")
                return f"{v:.2f}" if v is not None and math.isfinite(v) else "nan"
            lines.append(f"{a} held-out geometry step {s0} -> {s1}: R²(H|g) {f('heldout_g_r2_linear', s0)} -> "
                         f"{f('heldout_g_r2_linear', s1)} (raw x: {f('heldout_x_r2_linear', s1)}; partial beyond x "
                         f"{f('heldout_g_r2_partial', s0)} -> {f('heldout_g_r2_partial', s1)}); ordering g "
                         f"{f('heldout_g_ordering_score', s1)} (null {f('heldout_g_ordering_null_mean', s1)}, "
                         f"p {f('heldout_g_ordering_null_p', s1)})")
    for s in summary.get("value_lr_sweep", []):
        lines.append(f"value-LR x{s['mult']:g}: steps to SGD final {s['steps_mean']:.0f} ± {s['steps_std']:.0f}")
    return "\n".join(lines)


def markdown_table(summary: dict) -> str:
    """The README's sticky table: train and held-out columns, steps to SGD's final loss per arm."""
    ho = summary.get("heldout") is not None
    head = ["arm", "LRs W_Q/W_K/W_V/W_O", "final train loss", "held-out loss", "train acc.", "held-out acc.",
            "entropy gap train / held-out", "steps to SGD final (train)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    arms = summary.get("arms", {})
    for a, f in summary["final"].items():
        g = summary["entropy_gap"][a]
        e = arms.get(a, {})
        st = e.get("steps_to_target")
        lrs = "/".join(f"{v:g}" for v in e.get("lrs", []))
        cells = [a, lrs, f"{f['final_loss']['mean']:.4f} ± {f['final_loss']['std']:.4f}",
                 f"{f['heldout_loss']['mean']:.4f} ± {f['heldout_loss']['std']:.4f}" if ho else "–",
                 f"{f['accuracy']['mean']:.3f}", f"{f['heldout_accuracy']['mean']:.3f}" if ho else "–",
                 f"{g['raw']['mean']:.3f} / {g['heldout']['mean']:.3f}" if ho else f"{g['raw']['mean']:.3f}",
                 SGD_TARGET if a == "sgd" else f"{st['mean']:.0f} ± {st['std']:.0f}" if st else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
