"""Faults: signals flush and mark the run; kill -9 leaves it readable; bad input exits 2."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import dyntool
from dyntool.cli import main

LONG_TOY = [sys.executable, "-m", "dyntool", "sim", "toy", "--steps", "1000000",
            "--record.chunk_steps=4", "--record.flush_seconds=0.2"]


def _start(tmp_path, name):
    proc = subprocess.Popen(LONG_TOY + ["--out", str(tmp_path), "--name", name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / name
    deadline = time.time() + 60
    while time.time() < deadline:           # wait until some steps are committed
        try:
            if dyntool.open_run(run_dir).steps_written >= 8:
                return proc, run_dir
        except Exception:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("run never committed steps: " + proc.stderr.read())


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 130), (signal.SIGINT, 130)])
def test_signal_flushes_and_marks_interrupted(tmp_path, sig, code):
    proc, run_dir = _start(tmp_path, "r")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    run = dyntool.open_run(run_dir)
    assert run.status == "interrupted"
    # everything logged is committed: the recorder was flushed on the way out (a step may be
    # recorded but not yet logged when the signal lands between the two)
    assert run.steps_written in (len(run.metrics), len(run.metrics) + 1)
    assert not np.isnan(run.arrays["attn"][:]).any()


def test_kill_9_leaves_run_readable(tmp_path):
    proc, run_dir = _start(tmp_path, "k")
    proc.kill()
    proc.wait(timeout=30)
    run = dyntool.open_run(run_dir)
    assert run.status == "running"            # never got to say otherwise
    n = run.steps_written
    assert n >= 8
    attn = run.arrays["attn"][:]
    assert attn.shape[0] == n and not np.isnan(attn).any()
    np.testing.assert_allclose(attn.sum(-1), 1, atol=1e-5)
    assert len(run.metrics) >= n                     # metrics are line-flushed, at least as far
    assert list(run.steps) == list(range(n))


def test_corrupted_run_is_reported_not_crashed(tmp_path, capsys):
    assert main(["sim", "toy", "--steps", "5", "--out", str(tmp_path), "--name", "c"]) == 0
    run_dir = tmp_path / "c"
    (run_dir / "meta.json").write_text("{not json")
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')                      # a torn last line
    (run_dir / "record.zarr" / "attn" / "zarr.json").write_text("garbage")
    run = dyntool.open_run(run_dir)
    assert any("meta.json is corrupted" in p for p in run.problems)
    assert len(run.metrics) == 5
    assert "attn" not in run.arrays and "compat" in run.arrays
    assert any("attn" in p for p in run.problems)
    assert main(["ls", str(tmp_path)]) == 0
    assert main(["info", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "problem" in out


@pytest.mark.parametrize("argv,needle", [
    (["sim", "toy", "--model.nope=1"], "model.nope"),
    (["sim", "toy", "--lr=-1"], "lr"),
    (["sim", "toy", "--model.T=1"], "model.T"),
    (["info", "/definitely/not/here"], "no run at"),
    (["ls", "/definitely/not/here"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_unwritable_out_dir_and_existing_run_untouched(tmp_path, capsys):
    if os.geteuid() == 0:
        target = "/proc/dyntool-cannot-write-here"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = str(ro / "sub")
    assert main(["sim", "toy", "--steps", "2", "--out", target]) == 2
    err = capsys.readouterr().err
    assert "can't be created" in err or "not writable" in err
    assert main(["sim", "toy", "--steps", "3", "--out", str(tmp_path), "--name", "keep"]) == 0
    before = (tmp_path / "keep" / "metrics.jsonl").read_text()
    assert main(["sim", "toy", "--steps", "9", "--out", str(tmp_path), "--name", "keep"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "keep" / "metrics.jsonl").read_text() == before
    assert json.loads((tmp_path / "keep" / "meta.json").read_text())["status"] == "finished"
