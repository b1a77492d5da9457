"""FSDP2 on CPU (gloo, 2 processes via torchrun): every rank records its own probe shard into its
own store; the merged record equals a single process on the same data (float32, 1e-6), each
rank's committed steps survive kill -9, and resume is exact."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dyntool.cli import main
from dyntool.record.ranks import rank_dir
from dyntool.record.reader import RecordReader
from dyntool.run import open_run
from dyntool.storage import open_backend

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "data" / "tiny_wikitext"
STEPS = 40                     # the kill test needs time to kill it mid-run
EQUAL_STEPS = 8                # compared with a single process (Adam amplifies rounding later)
# per-rank batch 2 (global 4), probe of 2 sequences (one per rank), float32 recording
ARGS = ["--config", str(REPO / "dyntool" / "presets" / "wikitext_mhsa.toml"), "--preset", "small", "--quiet",
        f"--data.path={TINY}", "--data.block_size=16", "--model.n_layer=2", "--model.n_head=2",
        "--model.n_embd=16", "--optim.accum=2", "--record.every=2", "--record.seqs=2",
        "--record.dtype=float32", "--record.flush_seconds=0.2", "--train.eval_every=4",
        "--train.checkpoint_every=2", "--train.final_eval=false", "--device=cpu"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
       "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def torchrun(*args, **kw):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "dyntool", "train", *args]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)


def finish(proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    finish(torchrun(*ARGS, "--data.batch_size=2", "--parallel=fsdp", "--max-steps", str(STEPS),
                    "--out", str(out), "--name", "ref"))
    return out / "ref"


def test_fsdp_record_equals_single_process(fsdp_run, tmp_path):
    run = open_run(fsdp_run)
    assert run.status == "finished" and not run.problems, run.problems
    assert run.meta["parallel"] == "fsdp" and run.meta["world_size"] == 2
    assert "param_sha256_ranks" not in run.meta["final"]     # was rank 1's sha256 of nothing: shards, no replicas
    # two stores, one sequence each: rank 1 recorded the probe's second sequence
    r1 = RecordReader(open_backend(fsdp_run), rank_dir(1))
    assert r1.attrs["rank"] == 1 and r1.attrs["seq_offset"] == 1 and r1["attn"].shape[3] == 1
    words = RecordReader(open_backend(fsdp_run), rank_dir(0)).attrs["probe_tokens"]      # the merged view's
    assert len(words) == 2 and r1.attrs["probe_tokens"] == words[1:]      # was: sequence 0's words
    # the same global batch of 4 in one process (the reference has no rank in it)
    assert main(["train", *ARGS, "--data.batch_size=4", "--max-steps", str(STEPS), "--train.stop_at",
                 str(EQUAL_STEPS), "--out", str(tmp_path), "--name", "single"]) == 0
    ref = open_run(tmp_path / "single")
    k = len(ref.steps)
    assert list(run.steps[:k]) == list(ref.steps) == [0, 2, 4, 6]
    assert run.store.names() == ref.store.names()
    for name in ref.store.names():
        a, b = run.arrays[name][:k], ref.arrays[name][:]
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, equal_nan=True, err_msg=name)
    # the merged view really is rank 0 ++ rank 1 along seq, and logit_max the max over ranks
    r0 = RecordReader(open_backend(fsdp_run), rank_dir(0))
    np.testing.assert_array_equal(run.arrays["attn"][:, :, :, 1], r1["attn"][:, :, :, 0])
    np.testing.assert_array_equal(run.arrays["attn"][-1, 1, 0, ::-1], np.concatenate(
        [r1["attn"][-1, 1, 0], r0["attn"][-1, 1, 0]]))
    np.testing.assert_array_equal(run.arrays["logit_max"][:], np.maximum(r0["logit_max"][:], r1["logit_max"][:]))
    ma, mb = run.metrics.set_index("step").loc[:EQUAL_STEPS - 1], ref.metrics.set_index("step")
    for col in ("loss", "grad_norm", "probe_loss", "attn_entropy/L1H0", "grad_norm/L0.attn", "logit_max"):
        np.testing.assert_allclose(ma[col], mb[col], rtol=1e-5, atol=1e-6, err_msg=col)
    ds = run.to_xarray()
    assert ds["attn"].sizes["seq"] == 2


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in their own sessions)."""
    kids = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _rows(p: Path) -> list[dict]:
    return [json.loads(l) for l in (p / "metrics.jsonl").read_text().splitlines() if l.strip()]


@pytest.mark.slow
def test_fsdp_kill_9_leaves_every_rank_readable_and_resumes_exactly(fsdp_run, tmp_path):
    proc = torchrun(*ARGS, "--data.batch_size=2", "--parallel=fsdp", "--max-steps", str(STEPS),
                    "--out", str(tmp_path), "--name", "k")
    killed = tmp_path / "k"
    deadline = time.time() + 180
    while time.time() < deadline and (not (killed / "metrics.jsonl").exists() or
                                      len(_rows(killed)) < 12):
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(0.01)
    for pid in [proc.pid, *_descendants(proc.pid)]:      # torchrun and both ranks, kill -9
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    time.sleep(0.3)
    run = open_run(killed)
    assert run.status == "running" and not run.problems, (run.status, run.problems)
    for r in (0, 1):                                     # each rank's own committed steps
        st = RecordReader(open_backend(killed), rank_dir(r))
        assert st.steps_written >= 2 and not st.verify(full=True)
    assert run.steps_written >= 2
    ref = open_run(fsdp_run)
    n = run.steps_written
    np.testing.assert_array_equal(run.arrays["attn"][:n], ref.arrays["attn"][:n])
    finish(torchrun("--resume", str(killed), "--name", "rest", "--quiet", "--out", str(tmp_path)))
    rest = open_run(tmp_path / "rest")
    start = rest.meta["resumed_from"]["step"]
    assert start >= 2 and rest.status == "finished" and not rest.problems
    assert rest.meta["final"]["param_sha256"] == ref.meta["final"]["param_sha256"]
    tail = [r for r in _rows(fsdp_run) if r["step"] >= start]
    keys = ("loss", "grad_norm", "probe_loss")
    assert [[r.get(k) for k in keys] for r in _rows(tmp_path / "rest")] == [[r.get(k) for k in keys] for r in tail]
    k = rest.steps_written
    np.testing.assert_array_equal(rest.arrays["attn"][:], ref.arrays["attn"][-k:])


def test_fsdp_cheap_tier_and_a_resume_that_evaluates_first(tmp_path):
    """Two FSDP bugs, one pair of runs.  Was: rank 1 stopped at the start with ''RankRun' object has
    no attribute 'update_meta'' (the cheap tier); and a run resumed at an evaluation step stopped on
    every rank with 'Inplace update to inference tensor outside InferenceMode' (its first all-gather
    ran under inference_mode)."""
    finish(torchrun(*ARGS, "--data.batch_size=2", "--parallel=fsdp", "--max-steps", "6", "--train.stop_at=4",
                    "--record.cheap_every=1", "--out", str(tmp_path), "--name", "a"))
    run = open_run(tmp_path / "a")
    assert run.status == "finished" and not run.problems, run.problems
    paths = run.meta["attention_paths"]                 # rank 0's meta says which path each site took
    assert sorted(paths) == ["L0", "L1"] and all(v.startswith("eager") for v in paths.values())
    assert [r["step"] for r in _rows(tmp_path / "a") if "score_grad_norm/L1H1" in r] == [0, 1, 2, 3]
    finish(torchrun("--resume", str(tmp_path / "a"), "--out", str(tmp_path), "--name", "b", "--quiet"))
    rest = open_run(tmp_path / "b")
    assert rest.status == "finished" and rest.meta["resumed_from"]["step"] == 4 and not rest.problems
    rows = _rows(tmp_path / "b")
    assert [r["step"] for r in rows if "val_loss" in r][0] == 4          # evaluated before it trained
    assert [r["step"] for r in rows if "score_grad_norm/L1H1" in r] == [4, 5]


def test_fsdp_probe_must_split_evenly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    out = tmp_path / "runs"
    assert main(["train", *ARGS, "--parallel=fsdp", "--record.seqs=3", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "record.seqs" in err[0] and "2 ranks" in err[0]
    assert not out.exists()
