"""DDP with the Hugging Face TrainerCallback: 2 CPU processes (gloo) via torchrun; one run
directory, written by rank 0 only, readable with recorded steps."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dyntool.run import list_runs

pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")
pytest.importorskip("accelerate", reason="accelerate not installed (the HF Trainer needs it)")
REPO = Path(__file__).resolve().parents[2]


def test_hf_trainer_callback_two_process_ddp(tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "examples" / "hf_trainer_callback.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "STEPS": "4",
           "DATA": str(REPO / "tests/data/tiny_wikitext"), "OUT": str(out), "PYTHONPATH": str(REPO),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = list_runs(out)
    assert len(runs) == 1, [r.path for r in runs]                     # rank 1 wrote nothing
    assert sorted(x.name for x in out.iterdir() if not x.name.startswith(".")) == [runs[0].id]
    run = runs[0]
    assert run.status == "finished" and not run.problems
    assert run.config["world_size"] == 2
    assert list(run.steps) == [0, 3]
    assert run.arrays["attn"][-1].shape == (2, 4, 1, 32, 32)
    assert run.metrics["loss"].notna().any()
