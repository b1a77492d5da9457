"""DDP on CPU: 2 processes (gloo, loopback) via torchrun; replicas must end identical and only
rank 0 writes the run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def test_a_rank_that_fails_fails_the_run(tmp_path):
    """torchrun then signals the other rank, whose collective broke: that is no stop request, so
    the run reads 'failed' (not 'interrupted' with a resume command that would fail again)."""
    script = tmp_path / "fail_rank1.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        from dyntool.train.trainer import Trainer
        step = Trainer._one_step
        def failing(self, *a, **k):
            if self.step == 3 and os.environ["RANK"] == "1":
                raise ValueError("rank 1 broke")
            return step(self, *a, **k)
        Trainer._one_step = failing
        from dyntool.cli import main
        sys.exit(main(sys.argv[1:]))
    """))
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           "train", "--config", str(REPO / "dyntool" / "presets" / "wikitext_mhsa.toml"), "--preset", "small",
           "--max-steps", "50", "--out", str(out), "--name", "f", "--quiet", f"--data.path={TINY}",
           "--data.batch_size=2", "--data.block_size=16", "--model.n_layer=1", "--model.n_head=2",
           "--model.n_embd=16", "--record.every=0", "--train.eval_every=0", "--device=cpu", "--parallel=ddp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode != 0 and "rank 1 broke" in p.stderr, p.stderr[-3000:]
    meta = json.loads((out / "f" / "meta.json").read_text())
    assert meta["status"] == "failed", meta
    assert "continue with" not in p.stderr


def _ddp_with(tmp_path, hook: str, **popen):
    """torchrun with 2 ranks of a tiny 50-step DDP run whose ``Trainer._one_step`` runs ``hook``
    (Python, with ``self`` the trainer) first; returns the Popen."""
    script = tmp_path / "hooked.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        from dyntool.train.trainer import Trainer
        step = Trainer._one_step
        def hooked(self, *a, **k):
            {hook}
            return step(self, *a, **k)
        Trainer._one_step = hooked
        from dyntool.cli import main
        sys.exit(main(sys.argv[1:]))
    """))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           "train", "--config", str(REPO / "dyntool" / "presets" / "wikitext_mhsa.toml"), "--preset", "small",
           "--max-steps", "50", "--out", str(tmp_path / "runs"), "--name", "f", "--quiet", f"--data.path={TINY}",
           "--data.batch_size=2", "--data.block_size=16", "--model.n_layer=1", "--model.n_head=2",
           "--model.n_embd=16", "--record.every=0", "--train.eval_every=0", "--device=cpu", "--parallel=ddp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


@pytest.mark.slow
def test_a_rank_killed_outright_fails_the_run_naming_it(tmp_path):
    """Issue 50 item 11: rank 1 killed by SIGKILL read as a user interrupt ('signal 15': torchrun's
    SIGTERM to rank 0 after the death) with a resume command; it is a failure naming rank 1."""
    p = _ddp_with(tmp_path, 'if self.step == 3 and os.environ["RANK"] == "1": os.kill(os.getpid(), signal.SIGKILL)')
    _, err = p.communicate(timeout=240)
    assert p.returncode != 0, err[-3000:]
    meta = json.loads((tmp_path / "runs" / "f" / "meta.json").read_text())
    assert meta["status"] == "failed" and "rank 1 ended without being asked to stop" in meta["error"], meta
    assert "continue with" not in err


@pytest.mark.slow
def test_a_sigterm_to_torchrun_still_interrupts_the_run(tmp_path):
    """The other side of the same rule: torchrun stopped by SIGTERM signals every rank, each says
    so in the store, and the run reads interrupted with the command that continues it."""
    import signal
    import time
    p = _ddp_with(tmp_path, 'time.sleep(0.2) if self.step >= 3 else None')
    meta, rows = tmp_path / "runs" / "f" / "meta.json", tmp_path / "runs" / "f" / "metrics.jsonl"
    end = time.monotonic() + 180
    while time.monotonic() < end and not (rows.is_file() and rows.read_text().count("\n") >= 4):
        time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    m = json.loads(meta.read_text())
    assert m["status"] == "interrupted" and m["error"].startswith("signal 15"), (m, err[-2000:])
