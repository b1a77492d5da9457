"""A newcomer's first hour (issue 50): what a fresh clone that is *not* beside ``shared/`` meets.

The clone is real: this checkout's ``dyntool/`` and ``tests/data/tiny_wikitext`` copied into a
temporary folder and run from there with ``PYTHONPATH`` (so its repository root, unlike this
one's, has no ``../shared/data/wikitext-2``), from a working directory that has none either, with
an empty Hugging Face cache.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--data.batch_size=4", "--data.block_size=16", "--data.eval_batch_size=8", "--data.eval_max_batches=0",
         "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--optim.warmup_steps=2",
         "--train.eval_every=0", "--record.every=3", "--train.final_eval=off"]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fresh")
    repo = root / "dyntool-clone"
    shutil.copytree(REPO / "dyntool", repo / "dyntool", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tests" / "data" / "tiny_wikitext", repo / "tests" / "data" / "tiny_wikitext")
    (root / "work").mkdir()
    assert not (root / "shared").exists()
    return repo


def dyntool(clone: Path, *argv: str, env: dict | None = None, timeout: float = 120):
    """``python -m dyntool ARGV`` from the clone, in its ``work`` folder, in a shell that knows
    nothing of this checkout (no ``$DYNTOOL_WIKITEXT``, a fresh hub cache) plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DYNTOOL_", "HF_"))}
    base.update(PYTHONPATH=str(clone), HF_HOME=str(clone.parent / "hf"), PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "dyntool", *argv], cwd=clone.parent / "work",
                       env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


@pytest.fixture
def new_shell(tmp_path, monkeypatch):
    """In-process (a subprocess per command costs ~10 s of imports on a loaded machine): a
    repository root and working directory with no ``shared/`` beside them, no hub, no env var."""
    import dyntool.data.sources as sources
    monkeypatch.setattr(sources, "repo_root", lambda: tmp_path / "clone")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    for k in [k for k in os.environ if k.startswith(("DYNTOOL_", "HF_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return monkeypatch


def start_half(runs: Path, data: Path, monkeypatch) -> Path:
    """A run started with ``$DYNTOOL_WIKITEXT`` and stopped at step 2 of 4 (a checkpoint)."""
    from dyntool.cli import main
    with monkeypatch.context() as m:
        m.setenv("DYNTOOL_WIKITEXT", str(data))
        assert main(["train", "--config", "wikitext_mhsa", "--preset", "small", "--max-steps", "4",
                     "--train.stop_at=2", "--out", str(runs), "--name", "half", "--quiet", *SMALL]) == 0
    assert json.loads((runs / "half" / "meta.json").read_text())["data_path"] == str(data)
    return runs / "half"


def test_resume_from_a_new_shell_reads_the_data_folder_the_run_recorded(new_shell, tmp_path):
    """Item 2: started with ``DYNTOOL_WIKITEXT``, resumed from a shell without it: the resume reads
    the folder meta.json records (it used to search again and find no WikiText)."""
    from dyntool.cli import main
    data = REPO / "tests" / "data" / "tiny_wikitext"
    half = start_half(tmp_path / "runs", data, new_shell)
    assert main(["train", "--resume", str(half), "--name", "rest", "--quiet"]) == 0
    rest = tmp_path / "runs" / "rest"
    meta = json.loads((rest / "meta.json").read_text())
    assert meta["data_path"] == str(data) and meta["resumed_from"]["step"] == 2
    assert json.loads((rest / "config.json").read_text())["data"]["path"] == str(data)


def test_resume_says_when_the_recorded_data_folder_is_gone(new_shell, tmp_path, capsys):
    """The recorded folder moved away: one warning line, then the usual search (which here finds
    nothing and is refused in one line, exit 2, no new run)."""
    from dyntool.cli import main
    data = tmp_path / "moved"
    shutil.copytree(REPO / "tests" / "data" / "tiny_wikitext", data)
    half = start_half(tmp_path / "runs", data, new_shell)
    shutil.rmtree(data)
    capsys.readouterr()
    assert main(["train", "--resume", str(half), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"the run read its data from {data}, which is not a folder here" in err and "Traceback" not in err
    assert sorted(x.name for x in (tmp_path / "runs").iterdir()) == ["half"]


def test_first_train_command_without_shared_names_the_env_var_and_the_tiny_corpus_fast(clone):
    """Item 3: the README's first training command, in a clone not beside ``shared/``, with a hub
    endpoint that accepts connections and never answers (a firewall's black hole): refused in one
    line within a minute even on a loaded machine (it hung for minutes), naming
    ``$DYNTOOL_WIKITEXT`` and the bundled corpus by its path."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        runs = clone.parent / "runs-first"
        p, took = dyntool(clone, "train", "--config", "wikitext_mhsa", "--preset", "small", "--max-steps", "20",
                          "--train.eval_every=0", "--out", str(runs),
                          env={"HF_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}"}, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("dyntool: error")]
    assert len(errors) == 1, p.stderr
    tiny = clone / "tests" / "data" / "tiny_wikitext"
    assert "$DYNTOOL_WIKITEXT" in errors[0] and f"--data.path={tiny}" in errors[0], errors[0]
    assert "did not answer within 5 s" in errors[0], errors[0]
    assert took < 60, took         # a 5 s probe plus the imports; 37 s seen at load 10 (it hung for minutes)
    assert not runs.exists() or not any(runs.iterdir())
    assert (tiny / "train.txt").is_file()      # what it names is there (it trains: test_train.py)


def test_info_on_a_study_shows_the_table_the_study_printed(tmp_path, capsys):
    """Item 5: ``info STUDY`` printed flattened summary.json keys (``final.sgd.final_loss.mean=…``);
    it shows the arms' table the study printed when it finished."""
    from dyntool.cli import main
    assert main(["sim", "sticky-markov", "--steps", "4", "--T", "40", "--seeds", "1", "--arms", "sgd,em",
                 "--out", str(tmp_path), "--name", "st", "--quiet"]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln and not ln.startswith("study written")]
    assert sum(ln.startswith(("arm ", "sgd ", "em ")) for ln in printed) >= 3, printed
    assert main(["info", str(tmp_path / "st")]) == 0
    info = capsys.readouterr().out.splitlines()
    shown = [ln[2:] for ln in info if ln.startswith("  ") and ln.strip()]
    assert shown == printed                   # every line of the table, in its order
    assert not any("final.sgd" in ln or "entropy_gap." in ln for ln in info), info
    assert any(ln.startswith("seed1-sgd ") for ln in info)                    # and the runs table


def test_info_on_an_interrupted_run_says_why_and_the_command_that_continues_it(tmp_path, capsys, monkeypatch):
    """Item 5: a SIGTERM during step 3 (held to the end of the step, as ``kill`` would be): ``info``
    says it stopped by SIGTERM and prints the command that continues it, which does."""
    import signal
    from dyntool.cli import main
    from dyntool.train.recording import MetricsLogger
    from tests.integration.test_train import TINY_ARGS
    logged = MetricsLogger.on_step_end

    def sigterm_at_3(self, step, metrics):
        logged(self, step, metrics)
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(MetricsLogger, "on_step_end", sigterm_at_3)
    argv = ["train", "--config", "wikitext_mhsa", "--preset", "small", "--max-steps", "8", "--out", str(tmp_path),
            "--name", "cut", "--quiet", *TINY_ARGS, "--train.final_eval=off"]
    assert main(argv) == 130
    monkeypatch.setattr(MetricsLogger, "on_step_end", logged)
    capsys.readouterr()
    assert main(["info", str(tmp_path / "cut")]) == 0
    rows = {ln[:9].strip(): ln[9:] for ln in capsys.readouterr().out.splitlines() if ln[:1].strip()}
    assert rows["status"] == "interrupted" and rows["stopped"].startswith("by SIGTERM (signal 15"), rows
    assert rows["continue"] == f"dyntool train --resume {tmp_path / 'cut'}", rows
    assert main(rows["continue"].split()[1:] + ["--quiet"]) == 0
    assert json.loads((tmp_path / "cut-resume4" / "meta.json").read_text())["final"]["steps"] == 8


def test_the_cpu_kernel_reason_is_a_statement_not_an_instruction(monkeypatch):
    """Item 5: a CPU run's meta and ``info`` said "set TRITON_INTERPRET=1 …", which reads like
    something the user must do; the interpreter is for tests."""
    pytest.importorskip("triton")
    from dyntool.kernels import unavailable
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    why = unavailable("cpu")
    assert why is not None and "TRITON_INTERPRET" not in why and "CUDA" in why, why


def test_an_interrupted_simulation_with_a_name_says_to_change_it(tmp_path, monkeypatch, capsys):
    """Item 6: "the same command starts it again" was wrong with ``--name``: that folder now exists
    and the same command is refused.  The hint says to change or drop the name."""
    from dyntool.cli import main

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr("dyntool.sims.toy.run_toy", interrupted)
    assert main(["sim", "toy", "--out", str(tmp_path), "--name", "mine"]) == 130
    err = capsys.readouterr().err
    assert "the same command with another --name (or none; mine is kept) starts it again" in err, err
    assert "the same command starts it again" not in err


def test_a_new_run_reads_the_commit_without_locking_the_checkouts_index(monkeypatch):
    """Item 11: every new run ran ``git status``, which takes ``.git/index.lock`` to refresh the
    index, and so could make a developer's concurrent ``git commit`` in the checkout fail.  The
    commit and dirty flag are still read (this checkout is a git repository)."""
    import subprocess as sp
    from dyntool import run_writer
    calls = []
    real = sp.run

    def spy(argv, *a, **k):
        calls.append(list(argv))
        return real(argv, *a, **k)
    monkeypatch.setattr(run_writer.subprocess, "run", spy)
    got = run_writer._git_commit()
    status = [c for c in calls if "status" in c]
    assert status and all(c[:2] == ["git", "--no-optional-locks"] for c in status), calls
    if (REPO / ".git").exists():
        assert got["git_commit"] and isinstance(got["git_dirty"], bool)


def test_train_resume_of_a_simulation_run_says_what_it_is(tmp_path, capsys):
    """Item 11: ``train --resume`` of a simulation run said "unknown key steps"."""
    from dyntool.cli import main
    assert main(["sim", "toy", "--steps", "2", "--out", str(tmp_path), "--name", "sim", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "sim")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "it is a 'toy' run, not one `dyntool train` wrote" in err[0], err
    assert f"continue it with: dyntool sim toy --resume {tmp_path / 'sim'}" in err[0]     # issue 46
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim"]


def test_an_out_path_past_path_max_is_one_short_line(tmp_path, capsys):
    """Item 11: an ``--out`` past PATH_MAX was an internal error echoing the 5 kB path."""
    from dyntool.cli import main
    deep = tmp_path.joinpath(*["d" * 200] * 25)
    assert main(["sim", "toy", "--steps", "2", "--out", str(deep), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and len(err[0]) < 300 and "path limit is 4096" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_ls_lists_a_studys_runs_together_in_seed_order(tmp_path, capsys):
    """Item 6: ``ls`` listed a study's runs by creation time to the second (seeds interleaved and
    ``seed2024`` before ``seed42``); a folder's runs now come together, seeds in numeric order."""
    from dyntool.cli import main
    from tests.app import fixtures
    fixtures.make_sticky_study(tmp_path, name="st", seeds=(42, 2024, 7), T=16, crop=(8, 16), pool=4, steps=2)
    fixtures.make_toy(tmp_path, "toy-a", steps=3)
    capsys.readouterr()
    assert main(["ls", str(tmp_path)]) == 0
    ids = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:] if ln.strip()]
    assert ids == ["toy-a", "st/seed7-em", "st/seed7-sgd", "st/seed42-em", "st/seed42-sgd",
                   "st/seed2024-em", "st/seed2024-sgd"], ids


@pytest.mark.parametrize("argv, heavy", [
    (["train", "--config", "wikitext_mhsa", "--model.n_head=0"], "torch"),
    (["train", "--config", "wikitext_mhsa", "--optim.lr=-1"], "torch"),
    (["figures", "no-such-runs", "--out", "figs"], "matplotlib"),
    (["figures", "no-such-runs"], "matplotlib"),
])
def test_a_bad_input_is_refused_before_the_heavy_imports(tmp_path, argv, heavy):
    """Item 6: some refusals took 10-16 s on a loaded machine, spent importing torch and matplotlib
    before the value or path was looked at.  In a fresh interpreter they are refused with neither
    imported (zarr, a second, still is: the --out checks read storage)."""
    code = ("import sys; from dyntool.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, *(m in sys.modules for m in ('torch', 'matplotlib')))")
    p = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    rc, torch, mpl = p.stdout.split()
    assert rc == "2" and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert (torch, mpl) == ("False", "False"), (heavy, p.stdout)
    assert list(tmp_path.iterdir()) == []


def test_info_says_what_a_runs_size_counts(tmp_path, capsys):
    """Item 6: the same run read 14.0 MB locally and 661 KB on S3 with nothing saying why; ``info``
    says what its size counts (here a disk's allocated blocks), and ``ls --help`` both."""
    from dyntool.cli import main
    from tests.app import fixtures
    fixtures.make_toy(tmp_path, "toy-a", steps=3)
    capsys.readouterr()
    assert main(["info", str(tmp_path / "toy-a")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("record "))
    assert line.endswith("on disk (allocated blocks, as du counts them: each small chunk file takes a whole block)")
    assert main(["ls", "--help"]) == 0
    assert "in object storage the objects' bytes" in " ".join(capsys.readouterr().out.split())
