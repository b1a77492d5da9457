"""The sticky-chain study runner: outputs, recording, bad input."""
import json
import math

import numpy as np
import pytest
import torch

import dyntool
from dyntool.cli import main
from dyntool.quantities import head_quantities
from dyntool.sims import single_head as engine
from dyntool.sims.diagnostics import step_record
from dyntool.sims.sticky_data import filter_entropy, filter_nll, generate, transition_matrix

SMALL = ["sim", "sticky-markov", "--T", "60", "--steps", "25", "--seeds", "42,7", "--crop", "20",
         "--record.every=10", "--record.pool=16", "--quiet"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("sticky")
    assert main(SMALL + ["--out", str(out), "--name", "s"]) == 0
    return out / "s"


def test_study_layout_and_summary(study):
    s = json.loads((study / "summary.json").read_text())
    assert abs(s["h_min"] - 1.8292) < 1e-4
    assert [r["seed"] for r in s["per_seed"]] == [42, 7]
    for key in ("em_steps_to_sgd_final", "speedup", "t_test", "entropy_gap", "final"):
        assert key in s
    # the Bayes reference is the forward filter's NLL on each seed's own train / held-out sequence
    for b in s["bayes"]["per_seed"]:
        for part, sd in (("train", b["seed"]), ("heldout", b["seed"] + 10000)):
            d = generate(sd, 60)
            assert b[part] == pytest.approx(float(filter_nll(d.x, d.mu, transition_matrix(), d.y).mean()), rel=1e-12)
    # every geometry number comes with its step-0 value, the raw-input baseline, partial R², null
    geo = s["geometry"]
    assert geo["steps"] == [0, 25]
    for name in ("heldout_g_r2_linear", "heldout_g_r2_partial", "heldout_g_ordering_null_p", "heldout_x_r2_linear",
                 "heldout_v_r2_partial", "heldout_g_r_pc1"):
        assert set(geo["em"][name]) == {"step0", "step25"}
    logged = [dyntool.open_run(study / f"seed{sd}-em").metrics.set_index("step") for sd in (42, 7)]
    assert geo["em"]["heldout_g_r2_partial"]["step25"]["mean"] == pytest.approx(
        np.mean([m.loc[25, "heldout_g_r2_partial"] for m in logged]))
    m = logged[0]
    # the baseline is the raw input: the same at every recorded step
    assert m.loc[0, "heldout_x_r2_linear"] == m.loc[25, "heldout_x_r2_linear"]
    p = m.loc[25, "heldout_g_ordering_null_p"]          # NaN when < 2 entropy bins hold > 5 rows (T = 60)
    assert np.isnan(p) == np.isnan(m.loc[25, "heldout_g_ordering_score"]) and (np.isnan(p) or 0 < p <= 1)
    r0 = s["per_seed"][0]
    assert r0["em"]["excess_loss"] == pytest.approx(r0["em"]["final_loss"] - s["bayes"]["per_seed"][0]["train"])
    runs = {r.id: r for r in dyntool.list_runs(study)}
    assert set(runs) == {"seed42-sgd", "seed42-em", "seed7-sgd", "seed7-em"}
    for rid, run in runs.items():
        assert run.status == "finished" and run.kind == "sticky-markov"
        seed, arm = rid[4:].split("-")
        row = next(r for r in s["per_seed"] if r["seed"] == int(seed))[arm]
        # the summary's loss curve is the logged one (loss before each update)
        np.testing.assert_allclose(run.metrics["loss"].to_numpy()[:25], row["losses"], rtol=1e-12)
        assert run.meta["final"]["final_loss"] == pytest.approx(row["final_loss"])
        # speed-up rule: first k with EM loss below the seed-mean SGD final loss
    thr = np.mean([r["sgd"]["final_loss"] for r in s["per_seed"]])
    for r, k in zip(s["per_seed"], s["em_steps_to_sgd_final"]["per_seed"]):
        below = np.nonzero(np.asarray(r["em"]["losses"]) < thr)[0]
        assert k == (below[0] if below.size else 25)


def test_recorded_arrays(study):
    run = dyntool.open_run(study / "seed42-em")
    a = run.arrays
    assert list(run.steps) == [0, 10, 20, 25]                  # every 10 + the final state
    assert a["attn"].shape == (4, 1, 1, 1, 20, 20)
    assert a["attn"].attrs["query_offset"] == 39
    assert a["attn_pooled"].shape == (4, 1, 1, 1, 4, 4)
    assert a["values"].shape == (4, 1, 1, 1, 59, 15)
    d = generate(42, 60)
    np.testing.assert_array_equal(run.static("targets"), d.y.numpy())
    Hb = filter_entropy(d.x, d.mu, transition_matrix())        # H_Bayes = the forward filter's
    np.testing.assert_allclose(run.static("bayes_entropy"), Hb.numpy(), rtol=1e-6)
    assert not np.isnan(run.metrics.loc[run.metrics.step == 10, "diag_attn_entropy"]).any()


def test_step_record_matches_autograd_verified_formulas():
    """The chunked closed-form recorder equals head_quantities (itself checked against autograd)."""
    torch.manual_seed(0)
    N, R = 37, 2
    x = torch.randn(R, N, 20, dtype=torch.float64)
    y = torch.randint(8, (R, N))
    W = engine.init_weights([1, 2], dtype=torch.float64)
    got = {}

    def on_step(step, state):
        per_run, diag, _ = step_record(state, (10, 30), (5, 25), 8, torch.zeros(R, N, dtype=torch.long),
                                       torch.rand(R, N, dtype=torch.float64), 1.8, chunk=16)
        got.update(state=state, per_run=per_run, diag=diag)

    engine.train(x, y, W, torch.full((R, 4), 0.01), 1, on_step=on_step, record_steps={0})
    st = got["state"]
    allowed = torch.ones(N, N, dtype=torch.bool).tril()
    for r in range(R):
        ref = head_quantities(st.queries[r], st.keys[r], st.values[r], st.upstream[r], allowed)
        rec = {k: (v[0, 0, 0] if v.dim() > 2 else v) for k, v in got["per_run"][r].items()}
        for name in ("attn", "compat", "advantage", "score_grad"):
            torch.testing.assert_close(rec[name], ref[name][10:30, 5:25], rtol=1e-9, atol=1e-12, msg=name)
        for name in ("value_grad", "query_grad", "key_grad", "attn_entropy", "column_usage", "expected_compat"):
            torch.testing.assert_close(rec[name], ref[name], rtol=1e-9, atol=1e-12, msg=name)
        torch.testing.assert_close(rec["logit_max"].double().squeeze(), ref["logit_max"], rtol=1e-6, atol=0)
        # pooled = mean over visible entries of each 8×8 block
        blk = ref["attn"][:8, :8]
        vis = allowed[:8, :8]
        assert rec["attn_pooled"][0, 0].item() == pytest.approx((blk * vis).sum().item() / vis.sum().item())
    assert got["diag"]["diag_same_symbol_mass"].allclose(torch.ones(R, dtype=torch.float64))


@pytest.mark.parametrize("argv,needle,code", [
    (["--T", "1"], "T: must be >= 2", 2),
    (["--arms", "sgd,bogus"], "unknown arm", 2),
    (["--seeds", ","], "at least one seed", 2),
    (["--steps", "0"], "steps", 2),
])
def test_bad_input(tmp_path, capsys, argv, needle, code):
    assert main(["sim", "sticky-markov", "--out", str(tmp_path), "--quiet"] + argv) == code
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_non_finite_loss_fails_cleanly_and_keeps_records(tmp_path, capsys):
    code = main(["sim", "sticky-markov", "--T", "40", "--steps", "60", "--seeds", "1", "--lr", "1e4",
                 "--record.every=1", "--record.chunk_steps=2", "--crop", "10", "--out", str(tmp_path),
                 "--name", "nan", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 3 and "non-finite loss" in err and len(err.splitlines()) == 1
    for run in dyntool.list_runs(tmp_path / "nan"):
        assert run.status == "failed"
        n = run.steps_written
        assert n >= 1 and not np.isnan(run.arrays["attn"][:n]).any()
        assert math.isfinite(run.metrics["loss"].iloc[0])


def test_value_lr_sweep_and_closed_form_arm(tmp_path):
    assert main(["sim", "sticky-markov", "--T", "50", "--steps", "30", "--seeds", "1,2", "--crop", "10",
                 "--arms", "sgd,em,em_closed_form", "--sweep", "1,10", "--record.every=15",
                 "--out", str(tmp_path), "--name", "w", "--quiet"]) == 0
    s = json.loads((tmp_path / "w" / "summary.json").read_text())
    sweep = {e["mult"]: e for e in s["value_lr_sweep"]}
    assert set(sweep) == {1.0, 10.0}
    # the ×10 sweep arm is the EM-like arm itself (same seeds, same schedule)
    assert sweep[10.0]["per_seed"] == s["em_steps_to_sgd_final"]["per_seed"]
    # ×1 is plain SGD: it reaches SGD's mean final loss no earlier than the last step of some seed
    assert max(sweep[1.0]["per_seed"]) >= 29
    assert "em_closed_form_steps_to_sgd_final" in s
    ids = {r.id for r in dyntool.list_runs(tmp_path / "w")}
    assert {"seed1-em-x1", "seed1-em_closed_form"} <= ids
    assert dyntool.open_run(tmp_path / "w" / "seed1-em-x1").steps_written == 0     # sweep runs log losses only
