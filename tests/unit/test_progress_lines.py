"""Log-line progress: no duplicated last line; an evaluation is left out of the step rate and shows
its own line; the end-of-run summary gives training and evaluation times."""
from __future__ import annotations

import io
import re
from pathlib import Path

from dyntool.cli import main
from dyntool.progress import LogProgress, TrainProgress

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny_wikitext"


def test_last_line_not_repeated():
    s = io.StringIO()
    bar = LogProgress(total=3, desc="x", every=0.0, stream=s)        # a line at every update
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert s.getvalue().count("\n") == 3
    s = io.StringIO()
    bar = LogProgress(total=3, desc="x", every=1e9, stream=s)         # no line until the close
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert s.getvalue().count("\n") == 1 and "3/3" in s.getvalue()


def test_eval_time_is_left_out_of_the_rate():
    p = TrainProgress()
    p.bar = LogProgress(total=10, every=1e9, stream=io.StringIO())
    p.on_step_end(0, {"loss": 1.0, "tokens_per_s": 1.0})
    assert p.bar.excluded == 0.0
    p.on_step_end(1, {"loss": 1.0, "tokens_per_s": 1.0, "val_loss": 1.0, "eval_time": 5.0})
    assert p.bar.excluded == 5.0 and p.bar.n == 2
    p.bar.t0 -= 6.0                                                    # 6 s wall, 5 of them evaluating
    line = p.bar.line()
    assert re.search(r" 2 it/s ", line) and "elapsed 0:06" in line and "not in the rate" in line


def test_train_shows_eval_and_both_times(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DYNTOOL_PROGRESS_SECONDS", "1000")
    argv = ["train", "--config", "wikitext_mhsa", "--preset", "small", "--out", str(tmp_path), "--name", "r",
            "--max-steps", "6", f"--data.path={TINY}", "--data.batch_size=2", "--data.block_size=8",
            "--model.n_layer=1", "--model.n_head=1", "--model.n_embd=16", "--train.eval_every=3",
            "--record.every=0", "--train.checkpoint=false"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    err = cap.err.splitlines()
    assert err[0].startswith("data: ") and "cached in" in err[0]                   # what is read, first
    evals = [ln for ln in err if ln.startswith("eval (valid) at step")]
    assert [ln.split(":")[0] for ln in evals] == ["eval (valid) at step 3", "eval (valid) at step 6"]
    assert all(re.search(r"\d+/\d+ \(100%\).*ETA", ln) for ln in evals)
    train_lines = [ln for ln in err if "r train: " in ln]
    assert len(train_lines) == 1 and "6/6" in train_lines[0]                        # once, not twice
    assert err.index(train_lines[0]) < err.index(next(ln for ln in err if ln.startswith("final evaluation")))
    assert re.search(r"training \d+\.\d s, evaluation \d+\.\d s", cap.out)
