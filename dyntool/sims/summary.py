"""The sticky-chain study's ``summary.json`` and printed table (arXiv 2512.22473: sticky Markov-chain task and the numbers to reproduce)."""
from __future__ import annotations

import math

import numpy as np

from ..record import metric_names as mn
from ..stats import mean_std
from .targets import first_below, paired_tests, seed_mean_std, steps_to_targets, steps_to_threshold, targets_markdown


# SGD's mean final training loss IS the target, so its own "steps to target" only restates the budget
SGD_TARGET = "(sets the target)"


def summarise(cfg, runs, result, hmin: float, heldout=None, grid=None, bayes=None, validation=None) -> dict:
    """``heldout``: per run [(step, held-out loss)]; ``grid``: sgd_tuned grid LR -> run name;
    ``bayes``: the forward filter's Bayes NLL per seed (train / held-out) and H_Bayes spread;
    ``validation``: (R,) final loss on the validation sequences, on which sgd_tuned picks (without
    it, the pick falls back to the held-out loss and the rule says so)."""
    fev = {k: v.numpy() for k, v in (result.final_eval or {}).items()}
    idx = {(seed, a.name): i for i, (seed, a) in enumerate(runs)}
    out = _header(cfg, hmin, fev)
    name_of = {a: a for a in cfg.arms}                 # arm -> the run name that holds it
    if grid:
        out["sgd_tuned"] = _pick_tuned(cfg, grid, idx, validation, fev)
        name_of["sgd_tuned"] = out["sgd_tuned"]["picked_run"]
    per_seed = _per_seed(cfg, runs, result, idx, name_of, fev, heldout)
    out["per_seed"] = per_seed
    if bayes:
        out["bayes"] = _bayes_excess(cfg, bayes, per_seed, fev)
    out["final"], out["entropy_gap"] = _finals(cfg, per_seed, hmin, out["log_n"], fev)
    if "sgd" in cfg.arms:
        _against_sgd(out, cfg, runs, result, per_seed, idx, name_of, fev, heldout)
    return out


def _header(cfg, hmin: float, fev: dict) -> dict:
    return {"h_min": hmin, "log_n": math.log(cfg.n_symbols), "steps": cfg.steps, "T": cfg.T,
            "seeds": list(cfg.seeds), "construction": cfg.construction, "noise_std": cfg.noise_std,
            "heldout": ({"offset": cfg.heldout_offset, "every": cfg.heldout_every,
                         "rule": "seed s is evaluated on generate(s + offset): same chain and symbol "
                                 "means, another path and noise"} if fev else None),
            "std": "sample (ddof = 1) over seeds"}


def _pick_tuned(cfg, grid: dict, idx: dict, validation, fev: dict) -> dict:
    """sgd_tuned: the grid LR with the lowest mean final validation loss (else held-out loss)."""
    def mean_of(vals):
        return {g: float(np.mean([vals[idx[(s, n)]] for s in cfg.seeds])) for g, n in grid.items()}
    on_val = validation is not None
    pick_on = mean_of(np.asarray(validation) if on_val else fev["loss"])
    finite = {g: v for g, v in pick_on.items() if math.isfinite(v)}
    pick = min(finite, key=finite.get)
    out = {"grid": [float(g) for g in grid], "picked_lr": float(pick), "picked_run": grid[pick],
           "rule": ("lowest mean final VALIDATION loss over seeds (sequence seed + "
                    f"{cfg.validation_offset}); the held-out sequence only reports" if on_val else
                    "lowest mean final held-out loss over seeds (no validation sequence: "
                    "the held-out numbers of sgd_tuned are optimistic)"),
           "mean_final_heldout_loss": {f"{g:g}": v for g, v in mean_of(fev["loss"]).items()} if fev else None}
    if on_val:
        out["mean_final_validation_loss"] = {f"{g:g}": v for g, v in pick_on.items()}
    return out


def _per_seed(cfg, runs, result, idx: dict, name_of: dict, fev: dict, heldout) -> list[dict]:
    """Per seed, per arm: final loss / entropy / accuracy, the loss curve, LRs and run name."""
    losses = result.losses.numpy()
    final = {k: v.numpy() for k, v in result.final.items()}
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
    return per_seed


def _bayes_excess(cfg, bayes: dict, per_seed: list[dict], fev: dict) -> dict:
    """The Bayes NLL means; adds each run's excess loss over it to ``per_seed`` (in place)."""
    # excess loss over the Bayes-optimal causal predictor (forward filter), per arm; the
    # minimum achievable loss, unlike H_min, which assumes y_{t−1} is observed exactly
    bn = {r["seed"]: r for r in bayes["per_seed"]}
    out = {**bayes, "train_mean": seed_mean_std([bn[s]["train"] for s in cfg.seeds])}
    if fev:
        out["heldout_mean"] = seed_mean_std([bn[s]["heldout"] for s in cfg.seeds])
    for r in per_seed:
        for a in cfg.arms:
            r[a]["excess_loss"] = r[a]["final_loss"] - bn[r["seed"]]["train"]
            if fev:
                r[a]["heldout_excess_loss"] = r[a]["heldout_loss"] - bn[r["seed"]]["heldout"]
    return out


def _finals(cfg, per_seed: list[dict], hmin: float, log_n: float, fev: dict) -> tuple[dict, dict]:
    """Final metrics and entropy gaps per arm, mean ± std over seeds."""
    metrics = ("final_loss", "entropy", "accuracy") + (("heldout_loss", "heldout_entropy", "heldout_accuracy")
                                                       if fev else ())
    metrics += tuple(m for m in ("excess_loss", "heldout_excess_loss") if m in per_seed[0][cfg.arms[0]])
    final = {a: {m: seed_mean_std([r[a][m] for r in per_seed]) for m in metrics} for a in cfg.arms}
    gap = {a: {"raw": seed_mean_std([r[a]["entropy"] - hmin for r in per_seed]),
               "normalised": seed_mean_std([(r[a]["entropy"] - hmin) / (log_n - hmin) for r in per_seed])}
           for a in cfg.arms}
    if fev:
        for a in cfg.arms:
            gap[a]["heldout"] = seed_mean_std([r[a]["heldout_entropy"] - hmin for r in per_seed])
    return final, gap


def _against_sgd(out: dict, cfg, runs, result, per_seed, idx, name_of, fev, heldout) -> None:
    """Everything measured against SGD's final loss, added to ``out`` in this order: the
    threshold, steps to it per arm (EM-like: speed-up, sentence, t-test), the per-arm table with
    paired tests against em, the loss-drop targets, the value-LR sweep."""
    thr = float(np.mean([r["sgd"]["final_loss"] for r in per_seed]))
    out["sgd_final_threshold"] = thr
    arms_steps = _steps_to_sgd_final(out, cfg, per_seed, thr)
    arms_out, hthr = _arm_table(out, cfg, per_seed, idx, name_of, fev, heldout, thr, arms_steps)
    out["targets"], per_target = steps_to_targets(cfg, per_seed, heldout if fev else None, idx, name_of)
    for a, e in arms_out.items():
        e["targets"] = per_target[a]
    out["arms"] = arms_out
    out["heldout_threshold"] = hthr
    if cfg.sweep:
        out["value_lr_sweep"] = _sweep(cfg, result, idx, thr)


def _steps_to_sgd_final(out: dict, cfg, per_seed: list[dict], thr: float) -> dict[str, list[int]]:
    """Per arm but sgd: steps to SGD's mean final training loss (the authors' rule), into ``out``."""
    from scipy import stats
    arms_steps = {}
    for a in [a for a in cfg.arms if a != "sgd"]:
        steps = [steps_to_threshold(np.asarray(r[a]["losses"]), thr) for r in per_seed]
        arms_steps[a] = steps
        key = "em_steps_to_sgd_final" if a == "em" else f"{a}_steps_to_sgd_final"
        out[key] = {**seed_mean_std(steps), "per_seed": steps}
        if a != "em":
            continue
        # budget-dependent (it grows with the budget): kept for old readers, not printed; say
        # "EM-like reaches SGD's step-<steps> loss at step N" instead (em_reaches_sgd_final)
        out["speedup"] = cfg.steps / max(np.mean(steps), 1e-9)
        m, sd = mean_std(steps)
        out["em_reaches_sgd_final"] = (
            f"EM-like reaches SGD's step-{cfg.steps} training loss ({thr:.4f} nats, mean over "
            f"{len(per_seed)} seeds) at step {m:.0f} ± {sd:.0f} (per seed {steps}; "
            f"{sum(v >= cfg.steps for v in steps)} not within {cfg.steps} steps)")
        if len(per_seed) >= 2:
            t = stats.ttest_rel([r["em"]["final_loss"] for r in per_seed],
                                [r["sgd"]["final_loss"] for r in per_seed])
            out["t_test"] = {"t": float(t.statistic), "p": float(t.pvalue)}
    return arms_steps


def _arm_table(out, cfg, per_seed, idx, name_of, fev, heldout, thr, arms_steps) -> tuple[dict, float | None]:
    """One entry per arm: steps to SGD's final TRAIN loss (authors' rule) and to SGD's final
    HELD-OUT loss (on the held-out grid), final held-out loss, paired tests against em;
    -> (entries, SGD's mean final held-out loss or None)."""
    arms_out = {}
    hthr = float(np.mean([r["sgd"]["heldout_loss"] for r in per_seed])) if fev else None
    for a in cfg.arms:
        st = arms_steps.get(a) or [steps_to_threshold(np.asarray(r[a]["losses"]), thr) for r in per_seed]
        e = {"lrs": per_seed[0][a]["lrs"], "steps_to_target": {**seed_mean_std(st), "per_seed": st}}
        if fev:
            hs = [first_below(heldout[idx[(s, name_of[a])]], hthr, cfg.steps) for s in cfg.seeds]
            e["heldout_steps_to_target"] = {**seed_mean_std(hs), "per_seed": hs}
            e["final_heldout_loss"] = out["final"][a]["heldout_loss"]
        arms_out[a] = e
    if "em" in cfg.arms:
        for a, e in arms_out.items():
            if a == "em":
                continue
            e["vs_em"] = {"steps_to_target": paired_tests(e["steps_to_target"]["per_seed"],
                                                     arms_out["em"]["steps_to_target"]["per_seed"])}
            if fev:
                e["vs_em"]["final_heldout_loss"] = paired_tests([r[a]["heldout_loss"] for r in per_seed],
                                                           [r["em"]["heldout_loss"] for r in per_seed])
    return arms_out, hthr


def _sweep(cfg, result, idx: dict, thr: float) -> list[dict]:
    """The value-LR sweep runs (``em-x{m}``): steps to SGD's final loss and final loss per multiplier."""
    losses = result.losses.numpy()
    final_loss = result.final["loss"].numpy()
    sweep = []
    for m in cfg.sweep:
        ii = [idx[(s, f"em-x{m:g}")] for s in cfg.seeds]
        steps = [steps_to_threshold(losses[i], thr) for i in ii]
        sweep.append({"mult": m, "steps_mean": float(np.mean(steps)), "steps_std": mean_std(steps)[1],
                      "per_seed": steps, "final_loss": seed_mean_std([final_loss[i] for i in ii])})
    return sweep


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
                name = mn.sticky_manifold(rep, k)
                if name not in geometry[last][ii[0]]:
                    continue
                arm[name] = {f"step{st}": seed_mean_std([geometry[st][i][name] for i in ii]) for st in (first, last)}
        out[a] = arm
    return out


def table(summary: dict) -> str:
    """A plain-text table of the study (printed by the CLI; the README quotes it)."""
    lines = [f"h_min = {summary['h_min']:.4f} nats   log n = "
             f"{summary['log_n']:.4f}   T = {summary['T']}, {summary['steps']} steps, seeds {summary['seeds']}"]
    lines += _arm_rows(summary)
    lines += _bayes_and_tests(summary)
    if summary.get("geometry"):
        lines += _geometry_lines(summary["geometry"])
    for s in summary.get("value_lr_sweep", []):
        lines.append(f"value-LR x{s['mult']:g}: steps to SGD final {s['steps_mean']:.0f} ± {s['steps_std']:.0f}")
    if "targets" in summary:
        lines += ["", targets_markdown(summary)]
    return "\n".join(lines)


def _arm_rows(summary: dict) -> list[str]:
    """The header and one line per arm: final metrics, held-out metrics, steps to SGD's final loss."""
    ho = summary.get("heldout") is not None
    head = f"{'arm':<15}{'final loss':>18}{'pred. entropy':>18}{'accuracy':>15}{'gap':>8}"
    if ho:
        head += f"{'held-out loss':>18}{'held-out acc.':>15}{'gap':>8}"
    if "arms" in summary:
        head += f"{'steps to SGD final':>22}"
    lines = [head]
    for a in summary["final"]:
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
    return lines


def _bayes_and_tests(summary: dict) -> list[str]:
    """Bayes NLL and excess losses, the sgd_tuned pick, EM-like's steps to SGD's final loss, the
    t-test, and each arm's paired differences against em."""
    lines = []
    if "bayes" in summary:
        b = summary["bayes"]
        line = f"Bayes NLL (forward filter): train {b['train_mean']['mean']:.4f}"
        if "heldout_mean" in b:
            line += f", held-out {b['heldout_mean']['mean']:.4f}"
        ex = {a: summary["final"][a].get("excess_loss", {}).get("mean") for a in summary["final"]}
        line += "; final excess train loss " + ", ".join(f"{a} {v:.4f}" for a, v in ex.items() if v is not None)
        lines.append(line)
    if "sgd_tuned" in summary:
        t = summary["sgd_tuned"]
        lines.append(f"sgd_tuned: uniform LR {t['picked_lr']:g} picked from {t['grid']}: {t['rule']}")
    if "em_steps_to_sgd_final" in summary:
        e = summary["em_steps_to_sgd_final"]
        lines.append(summary.get("em_reaches_sgd_final") or
                     f"EM-like steps to SGD's final loss: {e['mean']:.0f} ± {e['std']:.0f} (per seed {e['per_seed']})")
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
    return lines


def _geometry_lines(geo: dict) -> list[str]:
    """Per arm: held-out R²(H | g) and ordering score from the first to the last recorded step."""
    s0, s1 = geo["steps"]
    lines = []
    for a in [k for k in geo if k not in ("steps", "baseline", "note")]:
        g = geo[a]

        def f(name, st):
            v = g.get(name, {}).get(f"step{st}", {}).get("mean")
            return f"{v:.2f}" if v is not None and math.isfinite(v) else "nan"
        out_g = lambda stat, st: f(mn.sticky_manifold("g", stat), st)         # noqa: E731
        lines.append(f"{a} held-out geometry step {s0} -> {s1}: R²(H|g) {out_g('r2_linear', s0)} -> "
                     f"{out_g('r2_linear', s1)} (raw x: {f(mn.sticky_manifold('x', 'r2_linear'), s1)}; partial beyond x "
                     f"{out_g(mn.R2_PARTIAL, s0)} -> {out_g(mn.R2_PARTIAL, s1)}); ordering g "
                     f"{out_g('ordering_score', s1)} (null {out_g(mn.ORDERING_NULL_MEAN, s1)}, "
                     f"p {out_g(mn.ORDERING_NULL_P, s1)})")
    return lines


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
