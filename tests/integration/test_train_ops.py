"""Training operations: safe checkpoints, kill -9 / SIGTERM / SIGINT and exact resume, resume of a
finished run, best validation, eval mode, progress without a terminal, flush timer, disk full."""
from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dyntool.cli import main
from dyntool.run import open_run
from dyntool.run_writer import RunWriter

from .test_train import CONFIG, REPO, TINY, TINY_ARGS   # the same tiny model and corpus
KEYS = ("loss", "grad_norm", "lr", "logit_max", "val_loss")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def train(out, *extra, name="r", quiet=True):
    argv = ["train", "--config", str(CONFIG), "--preset", "small", "--out", str(out), "--name", name,
            *(["--quiet"] if quiet else []), *TINY_ARGS, *extra]
    return main(argv), Path(out) / name


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]


def ck_step(path: Path) -> int:
    return int(torch.load(path / "checkpoint.pt", weights_only=True)["step"])


def assert_continues(ref: Path, rest: Path, start: int):
    """``rest`` (resumed at ``start``) reproduces ``ref``'s rows from ``start`` on, bitwise."""
    a, b = rows(ref), rows(rest)
    assert [r["step"] for r in b] == [r["step"] for r in a][start:]
    for ra, rb in zip(a[start:], b):
        for key in KEYS:
            assert ra.get(key) == rb.get(key), (ra["step"], key)
    assert open_run(ref).meta["final"]["param_sha256"] == open_run(rest).meta["final"]["param_sha256"]


# -- checkpoints ------------------------------------------------------------------------------

class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_checkpoint_is_refused_without_executing(tmp_path, capsys):
    rc, run = train(tmp_path, "--max-steps", "2", "--train.final_eval=off")
    assert rc == 0
    marker = tmp_path / "pwned"
    torch.save({"step": 1, "model": _Evil(marker)}, run / "checkpoint.pt")
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    rc = main(["train", "--resume", str(run), "--max-steps", "4", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "refused" in err[0] and "Traceback" not in err[0]
    assert not marker.exists()                                       # the payload never ran
    assert sorted(p.name for p in tmp_path.iterdir()) == before      # no run directory made


def test_rng_states_round_trip_through_weights_only(tmp_path):
    from dyntool.train import checkpoint as ck
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    np.random.normal()                                # has_gauss / cached value set
    random.gauss(0, 1)
    ck.save({"rng": ck.capture_rng()}, tmp_path / "c.pt")
    want = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.normal(),
            torch.rand(3).tolist())
    sd = torch.load(tmp_path / "c.pt", weights_only=True)             # plain types only
    ck.restore_rng(sd["rng"])
    got = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.normal(),
           torch.rand(3).tolist())
    assert got == want
    assert not (tmp_path / "c.pt.tmp").exists()


def test_checkpoint_written_by_default_interval(tmp_path):
    from dyntool.train.config import TrainLoopConfig
    assert TrainLoopConfig().checkpoint_every > 0                      # kill -9 safe by default
    rc, run = train(tmp_path, "--max-steps", "9", "--train.checkpoint_every=4", "--train.stop_at=6")
    assert rc == 0 and ck_step(run) == 6


def test_resume_without_checkpoint_says_why(tmp_path, capsys):
    rc, run = train(tmp_path, "--max-steps", "2", "--train.checkpoint=false", "--train.final_eval=off")
    assert rc == 0 and not (run / "checkpoint.pt").exists()
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.checkpoint=false" in err[0]


# -- resume of a finished run -----------------------------------------------------------------

def test_resume_finished_run_nothing_to_do_then_continues(tmp_path, capsys):
    rc, full = train(tmp_path, "--max-steps", "12", name="full")
    rc, run = train(tmp_path, "--max-steps", "8")
    assert rc == 0 and ck_step(run) == 8
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert len(lines) == 1 and "nothing to do" in lines[0] and "--max-steps" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before      # no empty run created
    # raising max_steps continues from step 8 (the schedule is recomputed for 12 steps)
    assert main(["train", "--resume", str(run), "--max-steps", "12", "--quiet"]) == 0
    rest = tmp_path / "r-resume8"
    m = rows(rest)
    assert [r["step"] for r in m] == [8, 9, 10, 11, 12]        # 12: the validation after the last step
    assert open_run(rest).meta["final"]["steps"] == 12 and "valid_ppl" in open_run(rest).meta["final"]
    from dyntool.train.trainer import lr_factor
    from dyntool.train.config import OptimConfig
    f = lr_factor(OptimConfig(warmup_steps=2), 12)
    assert [r["lr"] for r in m[:-1]] == pytest.approx([2e-3 * f(s) for s in range(8, 12)], rel=1e-12)
    # a second resume of the same run gets a fresh name instead of failing
    assert main(["train", "--resume", str(run), "--max-steps", "10", "--quiet"]) == 0
    assert (tmp_path / "r-resume8-2").is_dir()


# -- best validation, eval mode, progress -----------------------------------------------------

def test_best_validation_is_tracked(tmp_path):
    rc, run = train(tmp_path, "--max-steps", "12", "--train.eval_every=2", "--optim.lr=3e-2")
    assert rc == 0
    evals = [(r["val_loss"], r["step"]) for r in rows(run) if "val_loss" in r]
    final = open_run(run).meta["final"]
    assert (final["best_val_loss"], final["best_val_step"]) == min(evals)
    assert final["best_val_ppl"] == pytest.approx(np.exp(min(evals)[0]))
    assert "valid_loss" in final                                     # and the final numbers too


def test_evaluation_runs_in_eval_mode_and_restores_train_mode():
    from dyntool.data.wikitext import load_wikitext
    from dyntool.train.ddp import DistInfo
    from dyntool.train.gpt import GPT
    from dyntool.train.runner import load_config
    from dyntool.train.trainer import Trainer
    cfg = load_config(str(CONFIG), "small", TINY_ARGS)
    corpus = load_wikitext(TINY)
    model = GPT(cfg.model, corpus.vocab_size, cfg.data.block_size)
    tr = Trainer(cfg, model, corpus, DistInfo())
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append((m.training, torch.is_grad_enabled(),
                                                               torch.is_inference_mode_enabled())))
    model.train()
    loss = tr.evaluate("valid")
    assert seen and all(s == (False, False, True) for s in seen)
    assert model.training and all(m.training for m in model.modules())
    # the batched evaluation is the same number as a direct float64 computation
    ref, n = 0.0, 0
    from dyntool.data.wikitext import eval_batches
    model.eval()
    with torch.no_grad():
        for x, y in eval_batches(corpus.valid, 3, cfg.data.block_size):
            logits, _ = model(x)
            ref += torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), y.flatten(),
                                                     reduction="sum").item()
            n += y.numel()
    assert loss == pytest.approx(ref / n, rel=1e-5)
    assert tr.evaluate("valid", batch_size=1) == pytest.approx(loss, rel=1e-5)


def test_progress_and_final_eval_announced_in_a_log(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DYNTOOL_PROGRESS_SECONDS", "0")               # a line per step
    rc, run = train(tmp_path, "--max-steps", "6", quiet=False)
    assert rc == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("r train: ")]     # the run's name first
    assert any(ln.startswith("r train: 3/6 (50%)") for ln in lines), err
    assert all("step/s" in ln and "ETA" in ln and "loss=" in ln and "tok/s=" in ln for ln in lines)
    assert "final evaluation: valid" in err and "--train.final_eval=off" in err and "about " in err
    assert any(ln.startswith("final eval (test): ") for ln in err.splitlines())


def test_deterministic_switch_on_during_training_and_restored(tmp_path, monkeypatch):
    from dyntool.train import trainer as trmod
    seen = []
    orig = trmod.Trainer.train_step

    def spy(self, step):
        seen.append((torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        return orig(self, step)

    monkeypatch.setattr(trmod.Trainer, "train_step", spy)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    rc, _ = train(tmp_path, "--max-steps", "2", "--train.deterministic=true", "--train.final_eval=off")
    assert rc == 0 and seen == [(True, ":4096:8")] * 2
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ


# -- recording flush timer, disk full ---------------------------------------------------------

def test_flush_timer_commits_the_last_row_without_another_append(tmp_path):
    from dyntool.record.reader import RecordReader
    from dyntool.record.store_writer import StoreWriter
    from dyntool.storage import open_backend
    w = StoreWriter(tmp_path / "r.zarr", chunk_steps=100, flush_seconds=0.2)
    w.append(0, {"x": np.ones(3, np.float32)})
    w.append(1, {"x": np.ones(3, np.float32)})
    deadline = time.time() + 20
    while time.time() < deadline and RecordReader(open_backend(tmp_path), "r.zarr").steps_written < 2:
        time.sleep(0.05)
    assert RecordReader(open_backend(tmp_path), "r.zarr").steps_written == 2       # no flush()/close() called
    w.close()


def test_disk_full_marks_failed_and_leaves_no_tmp(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with pytest.raises(OSError) as e:
        with RunWriter.create(tmp_path, "train", {"a": 1}, name="full") as w:
            # every new meta.json write lands on a full device (ENOSPC), like a full disk
            (w.path / "meta.json.tmp").symlink_to("/dev/full")
            w.update_meta(progress=1)
    assert e.value.errno == errno.ENOSPC
    run = open_run(tmp_path / "full")
    assert run.status == "failed" and "No space left" in run.meta["error"]
    assert not os.path.lexists(tmp_path / "full" / "meta.json.tmp")


def test_checkpoint_write_failure_keeps_previous_and_no_tmp(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    from dyntool.train import checkpoint as ck
    p = tmp_path / "checkpoint.pt"
    ck.save({"step": 1}, p)
    (tmp_path / "checkpoint.pt.tmp").symlink_to("/dev/full")
    with pytest.raises(Exception):
        ck.save({"step": 2, "big": torch.zeros(1 << 20)}, p)
    assert torch.load(p, weights_only=True)["step"] == 1
    assert not os.path.lexists(tmp_path / "checkpoint.pt.tmp")


# -- kill -9 campaign and signals (subprocesses) ----------------------------------------------

def _spawn(out, name, max_steps, *extra, ignore_sigint=False):
    argv = [sys.executable, "-m", "dyntool", "train", "--config", str(CONFIG), "--preset", "small",
            "--out", str(out), "--name", name, "--quiet", *TINY_ARGS, "--max-steps", str(max_steps), *extra]
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=pre, env=env, cwd=REPO)


def _wait_rows(proc, run: Path, n: int, timeout: float = 120):
    deadline = time.time() + timeout
    f = run / "metrics.jsonl"
    while time.time() < deadline:
        if f.exists() and f.read_text().count("\n") >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"training ended before row {n}: {proc.stderr.read()}")
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("training too slow")


CAMPAIGN_STEPS = 48
CAMPAIGN_ARGS = ["--train.checkpoint_every=5"]


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory):
    """The uninterrupted run every kill/signal test compares with (made once)."""
    out = tmp_path_factory.mktemp("ref")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(out / "xdg")
    try:
        rc, ref = train(out, "--max-steps", str(CAMPAIGN_STEPS), *CAMPAIGN_ARGS, name="ref")
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old
    assert rc == 0
    return ref


def test_kill_9_campaign_resumes_bitwise(tmp_path, ref_run):
    """kill -9 at 5 moments of a small-preset run (tiny model/corpus, checkpoint every 5 steps):
    every resume from the checkpoint left behind reproduces the uninterrupted run bitwise."""
    extra, ref = CAMPAIGN_ARGS, ref_run
    for i, moment in enumerate((7, 16, 25, 34, 43)):
        name = f"k{i}"
        proc = _spawn(tmp_path, name, CAMPAIGN_STEPS, *extra)
        _wait_rows(proc, tmp_path / name, moment)
        proc.kill()
        assert proc.wait(timeout=60) == -signal.SIGKILL
        killed = tmp_path / name
        assert open_run(killed).status == "running"
        start = ck_step(killed)
        assert start >= 5 and start % 5 == 0
        for ra, rk in zip(rows(ref), rows(killed)):                  # the killed run so far, too
            assert all(ra.get(k) == rk.get(k) for k in KEYS), ra["step"]
        assert main(["train", "--resume", str(killed), "--name", f"{name}-rest", "--quiet"]) == 0
        assert_continues(ref, tmp_path / f"{name}-rest", start)


@pytest.mark.parametrize("sig,ignored", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["sigterm", "sigint-inherited-ignored"])
def test_signal_checkpoints_the_step_reached(tmp_path, sig, ignored, ref_run):
    # checkpoint_every 1000: only the signal writes a checkpoint (same numbers as the ref)
    ref = ref_run
    proc = _spawn(tmp_path, "s", CAMPAIGN_STEPS, "--train.checkpoint_every=1000", ignore_sigint=ignored)
    _wait_rows(proc, tmp_path / "s", 17)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert f"continue with: dyntool train --resume {tmp_path / 's'}" in err      # the exact next step
    run = open_run(tmp_path / "s")
    assert run.status == "interrupted"
    reached = len(rows(tmp_path / "s"))                               # every finished step logged
    assert ck_step(tmp_path / "s") == reached and reached < CAMPAIGN_STEPS
    assert main(["train", "--resume", str(tmp_path / "s"), "--name", "s-rest", "--quiet"]) == 0
    assert_continues(ref, tmp_path / "s-rest", reached)


@pytest.mark.slow
def test_kill_9_campaign_full_small_preset(tmp_path):
    """The same on the real small preset (WikiText-2, 4×4×128, default checkpoint interval)."""
    from dyntool.data.wikitext import resolve_data_dir
    try:
        resolve_data_dir(None)
    except Exception:
        pytest.skip("needs the real WikiText-2")
    steps = 260
    argv = ["train", "--config", str(CONFIG), "--preset", "small", "--out", str(tmp_path), "--quiet",
            "--max-steps", str(steps), "--train.final_eval=off"]
    assert main(argv + ["--name", "ref"]) == 0
    ref = tmp_path / "ref"
    for i, moment in enumerate((105, 130, 170, 205, 230)):
        proc = subprocess.Popen([sys.executable, "-m", "dyntool", *argv, "--name", f"k{i}"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_rows(proc, tmp_path / f"k{i}", moment, timeout=3600)
        proc.kill()
        proc.wait()
        start = ck_step(tmp_path / f"k{i}")
        assert main(["train", "--resume", str(tmp_path / f"k{i}"), "--name", f"k{i}-rest", "--quiet"]) == 0
        assert_continues(ref, tmp_path / f"k{i}-rest", start)


# -- checkpoint contents validated before anything is created (issue 22) ----------------------

@pytest.mark.parametrize("field,value,needle", [
    ("step", -5, "outside"), ("step", "two", "not an integer"), ("step", float("nan"), "not an integer"),
    ("model", "wrong-shapes", "shape"), ("rng", {"torch": 1}, "rng"), ("optim", [1, 2], "optim"),
])
def test_resume_validates_the_checkpoint_before_creating_anything(tmp_path, capsys, field, value, needle):
    import torch
    rc, run = train(tmp_path, "--max-steps", "2", "--train.final_eval=off")
    assert rc == 0
    ck = torch.load(run / "checkpoint.pt", weights_only=True)
    if value == "wrong-shapes":
        k = next(iter(ck["model"]))
        ck["model"][k] = torch.zeros(3, 1)
    else:
        ck[field] = value
    torch.save(ck, run / "checkpoint.pt")
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--max-steps", "4", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "internal error" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before        # no RUN-resumeN left behind


def test_gpu_out_of_memory_is_one_line_and_keeps_the_run(tmp_path, monkeypatch, capsys):
    """A CUDA out-of-memory (seen on an H100 shared by seven runs) is the user's resource limit,
    not an internal error: one line that says what to lower, exit 2 (a run error), the rows so far kept."""
    from dyntool.train.trainer import Trainer
    real = Trainer.train_step

    def step(self, step):
        if step == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.03 GiB. GPU 0 has a total "
                                         "capacity of 79.18 GiB of which 1.49 GiB is free.")
        return real(self, step)
    monkeypatch.setattr(Trainer, "train_step", step)
    rc = main(["train", "--config", str(CONFIG), "--preset", "small", "--out", str(tmp_path), "--name", "oom",
               "--quiet", *TINY_ARGS, "--max-steps", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("dyntool: error: the GPU ran out of memory (CUDA out of memory)") and \
        "data.batch_size" in err[0] and "internal" not in err[0]
    run = open_run(tmp_path / "oom")
    steps = [json.loads(x)["step"] for x in (tmp_path / "oom" / "metrics.jsonl").read_text().splitlines()]
    assert run.status == "failed" and steps == [0, 1]
