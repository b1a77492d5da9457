"""DDP on CPU: 2 processes (gloo, loopback) via torchrun; replicas must end identical and only
rank 0 writes the run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dyntool.run import list_runs

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "data" / "tiny_wikitext"


def test_two_process_ddp_cpu(tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "dyntool", "train", "--config", str(REPO / "dyntool" / "presets" / "wikitext_mhsa.toml"),
           "--preset", "small", "--max-steps", "6", "--out", str(out), "--name", "ddp", "--quiet",
           f"--data.path={TINY}", "--data.batch_size=2", "--data.block_size=16", "--model.n_layer=1",
           "--model.n_head=2", "--model.n_embd=16", "--optim.accum=2", "--record.every=2",
           "--train.eval_every=3", "--device=cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = list_runs(out)
    assert [r.id for r in runs] == ["ddp"]                           # rank 1 wrote nothing
    run = runs[0]
    assert run.status == "finished" and run.meta["world_size"] == 2
    digests = run.meta["final"]["param_sha256_ranks"]
    assert len(digests) == 2 and digests[0] == digests[1] == run.meta["final"]["param_sha256"]
    assert list(run.arrays["step"][:]) == [0, 2, 4, 5]
    assert len(run.metrics) == 7 and "val_ppl" in run.metrics        # rows 0..5 + row 6, the last state
    assert sorted(p.name for p in out.iterdir()) == ["ddp"]
