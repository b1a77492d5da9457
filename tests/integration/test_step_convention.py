"""One step count everywhere: console, meta.json, metrics.jsonl, ``dyntool info`` and the app's
step count all say "after N optimizer steps" for the same validation (docs/FORMAT.md, Steps)."""
from __future__ import annotations

import json
import re

import pytest

from dyntool.cli import main
from dyntool.run import open_run

from .test_train import CONFIG, TINY_ARGS


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def test_console_meta_metrics_and_info_agree_on_steps(tmp_path, capsys):
    # eval_every=3 over 8 steps: validations after 3, 6 and 8 steps
    argv = ["train", "--config", str(CONFIG), "--preset", "small", "--out", str(tmp_path), "--name", "r",
            *TINY_ARGS, "--max-steps", "8", "--train.eval_every=3", "--train.final_eval=off"]
    assert main(argv) == 0
    out = capsys.readouterr()
    console = {int(m.group(1)): float(m.group(2))
               for m in re.finditer(r"^step (\d+): (?:loss \S+  )?val (\S+)", out.err, re.M)}
    assert sorted(console) == [3, 6, 8], out.err
    rows = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    assert sorted(logged) == [3, 6, 8]
    for s in logged:                                       # the console prints 4 decimals of the same number
        assert console[s] == pytest.approx(logged[s], abs=6e-5)
    final = open_run(tmp_path / "r").meta["final"]
    best = min(logged, key=logged.get)
    assert final["steps"] == 8 and final["best_val_step"] == best
    assert final["best_val_loss"] == logged[best]
    said = re.search(r"best val ppl \S+ at step (\d+)", out.out)
    assert said and int(said.group(1)) == best

    assert main(["info", str(tmp_path / "r")]) == 0
    info = capsys.readouterr().out
    assert "8 optimizer steps taken (metrics rows at steps 0..8; row 8 = the validation after the last step)" \
        in info
    assert f'"best_val_step": {best}' in info

    from dyntool.steps import steps_taken
    run = open_run(tmp_path / "r")
    meta = {k: v for k, v in run.meta.items() if k != "final"}          # as an unfinished run: from the rows
    assert steps_taken(meta, run.metrics) == 8
    assert main(["ls", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[3] == "8"                        # STEPS


def test_an_unfinished_run_counts_its_training_rows():
    import pandas as pd
    from dyntool.steps import steps_taken
    rows = pd.DataFrame({"step": [0, 1, 2, 3], "loss": [1.0, 0.9, 0.8, 0.7],
                         "val_loss": [None, None, None, 0.75]})
    assert steps_taken({"kind": "train"}, rows) == 4          # row 3 is an update with its validation
    last = pd.concat([rows, pd.DataFrame({"step": [4], "val_loss": [0.7]})], ignore_index=True)
    assert steps_taken({"kind": "train"}, last) == 4          # row 4 is the state after 4 steps
