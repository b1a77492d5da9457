"""Per-step scalars to TensorBoard (read back with tensorboard's EventAccumulator) and W&B."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from dyntool.cli import main
from dyntool.run import open_run
from dyntool.run_writer import RunWriter
from dyntool.sinks import SinkCallback, export_scalars, scalars

STEPS = [0, 3, 6]


@pytest.fixture
def run(tmp_path):
    rng = np.random.default_rng(1)
    with RunWriter.create(tmp_path, "test", {}, name="r") as w:
        st = w.open_store(chunk_steps=2)
        for s in STEPS:
            st.append(s, {"logit_max": rng.random((2, 2)).astype(np.float32),
                          "attn_entropy": rng.random((2, 2, 1, 5)).astype(np.float32)})
        for s in range(8):
            w.log(s, loss=1.0 / (s + 1), val_loss=float("nan"), recorded=True, tag="a")
    return open_run(tmp_path / "r")


def _events(logdir):
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                 reason="tensorboard not installed (pip install 'dyntool[tensorboard]')")
    ea = ea_mod.EventAccumulator(str(logdir), size_guidance={ea_mod.SCALARS: 0})
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}


def test_scalars_keep_finite_numbers_only():
    assert scalars({"step": 3, "loss": 2.0, "v": float("nan"), "ok": True, "s": "x", "n": 4, "z": None}) == \
        {"loss": 2.0, "n": 4.0}


def test_tensorboard_export_holds_the_scalars(run, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'dyntool[tensorboard]')")
    tb = tmp_path / "tb"
    assert main(["export", str(run.path), "--to-tensorboard", str(tb)]) == 0
    ev = _events(tb)
    assert [s for s, _ in ev["loss"]] == list(range(8))
    np.testing.assert_allclose([v for _, v in ev["loss"]], 1.0 / np.arange(1, 9), rtol=1e-7)
    assert "val_loss" not in ev and "recorded" not in ev
    lm, ent = run.arrays["logit_max"][:], run.arrays["attn_entropy"][:].astype(np.float64)
    for l in range(2):
        for h in range(2):
            got = ev[f"record/logit_max/L{l}H{h}"]
            assert [s for s, _ in got] == STEPS
            np.testing.assert_allclose([v for _, v in got], lm[:, l, h], rtol=1e-7)
            got = ev[f"record/attn_entropy/L{l}H{h}"]
            np.testing.assert_allclose([v for _, v in got], ent[:, l, h].mean(axis=(1, 2)), rtol=1e-6)


def test_tensorboard_export_refuses_a_folder_with_an_event_file(run, tmp_path, capsys):
    """Was: a second event file beside the first, so TensorBoard showed every scalar twice."""
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'dyntool[tensorboard]')")
    tb = tmp_path / "tb"
    assert main(["export", str(run.path), "--to-tensorboard", str(tb)]) == 0
    capsys.readouterr()
    before = sorted(tb.iterdir())
    assert main(["export", str(run.path), "--to-tensorboard", str(tb)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "already holds an event file" in err
    assert sorted(tb.iterdir()) == before and len(before) == 1


def test_tensorboard_live_callback(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'dyntool[tensorboard]')")
    from dyntool.sinks import TensorBoardSink
    cb = SinkCallback(TensorBoardSink(tmp_path / "live"))
    for s in range(4):
        cb.on_step_end(s, {"loss": float(s), "logit_max/L0H0": 2.0 * s, "recorded": True})
    cb.on_train_end({})
    ev = _events(tmp_path / "live")
    assert ev["logit_max/L0H0"] == [(s, 2.0 * s) for s in range(4)]


def test_wandb_sink_calls(run, monkeypatch):
    """The W&B sink's contract with the wandb API (a stand-in module: no network, no account)."""
    calls = []

    class FakeRun:
        def log(self, d, step):
            calls.append(("log", step, d))

        def finish(self):
            calls.append(("finish",))

    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)) or FakeRun())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    assert main(["export", str(run.path), "--to-wandb", "proj", "--at-steps", "0:4"]) == 0
    assert calls[0][0] == "init" and calls[0][1]["project"] == "proj" and calls[0][1]["name"] == "r"
    logs = [c for c in calls if c[0] == "log"]
    assert [c[1] for c in logs if "loss" in c[2]] == [0, 1, 2, 3]
    assert [c[1] for c in logs if "record/logit_max/L0H0" in c[2]] == [0, 3]
    assert calls[-1] == ("finish",)


def test_missing_wandb_is_one_line(run, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)           # import wandb -> ImportError
    assert main(["export", str(run.path), "--to-wandb", "proj"]) == 2
    err = capsys.readouterr().err.strip()
    assert "wandb is not installed" in err and len(err.splitlines()) == 1


def test_export_needs_a_destination(run, capsys):
    assert main(["export", str(run.path)]) == 2
    assert "nothing to do" in capsys.readouterr().err


@pytest.mark.slow
def test_wandb_offline_for_real(run, tmp_path, monkeypatch):
    """The real wandb client, offline (no network): one offline run directory with its log."""
    pytest.importorskip("wandb", reason="wandb not installed")
    for k, v in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(k, v)
    assert main(["export", str(run.path), "--to-wandb", "dyntool-test"]) == 0
    files = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1 and files[0].stat().st_size > 0


def test_tensorboard_bad_input_leaves_nothing(run, tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'dyntool[tensorboard]')")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["export", str(run.path), "--to-tensorboard", str(blocker / "tb")]) == 2
    err = capsys.readouterr().err.strip()
    assert "can't be written" in err and len(err.splitlines()) == 1
    assert main(["export", str(run.path), "--to-tensorboard", str(tmp_path / "a" / "tb"), "--at-steps", "x:y"]) == 2
    assert "bad --at-steps item" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
