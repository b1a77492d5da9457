"""The atlas's event rules on series built so that the answer is known."""
import numpy as np
import pandas as pd
import pytest

from dyntool.train import atlas_events as E


def test_sustained_crossing_ignores_blips_and_uses_the_fixed_threshold():
    steps = np.arange(100)
    x = np.full(100, 0.05)
    x[10] = 0.9                                    # a one-step blip: not an event
    x[40:] = 0.5
    ev = E.head_events(steps, x, steps, np.where(steps >= 25, 1.0, -1.0), chance=0.07)
    assert ev["threshold"] == pytest.approx(max(0.3, 0.21, 0.15))
    assert ev["forward_step"] == 40 and ev["backward_step"] == 25
    assert E.head_events(steps, np.full(100, 0.05), steps, -np.ones(100), 0.07)["forward_step"] is None
    # the backward side on its own (sparser) schedule: every 10th step, hold 3 of those rows
    b = np.where(steps[::10] >= 30, 1.0, -1.0)
    b[5] = -1.0                                    # step 50 dips: the sustained run starts at 60
    assert E.head_events(steps, x, steps[::10], b, 0.07)["backward_step"] == 60
    # a head that starts high must rise 0.1 above its start
    assert E.threshold(0.45, 0.07) == pytest.approx(0.55)


def test_lag_and_its_shuffled_head_null():
    fwd = [100, 200, 300, 400, 500, 600, None, None]
    bwd = [90, 190, 290, 390, 490, 590, 0, 0]     # each head's backward moves 10 steps before its forward
    t = E.lag_test(fwd, bwd, n_perm=500)
    assert t["mean_lag"] == 10 and t["n_paired"] == 6 and t["share_backward_first"] == 1
    assert t["null_mean_abs"] > 100 and t["p"] < 0.01          # tied to its own head: evidence
    # backward events unrelated to the head (all at step 5): shuffling changes nothing, no evidence
    t = E.lag_test(fwd, [5] * 8, n_perm=500)
    assert t["share_backward_first"] == 1 and t["p"] == 1.0
    assert E.lag_test([100, None], [0, 0])["p"] is None          # one pair: no test


def test_loss_bump_is_found_when_built_in_and_not_in_a_monotone_curve():
    steps = np.arange(400)
    rng = np.random.default_rng(0)
    base = 5 * np.exp(-steps / 100) + 3 + 0.01 * rng.standard_normal(400)
    assert not E.loss_bump(steps, base)["bump"]
    bumped = base + 0.3 * np.exp(-((steps - 250) / 15.0) ** 2)
    b = E.loss_bump(steps, bumped)
    assert b["bump"] and 235 <= b["step"] <= 265


def test_steepest_fall_of_a_step_change():
    steps = np.arange(300)
    x = np.where(steps < 180, 0.0, -2.0) + 0.01 * np.random.default_rng(1).standard_normal(300)
    f = E.steepest_fall(steps, x)
    assert abs(f["step"] - 180) <= f["window"] and f["fall"] > 1.5 > f["noise"]


def test_run_events_reads_a_metrics_frame():
    n = 60
    df = pd.DataFrame({"step": np.arange(n), "loss": np.linspace(5, 3, n), "atlas_rep_gap": np.zeros(n)})
    for l in range(2):
        for h in range(2):
            df[f"atlas_first_mass/L{l}H{h}"] = np.where(np.arange(n) >= 20 + 10 * h, 0.8, 0.1) if l == 0 else 0.1
            df[f"atlas_first_adv/L{l}H{h}"] = np.where(np.arange(n) >= 5 + 10 * h, 1.0, -1.0)
            for b in ("atlas_prev_token", "atlas_induction"):
                df[f"{b}/L{l}H{h}"] = 0.05
            for b in ("atlas_prev_adv", "atlas_copy_adv"):
                df[f"{b}/L{l}H{h}"] = -1.0
    ev = E.run_events(df, {"first_mass": 0.07, "prev_token": 0.06, "induction": 0.03}, [(0, 0), (0, 1), (1, 0), (1, 1)])
    assert [ev["sink"]["heads"][k]["forward_step"] for k in ("L0H0", "L0H1", "L1H0")] == [20, 30, None]
    assert ev["sink"]["lag"]["mean_lag"] == 15 and ev["induction"]["lag"]["n_forward"] == 0


def test_run_events_reads_each_series_on_its_own_rows():
    """Forward scores every step, the gradient side every 4th: NaN rows of the sparse series do not
    break its sustained crossing, and the loss bump reads every step's loss."""
    n = 400
    steps = np.arange(n)
    df = pd.DataFrame({"step": steps, "loss": np.linspace(5, 3, n)})
    df["atlas_rep_gap"] = np.where(steps % 4 == 0, 0.0, np.nan)
    for b in ("atlas_first_mass", "atlas_prev_token", "atlas_induction"):
        df[f"{b}/L0H0"] = np.where(steps >= 50, 0.8, 0.05) if b == "atlas_prev_token" else 0.05
    for b in ("atlas_first_adv", "atlas_prev_adv", "atlas_copy_adv"):
        df[f"{b}/L0H0"] = np.where(steps % 4 == 0, np.where(steps >= 20, 1.0, -1.0), np.nan)
    ev = E.run_events(df, {"first_mass": 0.07, "prev_token": 0.06, "induction": 0.03}, [(0, 0)])
    h = ev["prev_token"]["heads"]["L0H0"]
    assert (h["forward_step"], h["backward_step"]) == (50, 20)
    assert ev["rows"] == 400 and ev["grad_rows"] == 100 and ev["loss_bump"]["window"] == 9   # 400 // 50
