"""``train.final_eval``: auto bounds the final evaluation of a run that trained on fewer tokens
than the splits hold (and says so), full forces the exact one, off skips it; the old booleans load."""
from __future__ import annotations

import pytest
import torch

from dyntool.run import open_run

from .test_train import CONFIG, TINY, TINY_ARGS, train


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def _direct_loss(run_path, split: str, n_tokens: int) -> float:
    """Mean cross-entropy (float64) of the checkpointed model over the first ``n_tokens`` targets
    of ``split``, windows of T: independent of the trainer's evaluation code."""
    from dyntool.data.wikitext import load_wikitext
    from dyntool.train.gpt import GPT
    from dyntool.train.runner import load_config
    cfg = load_config(str(CONFIG), "small", TINY_ARGS)
    corpus = load_wikitext(TINY)
    model = GPT(cfg.model, corpus.vocab_size, cfg.data.block_size)
    model.load_state_dict(torch.load(run_path / "checkpoint.pt", weights_only=True)["model"])
    model.eval()
    T, data = cfg.data.block_size, torch.as_tensor(corpus.split(split).astype("int64"))
    x = data[:n_tokens].view(-1, T)
    y = data[1:n_tokens + 1].view(-1, T)
    with torch.no_grad():
        logits, _ = model(x)
    return torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), y.flatten()).item()


def test_a_short_run_gets_a_bounded_final_eval_that_says_so(tmp_path, capsys):
    rc, path = train(tmp_path, "--max-steps", "1", "--train.eval_every=0")   # 64 tokens trained
    assert rc == 0
    final = open_run(path).meta["final"]
    assert final["final_eval"] == "bounded"
    assert final["final_eval_tokens"] == {"valid": 32, "test": 32}          # half of 64 per split, whole windows
    for split in ("valid", "test"):
        assert final[f"{split}_loss"] == pytest.approx(_direct_loss(path, split, 32), rel=1e-5)
    out = capsys.readouterr().out
    assert "bounded: first 32 / 32 tokens of valid / test" in out


def test_full_forces_the_exact_evaluation_and_auto_is_exact_for_long_runs(tmp_path):
    from dyntool.data.wikitext import load_wikitext
    corpus = load_wikitext(TINY)
    n = {s: len(corpus.split(s)) - 1 for s in ("valid", "test")}
    rc, path = train(tmp_path, "--max-steps", "1", "--train.eval_every=0", "--train.final_eval=full", name="f")
    final = open_run(path).meta["final"]
    assert final["final_eval"] == "full" and final["final_eval_tokens"] == n
    rc, path = train(tmp_path, "--max-steps", "12", "--train.eval_every=0", name="long")   # 768 tokens > splits
    assert sum(n.values()) < 12 * 64
    final = open_run(path).meta["final"]
    assert final["final_eval"] == "full" and final["final_eval_tokens"] == n


def test_the_announcement_gives_tokens_an_estimate_and_the_switches(tmp_path, capsys):
    from dyntool.cli import main
    main(["train", "--config", str(CONFIG), "--preset", "small", "--out", str(tmp_path), "--name", "loud2",
          *TINY_ARGS, "--max-steps", "2"])
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("final evaluation:"))
    assert "valid (64 tokens) + test (64 tokens)" in line and "about " in line and " s;" in line
    assert "--train.final_eval=full" in line and "--train.final_eval=off" in line


@pytest.mark.parametrize("given, mode", [("false", "off"), ("true", "full"), ("auto", "auto"),
                                         ("FULL", "full"), ("off", "off")])
def test_old_booleans_still_load(given, mode):
    from dyntool.train.runner import load_config
    cfg = load_config(str(CONFIG), "small", [f"--train.final_eval={given}"])
    assert cfg.train.final_eval == mode


def test_a_bad_mode_is_a_one_line_error(tmp_path, capsys):
    from dyntool.cli import main
    rc = main(["train", "--config", str(CONFIG), "--out", str(tmp_path), "--train.final_eval=some"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "train.final_eval" in err and "auto, full or off" in err and "Traceback" not in err


def test_off_skips_it(tmp_path):
    rc, path = train(tmp_path, "--max-steps", "1", "--train.final_eval=off", name="o")
    final = open_run(path).meta["final"]
    assert "valid_loss" not in final and "final_eval" not in final
