"""The dataflow adapter under 2-process DDP (gloo, CPU, torchrun): one run, written by rank 0,
recorded by dataflow, readable (slow: two interpreters importing transformers)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dyntool.run import list_runs

pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bloom_two_process_ddp_records_through_dataflow(tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "tests" / "adapters" / "dataflow_ddp_worker.py")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "OUT": str(out),
           "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = list_runs(out)
    assert len(runs) == 1, [r.path for r in runs]                     # rank 1 wrote nothing
    run = runs[0]
    assert run.status == "finished" and not run.problems
    assert run.config["model"]["adapter"] == "dataflow"
    assert list(run.steps) == [0, 1, 2]
    assert run.arrays["attn"][-1].shape == (2, 2, 1, 8, 8)
