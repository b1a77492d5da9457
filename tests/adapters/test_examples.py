"""Every script in examples/ runs at toy size (3 steps, the bundled tiny WikiText) and leaves a
readable run with recorded steps; a script whose framework is not installed is skipped."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dyntool

ROOT = Path(__file__).resolve().parents[2]
NEEDS = {"hf_gpt2_wikitext.py": ["transformers"], "hf_trainer_callback.py": ["transformers", "accelerate"],
         "nanogpt_sdpa.py": [], "transformerlens.py": ["transformer_lens"],
         "lightning_callback.py": ["lightning", "transformers"]}


def test_every_example_is_listed():
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(NEEDS)


@pytest.mark.parametrize("script", sorted(NEEDS))
def test_example_runs_at_toy_size(script, tmp_path):
    for mod in NEEDS[script]:
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} not installed (see the README's dependency table)")
    env = {**os.environ, "STEPS": "3", "DATA": str(ROOT / "tests/data/tiny_wikitext"), "OUT": str(tmp_path),
           "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, str(ROOT / "examples" / script)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = dyntool.list_runs(tmp_path)
    assert len(runs) == 1, [r.path for r in runs]
    run = runs[0]
    assert run.status == "finished" and not run.problems
    assert list(run.steps) == [0, 2]                          # every=50 over 3 steps: first and last
    attn = run.arrays["attn"][-1]                             # (layer, head, seq, query, key)
    assert attn.shape[:2] == (2, 4)
    assert abs(float(attn[0, 0, 0, -1].astype("float64").sum()) - 1) < 1e-2   # rows of α sum to 1
    assert "loss" in run.metrics.columns
