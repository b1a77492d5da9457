"""Faults: signals flush and mark the run; kill -9 leaves it readable; bad input exits 2."""
import functools
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


# -- bad input: one table ------------------------------------------------------------------------
# Every case must exit with its code, print exactly one line on stderr (no traceback), leave no
# new file or directory anywhere (cwd included: default output folders live there) and leave the
# existing run byte for byte as it was.  The commands run in-process; {tmp} is the workspace,
# {keep} an existing finished run, {ro} an --out that can't be created, {file} a regular file.
RO_ROOT = "/proc/dyntool-cannot-write-here"      # root ignores chmod; /proc refuses even root
TRAIN = ["train", "--config", "wikitext_mhsa", "--quiet"]
CUDA = __import__("torch").cuda.is_available()
BAD_INPUT = [
    # config values (issue 12, item 6): one validation layer
    (["sim", "toy", "--model.nope=1"], "model.nope"),
    (["sim", "toy", "--lr=-1"], "lr"),
    (["sim", "toy", "--model.T=1"], "model.T"),
    (["sim", "toy", "--model.d_k=0"], "model.d_k"),
    (["sim", "toy", "--model.d_v=-3"], "model.d_v"),
    (["sim", "toy", "--model.n_classes=0"], "model.n_classes"),
    (["sim", "toy", "--model.init_std=-1"], "model.init_std"),
    (["sim", "toy", "--lr=1e400"], "finite"),
    (["sim", "toy", "--lr=nan"], "finite"),
    (["sim", "toy", "--seed=1e30"], "seed"),
    (["sim", "toy", "--seed", "-1"], "seed"),
    (["sim", "toy", "--steps", "abc"], "steps"),
    (["sim", "toy", "--steps", "0"], "steps"),
    (["sim", "toy", "--step=3"], "step"),                  # no prefix matching of flags
    (["sim", "toy", "--record.dtype=int8"], "record.dtype"),
    (["sim", "toy", "--config", "nope.toml"], "no such file"),
    (["sim", "toy", "--preset", "nope"], "unknown preset"),
    (["sim", "sticky-markov", "--n_symbols=0"], "n_symbols"),
    (["sim", "sticky-markov", "--d_k=0"], "d_k"),
    (["sim", "sticky-markov", "--seeds=1e25"], "seeds"),
    (["sim", "sticky-markov", "--seeds", ","], "at least one seed"),
    (["sim", "sticky-markov", "--n-seeds", "0"], "--n-seeds"),
    (["sim", "sticky-markov", "--n-seeds", "2", "--seeds", "1,2"], "not both"),
    (["sim", "sticky-markov", "--value-lr-mult", "1,2"], "value_lr_mult"),
    (["sim", "sticky-markov", "--arms", "sgd,nope"], "arms"),
    (TRAIN + ["--seed=-1"], "seed"),
    (TRAIN + ["--seed=4294967296"], "seed"),
    (TRAIN + ["--device=bogus"], "device"),
    (TRAIN + ["--train.threads=-1"], "train.threads"),
    (TRAIN + ["--optim.lr=1e400"], "optim.lr"),
    (TRAIN + ["--model.init_std=-1"], "model.init_std"),
    (TRAIN + ["--model.n_embd=0"], "model.n_embd"),
    (TRAIN + ["--optim.beta2=1.5"], "optim.beta2"),
    (TRAIN + ["--span.alpha_q=-1"], "span"),
    (TRAIN + ["--max-steps", "0"], "max_steps"),
    (TRAIN + ["--model.attention=ls", "--model.n_local=9"], "model.n_local"),
    (["train"], "--config"),
    (TRAIN + ["--data.path={tmp}/no-data"], "wikitext-2 directory not found"),   # default --out
    (TRAIN + ["--model.attention=rnn", "--out", "{tmp}/new/deeper"], "model.attention"),
    (["train", "--resume", "{tmp}/missing"], "cannot resume"),
    # studies (item 7)
    (["study", "span", "--n-seeds", "0"], "--n-seeds"),
    (["study", "span", "--n-seeds", "-1"], "--n-seeds"),
    (["study", "span", "--seeds", "-1"], "seeds"),
    (["study", "span", "--seeds", "0,0"], "repeats"),
    (["study", "span", "--max-steps", "0"], "max_steps"),
    (["study", "ls-logits", "--optim.lr=inf"], "optim.lr"),
    (["study", "span", "--out", "{ro}"], "output directory"),
    (["sim", "sticky-markov", "--out", "{ro}"], "output directory"),
    # paths (item 8): no run inside a run, no name outside --out
    (["sim", "toy", "--out", "{keep}"], "inside the run"),
    (["sim", "toy", "--out", "{keep}/sub"], "inside the run"),
    (["sim", "sticky-markov", "--out", "{keep}"], "inside the run"),
    (["sim", "toy", "--name", "../../../x"], "--name"),
    (["sim", "toy", "--name", "a/b"], "--name"),
    (["sim", "toy", "--name", ".."], "--name"),
    (["study", "span", "--name", "../s"], "--name"),
    (["sim", "toy", "--steps", "9", "--out", "{tmp}/runs", "--name", "keep"], "already exists"),
    (["sim", "toy", "--out", "{ro}"], "output directory"),
    (["sim", "toy", "--out", "{file}/sub"], "not a directory"),
    # figures (item 9)
    (["figures", "{keep}", "--out", "{ro}"], "output directory"),
    (["figures", "{keep}", "--out", "{keep}/figs"], "inside the run"),
    (["figures", "{keep}", "--out", "{tmp}/f", "--dpi", "100000"], "--dpi"),
    (["figures", "{keep}", "--out", "{tmp}/f", "--dpi", "10"], "--dpi"),
    (["figures", "{keep}", "--out", "{tmp}/f", "--only", "nope"], "unknown figure"),
    (["figures", "{tmp}/nothing-here", "--out", "{tmp}/f"], "does not exist"),
    # reading commands and the parser
    (["info", "/definitely/not/here"], "no run at"),
    (["ls", "/definitely/not/here"], "does not exist"),
    (["ls", "--foo=1"], "--foo"),
    (["bogus-command"], "invalid choice"),
    (["sim", "toy", "stray"], "unrecognized"),
] + ([] if CUDA else [
    (TRAIN + ["--preset", "gpu"], "--device=cpu"),           # issue 14: a gpu preset on a CPU machine
    (TRAIN + ["--device=cuda"], "device"),
])


def _tree(root):
    """Every path under root with its bytes (files) — the whole observable state."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = p.read_bytes() if p.is_file() else None
    return out


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    assert main(["sim", "toy", "--steps", "3", "--out", str(tmp / "runs"), "--name", "keep", "--quiet"]) == 0
    (tmp / "a-file").write_text("x")
    return tmp


@pytest.mark.parametrize("argv,needle", BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(argv, needle, workspace, capsys, monkeypatch):
    monkeypatch.chdir(workspace)                     # default output folders (runs/...) land here
    monkeypatch.delenv("DYNTOOL_DEBUG", raising=False)
    ro = RO_ROOT
    if os.geteuid() != 0:
        (workspace / "ro").mkdir(exist_ok=True)
        (workspace / "ro").chmod(0o500)
        ro = str(workspace / "ro" / "sub")
    before = _tree(workspace)
    subst = {"{tmp}": str(workspace), "{keep}": str(workspace / "runs" / "keep"), "{ro}": ro,
             "{file}": str(workspace / "a-file")}
    argv = [functools.reduce(lambda a, kv: a.replace(*kv), subst.items(), x) for x in argv]
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (code, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    assert _tree(workspace) == before                # nothing created, the existing run unchanged
    assert json.loads((workspace / "runs" / "keep" / "meta.json").read_text())["status"] == "finished"


def test_rejected_after_creation_is_cleaned_up(tmp_path, monkeypatch):
    """Input that is only found bad once the run folder exists still leaves nothing behind."""
    from dyntool import paths
    from dyntool.errors import ConfigError
    out = tmp_path / "new" / "deeper"
    with pytest.raises(ConfigError):
        with paths.cleanup_on_reject(out):
            (out / "run-1").mkdir(parents=True)
            raise ConfigError("x", "found late")
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "kept").mkdir()
    with pytest.raises(ConfigError):
        with paths.cleanup_on_reject(tmp_path / "old"):
            (tmp_path / "old" / "made").mkdir()
            raise ConfigError("x", "found late")
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["kept"]
    with pytest.raises(ConfigError):                 # a run that recorded rows keeps them
        with paths.cleanup_on_reject(tmp_path / "old"):
            (tmp_path / "old" / "ran").mkdir()
            (tmp_path / "old" / "ran" / "metrics.jsonl").write_text('{"step": 0}\n')
            raise ConfigError("x", "found late")
    assert (tmp_path / "old" / "ran" / "metrics.jsonl").is_file()
