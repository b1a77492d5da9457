"""Issue 10 on the sticky chain: held-out evaluation, learning-rate control arms, the graded chain,
routing drive sign and the engine's autograd self-check, endpoint-free frame–precision measures."""
import json
import math

import numpy as np
import pytest
import torch

import dyntool
from dyntool.cli import main
from dyntool.sims import single_head as engine
from dyntool.sims.diagnostics import routing_residual, step_record
from dyntool.sims.frame_precision import describe_change, interval_measures
from dyntool.sims.sticky import StickyConfig, expand_arms
from dyntool.sims.sticky_data import (HELDOUT_OFFSET, VALIDATION_OFFSET, generate, h_min, single_observation_entropy, stationary,
                                      transition_matrix)
from tests.engine_fixtures import engine_state

ARMS = "sgd,em,readout,routing,all,sgd_tuned"
SMALL = ["sim", "sticky-markov", "--T", "60", "--steps", "30", "--seeds", "42,7", "--crop", "20",
         "--record.every=10", "--record.pool=16", "--heldout_every=5", "--quiet", "--arms", ARMS, "--record_seeds=1"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("sticky-controls")
    assert main(SMALL + ["--out", str(out), "--name", "c"]) == 0
    return out / "c"


def test_heldout_sequence_differs_and_is_reproducible():
    P = transition_matrix()
    train, held, again = generate(42, 300, P=P), generate(42 + HELDOUT_OFFSET, 300, P=P), \
        generate(42 + HELDOUT_OFFSET, 300, P=P)
    assert HELDOUT_OFFSET == 10000
    assert not torch.equal(train.y, held.y) and not torch.equal(train.x, held.x)
    assert torch.equal(held.x, again.x) and torch.equal(held.y, again.y)
    assert torch.equal(train.mu, held.mu)                      # same chain, same symbol means


def test_each_control_arm_scales_exactly_the_named_learning_rates():
    lr, m = 0.01, 10.0
    assert engine.arm_lrs("sgd", lr, m) == (lr, lr, lr, lr)
    assert engine.arm_lrs("em_like", lr, m) == (lr, lr, lr * m, lr)
    assert engine.arm_lrs("readout", lr, m) == (lr, lr, lr, lr * m)
    assert engine.arm_lrs("routing", lr, m) == (lr * m, lr * m, lr, lr)
    assert engine.arm_lrs("all", lr, m) == (lr * m,) * 4
    cfg = StickyConfig(arms=ARMS.split(","), tuned_grid=[0.01, 0.03, 0.1])
    arms, grid = expand_arms(cfg)
    by = {a.name: a.lrs for a in arms}
    assert by["routing"] == (0.1, 0.1, 0.01, 0.01) and by["readout"] == (0.01, 0.01, 0.01, 0.1)
    # grid points equal to an existing uniform arm reuse it instead of training twice
    assert grid == {0.01: "sgd", 0.03: "lr0.03", 0.1: "all"}
    assert by["lr0.03"] == (0.03,) * 4


def test_study_with_controls(study):
    s = json.loads((study / "summary.json").read_text())
    ids = {r.id for r in dyntool.list_runs(study)}
    assert {"seed42-readout", "seed42-routing", "seed42-all", "seed42-lr0.03", "seed42-lr0.3"} <= ids
    # logged learning rates per run are what the arm's name says
    for rid, want in (("seed7-routing", (0.1, 0.1, 0.01, 0.01)), ("seed7-readout", (0.01, 0.01, 0.01, 0.1)),
                      ("seed7-all", (0.1,) * 4), ("seed7-em", (0.01, 0.01, 0.1, 0.01))):
        lrs = dyntool.open_run(study / rid).config["lrs"]
        assert tuple(lrs[n] for n in ("W_Q", "W_K", "W_V", "W_O")) == pytest.approx(want)
    t = s["sgd_tuned"]
    # the pick is made on the VALIDATION sequence (seed + 20000), not on the held-out one it reports
    means = t["mean_final_validation_loss"]
    assert t["picked_lr"] == pytest.approx(float(min(means, key=lambda g: means[g] if math.isfinite(means[g]) else 1e9)))
    assert "VALIDATION" in t["rule"] and set(t["mean_final_heldout_loss"]) == set(means)
    # validation loss of the 0.03 run == an independent forward of its final weights on generate(s + 20000)
    ref = []
    for seed in (42, 7):
        res = engine.train(generate(seed, 60).x[None], generate(seed, 60).y[None],
                           engine.init_weights([seed]), [(0.03,) * 4], 30)
        v = generate(seed + VALIDATION_OFFSET, 60)
        ref.append(engine.evaluate(res.weights, v.x[None], v.y[None])["loss"].item())
    assert means["0.03"] == pytest.approx(float(np.mean(ref)), rel=1e-6)
    assert means["0.03"] != pytest.approx(t["mean_final_heldout_loss"]["0.03"], rel=1e-6)
    # the recorded fact about the value learning rate is true of each run
    for rid, want in (("seed7-readout", 1.0), ("seed7-routing", 1.0), ("seed7-all", 10.0), ("seed7-em", 10.0),
                      ("seed7-sgd", 1.0)):
        c = dyntool.open_run(study / rid).config
        assert c["value_lr_mult"] == pytest.approx(want) == pytest.approx(c["lrs"]["W_V"] / c["lr"])
    # arrays on disk only for the first record_seeds seeds
    assert dyntool.open_run(study / "seed42-em").steps.size and not dyntool.open_run(study / "seed7-em").steps.size
    # steps to 25/50/75/100 % of SGD's drop, train and held-out, with paired tests against em
    assert set(s["targets"]["train"]) == {"0.25", "0.5", "0.75", "1"}
    assert s["targets"]["train"]["1"] == s["sgd_final_threshold"]
    assert s["arms"]["readout"]["targets"]["train"]["1"]["per_seed"] == s["arms"]["readout"]["steps_to_target"]["per_seed"]
    for row in s["per_seed"]:
        assert row["sgd_tuned"]["lrs"] == [t["picked_lr"]] * 4
    for a in ARMS.split(","):
        e = s["arms"][a]
        assert len(e["steps_to_target"]["per_seed"]) == 2 and "final_heldout_loss" in e
        if a != "em":
            assert "vs_em" in e
    # held-out metrics: logged every 5 steps and at the end, equal to an independent evaluation
    run = dyntool.open_run(study / "seed42-em")
    ho = run.metrics[["step", "heldout_loss"]].dropna()
    assert list(ho.step) == list(range(0, 31, 5))
    row = s["per_seed"][0]["em"]
    assert row["heldout_loss"] == pytest.approx(ho.heldout_loss.iloc[-1], rel=1e-9)
    assert row["heldout_loss"] != pytest.approx(row["final_loss"], rel=1e-6)


def test_heldout_metrics_match_an_independent_forward():
    """Held-out loss of the final weights == plain torch cross-entropy of those weights."""
    T = 80
    d, h = generate(3, T), generate(3 + HELDOUT_OFFSET, T)
    W = engine.init_weights([3], dtype=torch.float64)
    res = engine.train(d.x[None].double(), d.y[None], W, [engine.arm_lrs("em_like")], 7,
                       eval_x=h.x[None].double(), eval_y=h.y[None], eval_steps={0})
    Wf = res.weights
    x = h.x.double()
    s = (x @ Wf.W_Q[0]) @ (x @ Wf.W_K[0]).T / math.sqrt(10)
    s = s.masked_fill(~torch.ones(T - 1, T - 1, dtype=torch.bool).tril(), float("-inf"))
    logits = torch.softmax(s, -1) @ (x @ Wf.W_V[0]) @ Wf.W_O[0]
    ref = torch.nn.functional.cross_entropy(logits, h.y)
    assert res.final_eval["loss"][0].item() == pytest.approx(ref.item(), rel=1e-10)


def test_a_diverging_grid_run_does_not_stop_the_others():
    d = generate(1, 60)
    x, y = d.x[None].repeat(2, 1, 1).double(), d.y[None].repeat(2, 1)
    W = engine.init_weights([1, 1], dtype=torch.float64)
    res = engine.train(x, y, W, [(0.01,) * 4, (1e5,) * 4], 20, check_finite=torch.tensor([True, False]))
    assert torch.isfinite(res.losses[0]).all() and torch.isnan(res.final["loss"][1])
    with pytest.raises(engine.NonFiniteLoss):
        engine.train(x, y, W, [(0.01,) * 4, (1e5,) * 4], 20)


def test_routing_drive_is_the_attention_variance_of_b_and_non_negative():
    st = engine_state()
    _, diag, _ = step_record(st, (0, 31), (0, 31), 0, torch.zeros(2, 31, dtype=torch.long),
                             torch.rand(2, 31, dtype=torch.float64), 1.8)
    w = st.row_block(0, 31, ("attn", "compat"))
    a, b = w["attn"], w["compat"]
    e = (a * b).sum(-1, keepdim=True)
    var = (a * (b - e) ** 2).sum(-1).sum(-1) / 31            # mean_i Var_{α_i}(b), independent formula
    torch.testing.assert_close(diag["diag_routing_drive"], var)
    assert (diag["diag_routing_drive"] > 0).all()          # the old code recorded −Var: this fails on it


def test_engine_score_gradient_checks_itself_against_autograd():
    st = engine_state()
    r = routing_residual(st, 5, 31)
    assert (r < 1e-10).all()                                # float64: closed form == autograd
    st.upstream = st.upstream * 1.01                                      # a wrong upstream gradient is caught
    assert (routing_residual(st, 5, 31) > 1e-3).all()


def test_graded_chain_spreads_the_bayes_entropy():
    P = transition_matrix(8, construction="graded", rho_range=(0.05, 0.9))
    np.testing.assert_allclose(P.sum(1).numpy(), 1, atol=1e-6)
    np.testing.assert_allclose(P.diagonal().numpy(), np.linspace(0.05, 0.9, 8), atol=1e-6)
    rows = -(P.double() * torch.log(P.double())).sum(1)
    assert rows.max() - rows.min() > 0.5                     # rows of different entropy
    pi = stationary(P)
    torch.testing.assert_close(pi @ P.double(), pi)
    assert h_min(P, pi) == pytest.approx(float((pi * rows).sum()), rel=1e-9)
    H = {}
    for noise in (1.0, 2.0):
        d = generate(42, 1000, P=P, noise_std=noise)
        H[noise] = single_observation_entropy(d.x, d.mu, P, noise, pi)
    base = single_observation_entropy(generate(42, 1000).x, generate(42, 1000).mu, transition_matrix())
    assert H[2.0].std() > 10 * base.std()
    # noise_std = 1 leaves the authors' data bit-identical
    assert torch.equal(generate(42, 200).x, generate(42, 200, noise_std=1.0).x)


def test_bayes_entropy_with_noise_and_prior_matches_brute_force():
    P = transition_matrix(4, construction="graded", rho_range=(0.1, 0.8))
    pi = stationary(P).numpy()
    d = generate(5, 50, n=4, d_x=3, P=P, noise_std=1.7)
    x, mu = d.x.double().numpy(), d.mu.double().numpy()
    lik = np.exp(-((x[:, None] - mu[None]) ** 2).sum(-1) / (2 * 1.7 ** 2)) * pi[None]
    pred = (lik / lik.sum(1, keepdims=True)) @ P.double().numpy()
    ref = -(pred * np.log(pred)).sum(1)
    np.testing.assert_allclose(single_observation_entropy(d.x, d.mu, P, 1.7, stationary(P)).numpy(), ref,
                               rtol=1e-10)


def test_interval_measures_are_endpoint_free():
    steps = np.array([0, 10, 30])
    A = np.array([[[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.0, 1.0]]])
    V = np.array([[[1.0, 0.0]], [[2.0, 0.0]], [[2.0, 0.0]]])
    df = interval_measures(steps, attn=A, values=V, grad_sq={"routing": np.array([1.0, 1, 3]),
                                                             "values": np.array([1.0, 3, 1])})
    assert list(df.step) == [10, 30] and list(df.interval) == [10, 20]
    assert df.attn_drift.iloc[0] == 0
    # row 2: p = (.5,.5), q = (0,1), m = (.25,.75): JS = ½KL(p‖m) + ½KL(q‖m)
    jsr = 0.5 * (0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)) + 0.5 * math.log(1 / 0.75)
    assert df.attn_drift.iloc[1] == pytest.approx(jsr / 2 / 20)   # mean over 2 rows, per step
    assert df.value_drift.tolist() == pytest.approx([1.0 / 10, 0.0])
    assert df.share_routing.tolist() == pytest.approx([0.25, 0.75])
    # appending a later state changes no earlier row (no final-state reference)
    df2 = interval_measures(steps[:2], attn=A[:2], values=V[:2])
    assert df2.attn_drift.iloc[0] == df.attn_drift.iloc[0] and df2.value_drift.iloc[0] == df.value_drift.iloc[0]
    assert describe_change([0, 5], [0.19, 0.85], "routing share") == \
        "routing share rose from 0.19 (step 0) to 0.85 (step 5)"


def test_study_figures_pick_the_seeds_that_recorded_arrays(study):
    """Arrays exist for seed 42 only (record_seeds=1) while seed 7 is the smallest seed of every
    arm: F5/F6 must show seed 42's recorded runs instead of failing on seed 7's empty ones, and F7
    draws its drifts from the recorded runs and its η-weighted shares from every seed."""
    from dyntool.figures import FIGURES, render
    runs = dyntool.list_runs(study)
    for name in ("f5_attention", "f6_value_pca"):
        fig, data, caption = render(FIGURES[name], runs)
        seeds = ({d["seed"] for d in data["arms"].values()} if name == "f5_attention" else
                 {d["seed"] for d in data["runs"]})
        assert 42 in seeds and caption
    fig, long, caption = render(FIGURES["f7_frame_precision"], runs)
    drift, share = long[long.table == "drift"], long[long.table == "share"]
    assert set(drift.seed) == {42} and set(share.seed) == {42, 7} and set(share.arm) == {"sgd", "em"}
    assert "η_p‖∂L/∂W_p‖²" in caption and "2 seeds" not in caption.split("(c)")[0]
