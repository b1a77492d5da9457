"""``dyntool sim bijection`` end to end on a tiny config, and the analysis path against the forward."""
import json
import math

import numpy as np
import pytest
import torch

import dyntool
from dyntool.capture import Capture
from dyntool.cli import main
from dyntool.sims import bijection_data as data
from dyntool.sims.bijection import BijectionConfig, BijectionModel, build_model
from dyntool.sims.bijection_analysis import Tap, analyze, evaluate, value_loss

CI = ["sim", "bijection", "--config", "bijection", "--preset", "ci", "--quiet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bij")
    assert main(CI + ["--out", str(out), "--name", "r"]) == 0
    return dyntool.open_run(out / "r")


def test_threads_setting_is_restored(tmp_path):
    before = torch.get_num_threads()
    assert main(CI + ["--out", str(tmp_path), "--steps=2", "--threads=3"]) == 0
    assert torch.get_num_threads() == before


def test_run_layout_metrics_and_record(run):
    assert run.kind == "bijection" and run.status == "finished"
    assert run.config["model"]["n_layer"] == 2 and run.meta["git_commit"] is not None
    df = run.metrics
    rec = df.dropna(subset=["manifold/resid/L1/pc1_share"])
    assert list(rec["step"]) == [0, 6, 11]                        # the record schedule
    for col in ("heldout/loss", "heldout/entropy_mae_bits", "key_orth/ctx/L0", "key_orth/vocab/L1",
                "attn_entropy/L1", "manifold/g/L0/r_pc1", "manifold/resid/L1/ordering_score",
                "attn_entropy/reduction_last_vs_L0"):
        assert col in df.columns
    assert ((rec["manifold/resid/L1/pc1_share"] > 0) & (rec["manifold/resid/L1/pc1_share"] <= 1)).all()
    a = run.arrays
    assert a["attn"].shape == (3, 2, 2, 2, 39, 39)                 # step, layer, head, seq, q, k
    assert a["bij_pcs_resid"].shape == (3, 2, 4 * 19, 2) and a["bij_model_entropy"].shape == (3, 20)
    assert np.allclose(run.static("bayes_entropy_target"), data.bayes_entropy(20, 19))
    per_pos = run.static("bayes_entropy")                         # per sequence position (app)
    assert per_pos.shape == (39,) and np.isnan(per_pos[1::2][:19]).all()
    assert np.allclose(per_pos[data.target_positions(19)], data.bayes_entropy(20, 19))
    assert np.allclose(np.exp(run.static("point_entropy")), 20 - run.static("point_k") + 1)
    assert run.meta["final"]["bayes_loss"] == pytest.approx(np.mean(data.bayes_entropy(20, 19)))


def test_geometry_comes_with_baselines_and_step0(run):
    """H_Bayes at the key positions is log(V − k + 1): a position one-hot explains it exactly, so the
    residual's R² is compared with 1, its partial R² beyond position is undefined (NaN), and the
    ordering score has its permutation null."""
    rec = run.metrics.dropna(subset=["manifold/resid/L1/pc1_share"]).set_index("step")
    assert (rec["manifold/pos_onehot/r2_linear"] > 1 - 1e-9).all()
    assert rec["manifold/resid/L1/r2_partial"].isna().all()
    p = rec["manifold/resid/L1/ordering_null_p"]
    assert ((p > 0) & (p <= 1)).all() and (rec["manifold/g/L0/ordering_null_mean"].between(0, 1)).all()
    geo = run.meta["final"]["geometry"]
    assert geo["steps"] == [0, 11]
    for st in (0, 11):
        assert geo[f"step{st}"]["manifold/resid/L1/r2_linear"] == pytest.approx(rec.loc[st, "manifold/resid/L1/r2_linear"])
        assert geo[f"step{st}"]["manifold/pos_onehot/r2_linear"] == pytest.approx(1.0)


def test_paper_i_values_only_at_its_phase(run):
    """The ci run has not learned the lookup (its query accuracy is near chance): meta.json keeps the
    phase of each geometry step and no Paper-I values; a step past the threshold gets them."""
    from dyntool.sims.bijection_phase import LOOKUP_ACCURACY, PAPER_I, paper_reference, phase
    fin = run.meta["final"]
    acc = run.metrics.dropna(subset=["heldout/acc_query"]).set_index("step")["heldout/acc_query"]
    assert fin["geometry"]["step11"]["query_accuracy"] == pytest.approx(acc.loc[11])
    assert fin["geometry"]["step11"]["phase"] == phase(acc.loc[11]) == "before the lookup"
    assert fin["paper_i"]["paper_i"] is None and "not shown" in fin["paper_i"]["note"]
    assert paper_reference(LOOKUP_ACCURACY, 5)["paper_i"] == PAPER_I
    assert paper_reference(LOOKUP_ACCURACY - 1e-9, 5)["paper_i"] is None and phase(None) == "unknown"


def test_same_seed_same_run(run, tmp_path):
    assert main(CI + ["--out", str(tmp_path), "--name", "again"]) == 0
    again = dyntool.open_run(tmp_path / "again")
    cols = ["loss", "heldout/loss", "manifold/resid/L1/r_pc1", "key_orth/ctx/L0"]
    a, b = run.metrics[["step"] + cols], again.metrics[["step"] + cols]
    assert a.equals(b)
    assert np.array_equal(run.arrays["attn"][:], again.arrays["attn"][:])


def test_time_limit_stops_and_records_the_last_step(tmp_path):
    assert main(CI + ["--out", str(tmp_path), "--name", "t", "--steps=50", "--time_limit_min=0.00001"]) == 0
    r = dyntool.open_run(tmp_path / "t")
    fin = r.meta["final"]
    assert fin["stopped_early"] and fin["steps_done"] < 50
    assert r.steps[-1] == fin["steps_done"]                       # the stopping step is recorded
    assert r.metrics["step"].max() == fin["steps_done"]


def test_fixed_stop_repeats_the_full_run_up_to_that_step(run, tmp_path):
    """stop_at_step keeps the lr schedule of `steps`, so the stopped run is the full run's prefix."""
    assert main(CI + ["--out", str(tmp_path), "--name", "s", "--stop_at_step=6"]) == 0
    s = dyntool.open_run(tmp_path / "s")
    assert s.meta["final"]["steps_done"] == 6 and s.meta["final"]["stopped_early"]
    a, b = s.metrics.set_index("step"), run.metrics.set_index("step")
    la = a["loss"].dropna()
    assert len(la) >= 3 and la.equals(b["loss"].dropna().loc[la.index])
    for col in ("heldout/loss", "manifold/resid/L1/pc1_share"):      # step 6 is recorded in both
        assert a.loc[6, col] == b.loc[6, col]


def test_bad_config_is_one_line_exit_2(tmp_path, capsys):
    assert main(CI + ["--out", str(tmp_path), "--L=25"]) == 2
    err = capsys.readouterr().err
    assert "config error: L" in err and "Traceback" not in err
    assert main(CI + ["--out", str(tmp_path), "--model.n_embd=15"]) == 2


def _model64(n_layer=2):
    cfg = BijectionConfig(V=6, L=5, model=BijectionModel(n_layer=n_layer, n_head=2, n_embd=8))
    torch.manual_seed(0)
    return cfg, build_model(cfg).double()


def test_tap_attention_reproduces_the_forward_float64():
    """The analysis path (Tap + recomputed α) is the model's attention: α v == y exactly, and its
    attention entropy equals the seam's recorded one (itself checked against autograd)."""
    cfg, model = _model64()
    tok, tgt = data.sample(5, cfg.V, cfg.L, torch.Generator().manual_seed(1))
    with Tap(model) as tap:
        model(tok)
    with Capture(model) as cap:
        value_loss(model(tok)[0], tgt, cfg.V).backward()
    q = cap.compute()
    for l in range(2):
        a = tap.attn(l)
        assert torch.allclose(a @ tap.out[l]["v"], tap.out[l]["y"], atol=1e-13)
        ent = -(a * torch.log(a.clamp_min(1e-300))).sum(-1)                 # (B, nh, T)
        assert torch.allclose(ent.transpose(0, 1), q["attn_entropy"][l], atol=1e-12)
    an = analyze(model, tok, cfg.V, n_plot=2)
    assert an["arrays"]["pcs_resid"].shape == (2, 2 * cfg.L, 2)
    assert 0 < an["metrics"]["attn_entropy/L0"] <= an["metrics"]["attn_entropy/uniform"] + 1e-9


def test_evaluate_matches_a_direct_computation():
    cfg, model = _model64(1)
    tok, tgt = data.sample(7, cfg.V, cfg.L, torch.Generator().manual_seed(2))
    ev = evaluate(model, tok, tgt, cfg.V, batch=3)
    with torch.no_grad():
        loss = value_loss(model(tok)[0], tgt, cfg.V).item()
    assert ev["loss"] == pytest.approx(loss, rel=1e-10)
    assert ev["entropy_per_position"].shape == (cfg.L + 1,)
    assert (ev["entropy_per_position"] <= math.log(cfg.V) + 1e-9).all()


def test_authors_task_end_to_end(tmp_path):
    """The authors' options on the ci size: pointer head, query-only loss, keys with replacement,
    the normed value read-out (in bits) beside the position baseline, step 0 kept."""
    assert main(CI + ["--out", str(tmp_path), "--name", "au", "--with_replacement=true", "--task.head=pointer",
                      "--task.loss=query", "--task.readout=normed_values", "--heldout_seqs=64",
                      "--analysis_seqs=64"]) == 0
    r = dyntool.open_run(tmp_path / "au")
    assert r.config["task"] == {"head": "pointer", "loss": "query", "aux_weight": 1.0, "readout": "normed_values"}
    rec = r.metrics.dropna(subset=["manifold/normed_values/r2_linear"]).set_index("step")
    assert list(rec.index) == [0, 6, 11]
    assert rec["manifold/normed_values/r2_partial"].notna().all()       # H varies within a position
    assert (rec["manifold/pos_onehot/r2_linear"] < 0.99).all()
    assert r.arrays["bij_pcs_normed_values"].shape == (3, 1, 4 * 19, 2)
    h = data.posterior_entropy(data.sample(64, 20, 19, torch.Generator().manual_seed(42 + 10000), True)[0].numpy(), 20)
    assert r.meta["bayes_loss"] == pytest.approx(h.mean())
    assert r.meta["bayes_accuracy_keys"] == pytest.approx(np.exp(-h[:, :19]).mean())
    geo = r.meta["final"]["geometry"]
    assert geo["step0"]["manifold/normed_values/r2_partial"] == pytest.approx(rec.loc[0, "manifold/normed_values/r2_partial"])
    # the query-only loss leaves the key positions untrained: their held-out loss stays near log V
    assert abs(r.meta["final"]["loss_keys"] - math.log(20)) < 0.05
