"""The ``device`` key of ``dyntool sim bijection`` and of the separable sticky model (issue 34): on the
CPU (the default) a run is byte for byte what it was without the key; a CUDA device this machine
lacks is one line on stderr, exit 2, and nothing is created; the loop moves the model, every
training batch and the held-out set to the resolved device; the GPU's deferred finiteness check
(read on logged steps) fails a run where it should.  No GPU is needed: CUDA is hidden or faked."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dyntool
from dyntool.cli import main
from dyntool.sims import bijection

REPO = Path(__file__).resolve().parents[2]
CI = ["sim", "bijection", "--config", "bijection", "--preset", "ci", "--quiet"]
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _digest(run_dir: Path) -> dict:
    """Every recorded and static array (sha256 of its bytes), the metrics rows without wall times,
    the config and the meta's device: what a run must keep byte for byte."""
    run = dyntool.open_run(run_dir)
    st = run.store
    arrays = {n: hashlib.sha256(np.ascontiguousarray(st[n][:]).tobytes()).hexdigest() for n in st.names()}
    arrays.update({f"static/{n}": hashlib.sha256(np.ascontiguousarray(run.static(n)).tobytes()).hexdigest()
                   for n in run.static_names})
    metrics = run.metrics.drop(columns=["elapsed_s"])
    return {"arrays": arrays, "metrics": metrics.to_json(double_precision=15), "config": run.config,
            "device": run.meta["device"]}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dev")
    assert main(CI + ["--out", str(out), "--name", "default"]) == 0
    return _digest(out / "default")


@pytest.mark.parametrize("flag", [["--device", "cpu"], ["--device=cpu"]])
def test_device_cpu_is_byte_identical_to_no_option(default_run, tmp_path, flag):
    assert main(CI + ["--out", str(tmp_path), "--name", "cpu", *flag]) == 0
    got = _digest(tmp_path / "cpu")
    assert len(got["arrays"]) > 20 and any(n.startswith("static/") for n in got["arrays"])
    assert got == default_run
    assert got["config"]["device"] == "cpu" and got["device"] == "cpu"


def test_the_gpu_deferred_loss_check_changes_no_number(default_run, tmp_path, monkeypatch):
    """The branch a GPU takes (no per-step check, an on-device flag read on logged steps) on the CPU."""
    monkeypatch.setattr(bijection, "checks_loss_each_step", lambda dev: False)
    assert main(CI + ["--out", str(tmp_path), "--name", "deferred"]) == 0
    assert _digest(tmp_path / "deferred") == default_run


def test_the_loop_moves_model_batches_and_heldout_to_the_resolved_device(tmp_path, monkeypatch):
    """Every tensor the run feeds the model is on the device the config resolved to (a distinct
    ``torch.device`` object, told apart by identity): the model and the held-out tokens and targets
    come through ``.to(dev)`` once; the training batches are drawn there (issue 46: no copy per step),
    from a generator made on that device."""
    dev = torch.device("cpu")
    monkeypatch.setattr(bijection, "resolve", lambda name: dev)
    moved, modules = [], []
    tensor_to, module_to = torch.Tensor.to, torch.nn.Module.to

    def spy_tensor(self, *a, **kw):
        if a and a[0] is dev:
            moved.append(tuple(self.shape))
        return tensor_to(self, *a, **kw)

    def spy_module(self, *a, **kw):
        if a and a[0] is dev:
            modules.append(type(self).__name__)
        return module_to(self, *a, **kw)
    monkeypatch.setattr(torch.Tensor, "to", spy_tensor)
    monkeypatch.setattr(torch.nn.Module, "to", spy_module)
    gens, generator = [], torch.Generator

    def spy_generator(device="cpu"):
        gens.append(device)
        return generator(device=device)
    monkeypatch.setattr(bijection.torch, "Generator", spy_generator)
    assert main(CI + ["--out", str(tmp_path), "--name", "spy", "--device=cpu"]) == 0
    T = 2 * 19 + 1
    assert modules == ["GPT"]
    assert moved.count((24, T)) == 2                       # held-out tokens and targets (heldout_seqs 24)
    assert len(moved) == 2                                 # no batch is copied
    assert gens == ["cpu", dev]        # the held-out set's on the CPU, the batches' on the device
    assert dyntool.open_run(tmp_path / "spy").meta["device"] == "cpu"


def _nan_at_train_call(monkeypatch, k: int) -> None:
    """The k-th training loss (batch_size 8; the probe's batch is 2) becomes NaN."""
    calls, real = [], bijection.task_loss

    def task_loss(scores, tokens, targets, V, task):
        loss = real(scores, tokens, targets, V, task)
        if tokens.shape[0] == 8 and torch.is_grad_enabled():
            calls.append(1)
            if len(calls) == k + 1:
                return loss * float("nan")
        return loss
    monkeypatch.setattr(bijection, "task_loss", task_loss)


@pytest.mark.parametrize("deferred, fails_at", [(False, 3), (True, 4)])
def test_a_non_finite_loss_fails_the_run(tmp_path, monkeypatch, capsys, deferred, fails_at):
    """Step 3's loss is NaN: the CPU check stops at step 3; the deferred one at the next logged step
    (log_every 2: step 4), and the run is marked failed either way."""
    _nan_at_train_call(monkeypatch, 3)
    if deferred:
        monkeypatch.setattr(bijection, "checks_loss_each_step", lambda dev: False)
    assert main(CI + ["--out", str(tmp_path), "--name", "nan"]) == 3
    err = capsys.readouterr().err
    assert f"non-finite loss at step {fails_at}" in err and "Traceback" not in err
    assert dyntool.open_run(tmp_path / "nan").status == "failed"


@pytest.mark.parametrize("flag", [["--device", "cuda"], ["--device=cuda:0"]])
def test_cuda_without_a_gpu_is_one_line_exit_2_and_nothing_is_made(tmp_path, monkeypatch, capsys, flag):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "runs"
    assert main(CI + ["--out", str(out), *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "device" in err and "no CUDA GPU" in err
    assert not out.exists()


def test_cuda_from_a_config_file_and_a_bad_name_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = tmp_path / "gpu.toml"
    cfg.write_text('device = "cuda"\nsteps = 2\n')
    out = tmp_path / "runs"
    assert main(["sim", "bijection", "--config", str(cfg), "--quiet", "--out", str(out)]) == 2
    assert main(CI + ["--out", str(out), "--device=gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no CUDA GPU" in err[0] and "cpu, cuda or cuda:N" in err[1]
    assert not out.exists()


def test_the_command_and_the_separable_script_refuse_a_hidden_gpu(tmp_path):
    """As a user sees it: a process with CUDA hidden, one line on stderr, exit 2, no folder."""
    out = tmp_path / "runs"
    commands = [[sys.executable, "-m", "dyntool", *CI, "--out", str(out), "--device", "cuda"],
                [sys.executable, str(REPO / "scripts" / "sticky_separable.py"), "--steps", "2", "--T", "20",
                 "--seeds", "1", "--out", str(out), "--device", "cuda"]]
    for cmd in commands:
        p = subprocess.run(cmd, env=NO_GPU, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "cuda requested but no CUDA GPU is visible" in lines[0], p.stderr
        assert not out.exists()
