"""Issue 26 part 3: paired tests, steps to 25/50/75/100 % of SGD's loss drop, checked against
independent computations (the t statistic by its formula, the Wilcoxon p by enumerating every sign
assignment, the steps by a plain loop)."""
import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

from dyntool.sims.targets import loss_targets, paired_tests, steps_to_targets, targets_markdown


def test_paired_t_and_wilcoxon_match_independent_computations():
    a = np.array([412.0, 300, 515, 290, 610, 333, 480])
    b = np.array([400.0, 260, 420, 301, 500, 250, 430])
    r = paired_tests(a, b)
    d = a - b
    t = d.mean() / (d.std(ddof=1) / math.sqrt(len(d)))
    assert r["t"] == pytest.approx(t, rel=1e-12)
    assert r["mean_diff"] == pytest.approx(d.mean()) and r["std_diff"] == pytest.approx(d.std(ddof=1))
    assert (r["n"], r["n_lower"], r["n_higher"]) == (7, 1, 6)
    # exact two-sided Wilcoxon signed-rank p: all 2^7 sign flips of the ranks of |d| (no ties here)
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    w_obs = min(ranks[d > 0].sum(), ranks[d < 0].sum())
    flips = [sum(r_ for r_, s in zip(ranks, signs) if s) for signs in itertools.product((0, 1), repeat=7)]
    tot = ranks.sum()
    p = np.mean([min(w, tot - w) <= w_obs for w in flips])
    assert r["wilcoxon_p"] == pytest.approx(p, rel=1e-9)
    assert r["wilcoxon_stat"] == w_obs
    # a constant difference has no t; fewer than two seeds or non-finite values: no test
    assert paired_tests([1, 2, 3], [0, 1, 2])["t"] is None
    assert paired_tests([1.0], [0.0]) is None and paired_tests([1, np.nan], [0, 1]) is None


def test_loss_targets_are_fractions_of_the_drop():
    t = loss_targets(2.08, 2.03, [0.25, 0.5, 0.75, 1.0])
    assert t["0.25"] == pytest.approx(2.0675) and t["0.5"] == pytest.approx(2.055)
    assert t["1"] == 2.03                                   # exactly SGD's end, not a rounded one


def test_steps_to_each_target_match_a_plain_loop():
    rng = np.random.default_rng(0)
    steps, seeds, arms = 50, [1, 2, 3], ["sgd", "em", "readout"]
    speed = {"sgd": 0.02, "em": 0.05, "readout": 0.04}
    per_seed, heldout, idx = [], [], {}
    for i, s in enumerate(seeds):
        row = {"seed": s}
        for a in arms:
            curve = 2.08 - 0.1 * (1 - np.exp(-speed[a] * np.arange(steps + 1))) + 1e-4 * rng.standard_normal(steps + 1)
            ho = [(k, float(curve[k] + 0.01)) for k in range(0, steps + 1, 5)]
            idx[(s, a)] = len(heldout)
            heldout.append(ho)
            row[a] = {"losses": curve[:steps].tolist(), "final_loss": float(curve[steps]),
                      "heldout_loss": ho[-1][1], "heldout_losses": [list(p) for p in ho]}
        per_seed.append(row)
    cfg = SimpleNamespace(target_fracs=[0.25, 0.5, 1.0], steps=steps, seeds=seeds, arms=arms)
    tg, per_arm = steps_to_targets(cfg, per_seed, heldout, idx, {a: a for a in arms})
    l0 = np.mean([r["sgd"]["losses"][0] for r in per_seed])
    l1 = np.mean([r["sgd"]["final_loss"] for r in per_seed])
    for f in (0.25, 0.5, 1.0):
        thr = l0 - f * (l0 - l1)
        assert tg["train"][f"{f:g}"] == pytest.approx(thr)
        for a in arms:
            want = []
            for r in per_seed:
                k = 0
                while k < steps and not r[a]["losses"][k] < thr:
                    k += 1
                want.append(k)
            assert per_arm[a]["train"][f"{f:g}"]["per_seed"] == want
        h0 = np.mean([r["sgd"]["heldout_losses"][0][1] for r in per_seed])
        h1 = np.mean([r["sgd"]["heldout_loss"] for r in per_seed])
        hthr = h0 - f * (h0 - h1)
        for a in arms:
            want = [next((k for k, v in heldout[idx[(s, a)]] if v < hthr), steps) for s in seeds]
            assert per_arm[a]["heldout"][f"{f:g}"]["per_seed"] == want
    # em is compared with sgd, the others with em; EM-like is faster than SGD on every seed here
    assert per_arm["em"]["train"]["0.5"]["vs_sgd"]["n_lower"] == 3
    assert "vs_em" in per_arm["readout"]["train"]["0.5"] and "vs_em" not in per_arm["em"]["train"]["0.5"]
    md = targets_markdown({"targets": tg, "seeds": seeds, "steps": steps,
                           "arms": {a: {"targets": per_arm[a]} for a in arms}})
    assert "| readout − em |" in md and "| em − sgd |" in md and "| sgd − " not in md
