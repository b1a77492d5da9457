"""`pip install .` into a fresh venv, then the commands run from outside the repository: the
presets ship as package data (slow: builds a wheel)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_installed_package_runs_outside_the_repository(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "runs", "__pycache__", "*.egg-info",
                                                             "build", ".venv*"))
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv), "--system-site-packages"], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(venv / "bin" / "pip"), "install", "--no-deps", "-q", str(src)], check=True, env=env)
    shutil.rmtree(src)                                # nothing of the checkout is left to lean on
    work = tmp_path / "elsewhere"
    work.mkdir()
    run = lambda *a: subprocess.run([str(venv / "bin" / "dyntool"), *a], cwd=work, env=env,  # noqa: E731
                                    capture_output=True, text=True)
    r = run("sim", "sticky-markov", "--preset", "ci", "--T", "30", "--steps", "5", "--window", "10",
            "--n-seeds", "2", "--out", "r", "--name", "s", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (work / "r" / "s" / "summary.json").is_file()
    r = run("sim", "toy", "--config", "sims/toy.toml", "--preset", "slow", "--steps", "2", "--out", "r", "--quiet")
    assert r.returncode == 0, r.stderr
    r = run("train", "--config", "wikitext_mhsa", "--preset", "nope")
    assert r.returncode == 2 and "unknown preset" in r.stderr
