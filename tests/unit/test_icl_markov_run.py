"""The ICL-MC model and run: both tiers agree in float64 on a full-tier step, the attention scores
against constructed attention, the ci preset's record passes ``dyntool check``, bad input refused."""
import json

import numpy as np
import pytest
import torch

from dyntool import config
from dyntool.capture import Capture
from dyntool.cli import main
from dyntool.errors import ConfigError
from dyntool.flight import STATS, full_tier_reduction
from dyntool.sims import icl_markov as im
from dyntool.sims import icl_markov_task as task
from dyntool.sims.icl_markov_config import ICLMarkovConfig
from dyntool.sims.icl_markov_metrics import attention_scores, chance_levels, forward_with_attention, induction_keys


def ci_config(**values) -> ICLMarkovConfig:
    return config.load(ICLMarkovConfig, "icl_markov.toml", "ci", values=values)


def test_cheap_tier_equals_the_full_tiers_reduction_on_a_full_tier_step_in_float64():
    """The run's own step (train_step) with the full tier alongside, ci sizes, float64, every
    sequence of the batch recorded: each cheap statistic equals the T × T reduction to 1e-9."""
    cfg = ci_config()
    model = im.build_model(cfg, 0).double()
    with torch.no_grad():                             # trained-size scores, not the init's ~0.03
        for a in model.attn:
            a.c_attn.weight.mul_(30.0)
    opt = torch.optim.AdamW(model.param_groups(cfg.weight_decay), lr=cfg.lr)
    x, _ = task.sample(cfg.batch_size, cfg.T + 1, cfg.k, cfg.alpha, "dirichlet", np.random.default_rng(0))
    from dyntool.flight import FlightRecorder
    flight = FlightRecorder(model)
    cap = Capture(model, seqs=cfg.batch_size)
    loss, cheap, _ = im.train_step(model, opt, x, flight, cap)
    full = full_tier_reduction(cap.compute(dtype=torch.float64))
    assert {n for n in STATS if n != "sink_mass"} <= set(cheap)
    assert float(cheap["score_max"].max()) > 5            # the scaling took: not a near-uniform check
    for name in full:
        assert cheap[name].dtype == torch.float64
        torch.testing.assert_close(cheap[name], full[name], rtol=1e-9, atol=1e-12, msg=name)


def test_attention_read_through_the_seam_is_the_models_own():
    """forward_with_attention's α (recomputed from the q, k the seam saw) equals the full tier's
    α of a Capture on the same model and input."""
    cfg = ci_config()
    model = im.build_model(cfg, 1).double()
    x, _ = task.sample(4, cfg.T, cfg.k, cfg.alpha, "dirichlet", np.random.default_rng(1))
    _, alphas = forward_with_attention(model, x)
    with Capture(model) as cap:
        model(x).sum().backward()
    attn = cap.compute(dtype=torch.float64)["attn"]                 # (L, nh, B, T, T)
    for l, a in enumerate(alphas):
        torch.testing.assert_close(a.transpose(0, 1), attn[l], rtol=1e-10, atol=1e-12)


def test_scores_of_constructed_attention():
    x = torch.tensor([[0, 1, 0, 1, 1, 0]])
    T = x.shape[1]
    prev = torch.zeros(1, 1, T, T, dtype=torch.float64)
    prev[0, 0, 0, 0] = 1
    prev[0, 0, torch.arange(1, T), torch.arange(T - 1)] = 1             # exactly the previous token
    s = attention_scores(prev, x)
    assert float(s["prev_token"]) == 1.0
    # queries with an induction key: i=2 (x=0; key j=1 follows x_0=0), i=3 (x=1: j=2), i=4 (x=1: j=2, 4),
    # i=5 (x=0: j=1, 3); the previous-token key j = i-1 is one of them at i=2 and i=3: 2 of 4 queries
    ind = induction_keys(x)[0]
    assert ind.nonzero().tolist() == [[2, 1], [3, 2], [4, 2], [4, 4], [5, 1], [5, 3]]
    assert float(s["induction"]) == 0.5
    onto = ind[None, None].double() / ind.sum(-1).clamp_min(1)[None, None, :, None]
    assert float(attention_scores(onto, x)["induction"]) == pytest.approx(1.0)
    uniform = torch.ones(T, T, dtype=torch.float64).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None, None]
    ch, got = chance_levels(x), attention_scores(uniform, x)
    assert float(got["prev_token"]) == pytest.approx(ch["prev_token"]) == pytest.approx(np.mean(1 / np.arange(2, T + 1)))
    assert float(got["induction"]) == pytest.approx(ch["induction"]) == pytest.approx(np.mean([1 / 3, 1 / 4, 2 / 5, 2 / 6]))


def test_key_type_lifts_against_a_loop_over_queries_and_keys():
    """The four exclusive key types and their lifts, against a plain double loop (an independent
    computation) on random attention; uniform attention has lift 1 on every type."""
    from dyntool.sims.icl_markov_metrics import key_type_lifts, key_types
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (4, 12), generator=g)
    B, T = x.shape
    a = torch.softmax(torch.randn(B, 2, T, T, generator=g, dtype=torch.float64).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")), -1)
    got = key_type_lifts(a, x)
    kinds = key_types(x)
    assert sum(v.long() for v in kinds.values()).eq(torch.ones(T, T).tril().long()).all()   # a partition
    for name in ("same", "induction", "both", "neither"):
        for h in range(2):
            vals = []
            for b in range(B):
                for i in range(T):
                    def kind(j):
                        same, ind = bool(x[b, j] == x[b, i]), j >= 1 and bool(x[b, j - 1] == x[b, i])
                        return {(True, False): "same", (False, True): "induction", (True, True): "both",
                                (False, False): "neither"}[(same, ind)]
                    js = [j for j in range(i + 1) if kind(j) == name]
                    if js:
                        vals.append(sum(float(a[b, h, i, j]) for j in js) / (len(js) / (i + 1)))
            assert float(got[name][h]) == pytest.approx(np.mean(vals), rel=1e-12)
    uniform = torch.ones(T, T, dtype=torch.float64).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True))[None, None].expand(B, 1, T, T)
    for v in key_type_lifts(uniform, x).values():
        assert float(v) == pytest.approx(1.0)


def test_ci_study_record_passes_check(tmp_path, capsys):
    rc = main(["sim", "icl-markov", "--preset", "ci", "--control", "false", "--out", str(tmp_path),
               "--name", "s", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "KL(bigram" in out and "study written to" in out
    run = tmp_path / "s" / "seed0-dirichlet"
    assert main(["check", str(run)]) == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert list(summary["priors"]) == ["dirichlet"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 40 and all("score_grad_norm/L1H0" in r for r in rows)     # the cheap tier, every step
    assert sum("kl/bigram" in r for r in rows) == 21                              # every 2 steps and the last
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == "finished" and 0 < meta["chance"]["prev_token"] < 1
    # the advantage toward the previous position from the record equals E_α[b]_i − b_{i,i−1} of its α and B
    from dyntool.run import open_run
    from dyntool.sims.icl_markov_analysis import advantage_to_previous
    r = open_run(run)
    adv = advantage_to_previous(r, 1, 0)
    a, b = (np.asarray(r.store[n][-1, 1, 0], dtype=float) for n in ("attn", "compat"))    # (S, T, T)
    i = np.arange(1, a.shape[-1])
    by_hand = ((a * b).sum(-1)[:, i] - b[:, i, i - 1]).mean()
    assert adv["steps"] == [0, 20, 39] and adv["prev"][-1] == pytest.approx(by_hand, rel=1e-3, abs=1e-9)


@pytest.mark.parametrize("args, what", [
    (["--model.dropout=0.1"], "model.dropout"),
    (["--record.batch=probe"], "record.batch"),
    (["--prior=stationary"], "prior"),
    (["--k", "1"], "k"),
    (["--record.cheap_every=0"], "record.cheap_every"),
    (["--record.disk_budget_gb=1e-6"], "record.disk_budget_gb"),
    (["--device=mps"], "mps requested but not available"),     # was: internal error, a study folder left
])
def test_bad_input_is_a_one_line_error(tmp_path, capsys, monkeypatch, args, what):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)       # a Mac's too
    rc = main(["sim", "icl-markov", "--preset", "ci", "--out", str(tmp_path), "--name", "bad", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("dyntool: error:") and what in err and "Traceback" not in err
    assert not (tmp_path / "bad").exists()


def test_config_refuses_dropout_directly():
    with pytest.raises(ConfigError):
        ci_config(**{"model.dropout": 0.1})
