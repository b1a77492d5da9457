"""``dyntool train`` end to end on the tiny corpus: CLI, recording (U vs autograd), exact resume,
non-finite loss, config errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dyntool.cli import main
from dyntool.run import open_run

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "data" / "tiny_wikitext"
CONFIG = REPO / "dyntool" / "presets" / "wikitext_mhsa.toml"
# a model small enough that one run takes ~1 s
TINY_ARGS = [f"--data.path={TINY}", "--data.batch_size=4", "--data.block_size=16",
             "--data.eval_batch_size=8", "--data.eval_max_batches=0", "--model.n_layer=2",
             "--model.n_head=2", "--model.n_embd=32", "--optim.warmup_steps=2",
             "--train.eval_every=4", "--record.every=3"]


def train(tmp_path, *extra, name="r", config=CONFIG, preset="small"):
    argv = ["train", "--config", str(config), "--preset", preset, "--out", str(tmp_path),
            "--name", name, "--quiet", *TINY_ARGS, *extra]
    return main(argv), tmp_path / name


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_train_cli_end_to_end(tmp_path):
    rc, path = train(tmp_path, "--max-steps", "8")
    assert rc == 0
    run = open_run(path)
    assert run.status == "finished" and not run.problems
    final = run.meta["final"]
    assert final["steps"] == 8 and final["valid_ppl"] > 1 and final["test_ppl"] > 1
    assert np.isclose(final["valid_ppl"], np.exp(final["valid_loss"]))
    m = rows(path)
    # rows 0..7 are the updates; row 8 is the validation of the state after the last step
    assert [r["step"] for r in m] == list(range(9))
    assert set(m[-1]) == {"step", "val_loss", "val_ppl", "eval_time"}
    m_all, m = m, m[:-1]
    for key in ("loss", "lr", "tokens_per_s", "grad_norm", "logit_max/L0", "logit_max/L1H1",
                "logit_max", "grad_norm/L0.attn", "grad_norm/emb"):
        assert all(key in r for r in m), key
    evals = [r for r in m_all if "val_loss" in r]          # after 4 and 8 steps (eval_every=4)
    assert [r["step"] for r in evals] == [4, 8] and all("val_ppl" in r for r in evals)
    assert all(f"attn_entropy/L1H0" in r for r in m if r["step"] in (0, 3, 6, 7))
    arrs = run.arrays
    assert list(arrs["step"][:]) == [0, 3, 6, 7]
    assert arrs["attn"].dims == ("step", "layer", "head", "seq", "query", "key")
    assert arrs["attn"].shape == (4, 2, 2, 1, 16, 16)
    assert arrs["upstream"].shape == (4, 2, 2, 1, 16, 16)
    assert arrs["values"].dims == ("step", "layer", "head", "seq", "key", "d_v")
    for name in ("advantage", "compat", "scores", "logit_max"):
        assert name in arrs
    # probe batch: the same tokens every time, so the recorded queries change only via the weights
    assert (path / "checkpoint.pt").is_file()
    toks = run.store.attrs["probe_tokens"]               # the app labels matrix axes with these
    assert len(toks) == 1 and len(toks[0]) == 16 and all(isinstance(t, str) for t in toks[0])


def test_recorded_U_is_autograd_dL_dy_with_accumulation(tmp_path):
    """float64, accum 2, training-batch recording: U (grad_scale divided out) == ∂L_micro/∂y."""
    rc, path = train(tmp_path, "--max-steps", "1", "--train.dtype=float64", "--optim.accum=2",
                     "--record.batch=train", "--record.seqs=2", "--record.dtype=float32",
                     "--record.every=1", "--train.final_eval=off")
    assert rc == 0
    run = open_run(path)
    assert run.arrays["grad_scale"][0] == pytest.approx(0.5)
    assert run.meta["record_grad_scale"] == 0.5
    U = run.arrays["upstream"][0]                                   # (L, H, S, T, hs)

    # rebuild the step-0 model and micro-batch 0 independently of the recording code
    from dyntool.data.wikitext import load_wikitext
    from dyntool.train.runner import _seed_all, load_config
    from dyntool.train.ddp import DistInfo
    from dyntool.train.gpt import GPT
    from dyntool.train.trainer import Trainer
    cfg = load_config(None, None, [], resume=str(path))
    corpus = load_wikitext(TINY)
    _seed_all(cfg.seed)
    model = GPT(cfg.model, corpus.vocab_size, cfg.data.block_size).double()
    x, y = Trainer(cfg, model, corpus, DistInfo()).next_batch()
    outs = []
    for blk in model.h:
        def attend(q, k, v, mask_args, scale):
            o = F.scaled_dot_product_attention(q, k, v, scale=scale, **mask_args)
            outs.append(o)
            return o
        blk.attn.core.attend_fn = attend
    _, loss = model(x, y)
    grads = torch.autograd.grad(loss, outs)                          # ∂(mean loss)/∂y per layer
    ref = torch.stack([g[:2] for g in grads]).transpose(1, 2)        # (L, H, S, T, hs)
    np.testing.assert_allclose(U, ref.numpy(), rtol=1e-5, atol=1e-9)


def test_exact_resume(tmp_path):
    rc, full = train(tmp_path, "--max-steps", "8", name="full")
    assert rc == 0
    rc, half = train(tmp_path, "--max-steps", "8", "--train.stop_at=4", name="half")
    assert rc == 0
    assert open_run(half).meta["final"]["steps"] == 4
    rc = main(["train", "--resume", str(half), "--out", str(tmp_path), "--name", "rest", "--quiet"])
    assert rc == 0
    rest = tmp_path / "rest"
    a, b = rows(full), rows(half) + rows(rest)
    assert [r["step"] for r in b] == list(range(9))      # row 8: the validation after the last step
    assert "val_loss" in b[4] and "val_loss" not in rows(half)[-1]   # the state after 4 steps: evaluated once
    for ra, rb in zip(a, b):
        for key in ("loss", "grad_norm", "lr", "logit_max", "val_loss"):
            assert ra.get(key) == rb.get(key), (ra["step"], key)     # bitwise (json round-trips floats)
    fa, fb = open_run(full).meta["final"], open_run(rest).meta["final"]
    assert fa["param_sha256"] == fb["param_sha256"] and fa["valid_loss"] == fb["valid_loss"]
    assert open_run(rest).meta["resumed_from"]["step"] == 4
    assert list(open_run(rest).arrays["step"][:]) == [6, 7]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # float16 storage of exploding values
def test_nonfinite_loss_marks_run_failed_and_keeps_records(tmp_path, capsys):
    rc, path = train(tmp_path, "--max-steps", "30", "--optim.lr=1e6", "--optim.warmup_steps=0",
                     "--optim.grad_clip=0", "--record.every=1")
    assert rc != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "non-finite loss" in err[0]
    run = open_run(path)
    assert run.status == "failed"
    step = run.meta["failed_step"]
    assert step >= 1
    assert run.steps_written >= step                                # every step before it recorded
    m = rows(path)
    assert m[-1]["step"] == step and m[-1]["loss"] is None          # the failing row, loss = null


def test_unknown_config_key_is_one_line_exit_2(tmp_path, capsys):
    rc, _ = train(tmp_path, "--model.n_layers=2")
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.n_layers" in err[0]
    assert not (tmp_path / "r").exists()


def test_bad_value_and_missing_data_exit_2(tmp_path, capsys):
    assert train(tmp_path, "--model.attention=rnn")[0] == 2
    assert "model.attention" in capsys.readouterr().err
    assert train(tmp_path, f"--data.path={tmp_path / 'nope'}")[0] == 2
    assert "wikitext-2 directory not found" in capsys.readouterr().err


@pytest.mark.parametrize("config", ["wikitext_ls.toml", "wikitext_span.toml", "wikitext_qknorm.toml"])
def test_variant_configs_train(tmp_path, config):
    rc, path = train(tmp_path, "--max-steps", "4", "--model.n_head=2", "--model.n_local=1",
                     "--model.n_global=1", "--model.window=4", config=REPO / "dyntool" / "presets" / config)
    assert rc == 0
    assert open_run(path).config["model"]["attention"] == config.split("_")[1].split(".")[0]


def test_cheap_tier_every_step_equals_the_recorded_full_tier(tmp_path):
    """record.cheap_every=1 on the training batch: each head's cheap statistics land in
    metrics.jsonl on every step and equal the reduction of the full tier recorded on the same batch
    (float64 model, float32 storage); cheap_every=2 writes them on even steps only, even with a
    log interval that would skip them."""
    from dyntool.flight import STATS, full_tier_reduction
    from dyntool.record import metric_names as mn
    rc, path = train(tmp_path, "--max-steps", "3", "--train.dtype=float64", "--record.batch=train",
                     "--record.seqs=4", "--record.dtype=float32", "--record.every=1",
                     "--record.cheap_every=1", "--train.final_eval=off", "--train.eval_every=0")
    assert rc == 0
    run, m = open_run(path), rows(path)
    assert [r["step"] for r in m] == [0, 1, 2]
    for i, r in enumerate(m):
        full = full_tier_reduction({n: torch.as_tensor(run.arrays[n][i]).double() for n in
                                    ("attn", "compat", "expected_compat", "column_usage", "scores", "logit_max",
                                     "attn_entropy", "score_grad", "upstream", "value_grad")})
        for name in STATS[:-1]:
            cheap = torch.tensor([[r[mn.head(name, l, h)] for h in range(2)] for l in range(2)], dtype=torch.float64)
            torch.testing.assert_close(cheap, full[name], rtol=2e-5, atol=1e-7, msg=name)
    rc, path = train(tmp_path, "--max-steps", "4", "--record.every=0", "--record.cheap_every=2",
                     "--train.log_every=3", "--train.final_eval=off", "--train.eval_every=0", name="every2")
    assert rc == 0
    got = {r["step"]: r for r in rows(path)}
    assert sorted(got) == [0, 2, 3]
    assert all(("score_grad_norm/L1H1" in got[s]) == (s in (0, 2)) for s in got)


def test_cheap_tier_bad_budget_exit_2(tmp_path, capsys):
    rc, path = train(tmp_path, "--max-steps", "1", "--record.cheap_every=1", "--record.max_block_mib=-1")
    assert rc == 2 and not path.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_block_mib" in err[0]
    rc, path = train(tmp_path, "--max-steps", "1", "--record.cheap_every=1", "--record.max_block_mib=0.0001")
    assert rc == 2 and not path.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "too small for one query row" in err[0]
