"""Inputs from the bad-input sweep of issue 36 that were internal errors, out-of-memory kills or
silently accepted: each is now one line, exit 2, and leaves nothing on disk."""
from __future__ import annotations

import pytest

from dyntool import safeio
from dyntool.cli import main
from tests.integration.test_train import CONFIG, TINY_ARGS


def refused(argv, tmp_path, monkeypatch, capsys, *expect) -> str:
    """``argv`` (run in ``tmp_path``) exits 2 with one ``dyntool: error:`` line naming ``expect``."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("dyntool: error: "), err
    for e in expect:
        assert e in err, err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())      # no folder, no half-made run
    return err


@pytest.fixture
def small_machine(monkeypatch):
    """8 GiB available, whatever this machine has: the size checks are decided the same way anywhere."""
    monkeypatch.setattr(safeio, "memory_available", lambda: 8 << 30)


def _train(*extra):
    return ["train", "--config", str(CONFIG), "--preset", "small", "--out", "out", "--quiet", *TINY_ARGS, *extra]


# -- sizes that cannot fit: estimated before anything is allocated or created -----------------------

def test_sticky_n_symbols_too_big(tmp_path, monkeypatch, capsys, small_machine):
    """Was: internal error, DefaultCPUAllocator: can't allocate memory (40 GB), and a folder left."""
    refused(["sim", "sticky-markov", "--n_symbols", "100000", "--out", "out"], tmp_path, monkeypatch, capsys,
            "n_symbols", "GiB in memory", "lower n_symbols")


def test_bijection_V_too_big(tmp_path, monkeypatch, capsys, small_machine):
    """Was: internal error, DefaultCPUAllocator: can't allocate memory (154 GB), and a folder left."""
    refused(["sim", "bijection", "--V", "100000000", "--out", "out"], tmp_path, monkeypatch, capsys,
            "config error: V:", "GiB in memory")


def test_train_record_seqs_too_big(tmp_path, monkeypatch, capsys):
    """Was: killed by the kernel (or can't allocate memory) at the first recording step, leaving a
    half-made run.  Room for a training step of the tiny model but not for 1000 probe sequences."""
    monkeypatch.setattr(safeio, "memory_available", lambda: 64 << 20)
    refused(_train("--record.seqs=1000"), tmp_path, monkeypatch, capsys, "record.seqs", "one recording step")


def test_a_run_that_fits_still_trains(tmp_path, monkeypatch):
    """The checks can pass: the same tiny run with one probe sequence fits in the same 64 MiB."""
    monkeypatch.setattr(safeio, "memory_available", lambda: 64 << 20)
    monkeypatch.chdir(tmp_path)
    assert main(_train("--train.max_steps=2", "--name", "r")) == 0
    assert (tmp_path / "out" / "r" / "config.json").is_file()


# -- values outside their meaning ----------------------------------------------------------------

@pytest.mark.parametrize("rho", ["5", "-0.1"])
def test_sticky_rho_is_a_probability(rho, tmp_path, monkeypatch, capsys):
    """Was: internal error, probability tensor contains either inf, nan or element < 0."""
    refused(["sim", "sticky-markov", f"--rho={rho}", "--out", "out"], tmp_path, monkeypatch, capsys,
            "rho:", "[0, 1]")


def test_sticky_heldout_offset_negative(tmp_path, monkeypatch, capsys):
    refused(["sim", "sticky-markov", "--heldout_offset=-1", "--out", "out"], tmp_path, monkeypatch, capsys,
            "heldout_offset", ">= 1")


def test_sticky_record_arms_unknown(tmp_path, monkeypatch, capsys):
    refused(["sim", "sticky-markov", "--record_arms=[sgd,nosuch]", "--out", "out"], tmp_path, monkeypatch, capsys,
            "record_arms", "nosuch")


def test_flush_seconds_negative(tmp_path, monkeypatch, capsys):
    refused(["sim", "toy", "--record.flush_seconds=-1", "--out", "out"], tmp_path, monkeypatch, capsys,
            "record.flush_seconds", ">= 0")


@pytest.mark.parametrize("key", ["record.key_crop", "record.query_crop"])
def test_crop_beyond_T(key, tmp_path, monkeypatch, capsys):
    """Was: exit 0, the crop silently cut to T."""
    refused(["sim", "toy", f"--{key}=[0, 99999]", "--out", "out"], tmp_path, monkeypatch, capsys,
            key, "past the sequence length T=")


def test_model_window_zero(tmp_path, monkeypatch, capsys):
    refused(_train("--model.window=0"), tmp_path, monkeypatch, capsys, "model.window", ">= 1")


# -- output paths ---------------------------------------------------------------------------------

def test_out_name_too_long(tmp_path, monkeypatch, capsys):
    """Was: internal error, OSError: [Errno 36] File name too long."""
    refused(["sim", "toy", "--out", "a" * 300 + "/x"], tmp_path, monkeypatch, capsys, "--out", "255 bytes")


def test_out_unknown_user(tmp_path, monkeypatch, capsys):
    refused(["sim", "toy", "--out", "~nosuchuser_dyntool/x"], tmp_path, monkeypatch, capsys, "no such user")


# -- deprecated keys and flags ------------------------------------------------------------------

def test_deprecated_flag_and_key_warn_in_one_line_each(tmp_path):
    """Was: Python's two-line warning, ``…/cli/__init__.py:150: DeprecatedKeyWarning: flag --window
    is deprecated, use --crop`` then the source line ``  return int(args.fn(args) or 0)``."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "dyntool", "sim", "sticky-markov", "--window", "5",
                        "--record.key_window=[0,3]", "--rho", "7", "--out", "out"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "dyntool: warning: flag --window is deprecated, use --crop",
        "dyntool: warning: config key record.key_window is deprecated, use record.key_crop",
        "dyntool: error: config error: rho: a self-transition probability in [0, 1], got 7.0"], r.stderr
    assert list(tmp_path.iterdir()) == []


# -- train --resume of a damaged run, --parallel without torchrun ---------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny run with its checkpoint.pt (2 steps)."""
    import os
    out = tmp_path_factory.mktemp("trained")
    cwd = os.getcwd()
    try:
        os.chdir(out)
        assert main(_train("--train.max_steps=2", "--name", "r")) == 0
    finally:
        os.chdir(cwd)
    assert (out / "out" / "r" / "checkpoint.pt").is_file()
    return out / "out" / "r"


def _copy(trained, tmp_path):
    import shutil
    src = tmp_path / "src"
    shutil.copytree(trained, src)
    return src


def _resume_refused(src, tmp_path, monkeypatch, capsys, *expect):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train", "--resume", str(src), "--out", "new", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("dyntool: error: cannot resume"), err
    for e in expect:
        assert e in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_resume_config_train_not_a_section(trained, tmp_path, monkeypatch, capsys):
    """Was: internal error, TypeError: 'int' object does not support item assignment."""
    import json
    src = _copy(trained, tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["train"] = 5
    (src / "config.json").write_text(json.dumps(cfg))
    _resume_refused(src, tmp_path, monkeypatch, capsys, "'train' that is not a section")


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_resume_checkpoint_not_a_file(kind, trained, tmp_path, monkeypatch, capsys):
    """Was: "no checkpoint.pt, it stopped before its first checkpoint" (it had one, damaged)."""
    import os
    src = _copy(trained, tmp_path)
    ck = src / "checkpoint.pt"
    ck.unlink()
    os.mkfifo(ck) if kind == "fifo" else ck.mkdir()
    _resume_refused(src, tmp_path, monkeypatch, capsys,
                    "checkpoint.pt is " + ("not a regular file" if kind == "fifo" else "a folder"))


def test_parallel_without_torchrun_says_so(tmp_path, monkeypatch, capsys):
    """Was: --parallel fsdp in one process trained without a word."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(_train("--train.max_steps=1", "--parallel=fsdp", "--name", "r")) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert err == ["dyntool: warning: train.parallel=fsdp needs the processes torchrun starts "
                   "(torchrun --nproc_per_node=N -m dyntool train ...); training as one process"]


# -- a full disk during train --------------------------------------------------------------------

def test_full_disk_while_checkpointing_is_one_line_and_the_run_stays_readable(tmp_path, monkeypatch, capsys):
    """torch's zip writer reports ENOSPC as ``RuntimeError: [enforce fail at inline_container.cc]
    … unexpected pos`` (measured on a 3 MB tmpfs): was an internal error."""
    import collections
    import shutil
    from pathlib import Path

    import torch

    from dyntool.run import open_run
    real_save, real_usage = torch.save, shutil.disk_usage

    full = []

    def full_save(obj, f, *a, **k):
        if "checkpoint" in str(f):
            full.append(f)                                  # the disk fills up now
            Path(f).write_bytes(b"PK\x03\x04partial")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2883328 vs 2883220")
        return real_save(obj, f, *a, **k)

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(torch, "save", full_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 0) if full
                        else real_usage(p))
    monkeypatch.chdir(tmp_path)
    assert main(_train("--train.max_steps=6", "--train.checkpoint_every=2", "--record.every=1",
                       "--name", "r")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("dyntool: error: the disk is full"), err
    run = open_run(tmp_path / "out" / "r")
    assert run.meta["status"] == "failed" and not run.problems
    assert len(run.metrics) >= 2 and run.steps_written >= 1
    monkeypatch.undo()
    assert main(["check", str(tmp_path / "out" / "r")]) == 0
