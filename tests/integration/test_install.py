"""What `pip install .` ships.  Fast: the wheel built from the package sources holds every file of
the package (modules, subpackages, presets and any other data file), so nothing the installed
package opens is left behind in the checkout.  Slow: a fresh venv runs the commands from outside
the repository."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP = ("__pycache__", ".pyc", ".pyo", ".DS_Store")


def _package_files() -> set[str]:
    """Every file under dyntool/ in the checkout (what a developer added), caches excluded."""
    return {p.relative_to(REPO).as_posix() for p in (REPO / "dyntool").rglob("*")
            if p.is_file() and not any(s in p.as_posix() for s in SKIP)}


def test_wheel_ships_every_file_of_the_package(tmp_path):
    """A data file (preset, style, template) not declared in [tool.setuptools.package-data], or a
    module outside the packages `find` includes, works in the checkout and in an editable install
    but is missing after `pip install .`: build the wheel (no network, ~5 s) and compare."""
    pytest.importorskip("setuptools", minversion="70.1")   # bdist_wheel built in
    src = tmp_path / "src"                            # a copy: the build writes build/ and *.egg-info
    shutil.copytree(REPO / "dyntool", src / "dyntool", ignore=shutil.ignore_patterns(*SKIP[:1], "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    out = tmp_path / "wheel"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                        "print(b.build_wheel(sys.argv[1]))", str(out)], cwd=src, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = out / r.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "dyntool = dyntool.cli:main" in z.read(entry).decode()
    shipped = {n for n in names if n.startswith("dyntool/")}
    missing = sorted(_package_files() - shipped)
    assert not missing, f"in dyntool/ but not in the wheel (declare it in pyproject [tool.setuptools.package-data]): {missing}"
    # the things a first hour needs, named, so an emptied preset folder can't pass vacuously
    assert {"dyntool/presets/sticky_markov.toml", "dyntool/presets/toy.toml", "dyntool/app/main.py",
            "dyntool/app/views/runs.py", "dyntool/cli/__init__.py"} <= shipped


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
    r = run("sim", "sticky-markov", "--preset", "ci", "--T", "30", "--steps", "5", "--crop", "10",
            "--n-seeds", "2", "--out", "r", "--name", "s", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (work / "r" / "s" / "summary.json").is_file()
    r = run("sim", "toy", "--config", "toy", "--preset", "slow", "--steps", "2", "--out", "r", "--quiet")
    assert r.returncode == 0, r.stderr
    r = run("train", "--config", "wikitext_mhsa", "--preset", "nope")
    assert r.returncode == 2 and "unknown preset" in r.stderr


# Paths built from __file__ that leave the package on purpose: nothing the installed package
# *needs* may live there (a checkout is optional).
OUTSIDE_OK = {
    "dyntool/run_writer.py": "git commit of a checkout, None when installed",
    "dyntool/data/sources.py": "../shared/data next to a checkout, one of several places tried",
}


def test_no_module_reads_files_from_the_checkout():
    """`Path(__file__).parents[k]` / `.parent.parent…` past dyntool/ reaches the repository, which
    `pip install .` doesn't have (the old `parents[2] / "sims"` preset lookup): presets, app
    files and styles must be package data, found inside dyntool/."""
    import re
    bad = []
    for f in sorted((REPO / "dyntool").rglob("*.py")):
        rel = f.relative_to(REPO).as_posix()
        depth = len(f.relative_to(REPO / "dyntool").parts)      # parents[depth - 1] is dyntool/
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if "__file__" not in line:
                continue
            up = [int(k) + 1 for k in re.findall(r"__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]", line)]
            m = re.search(r"__file__\)(?:\.resolve\(\))?((?:\.parent)+)", line)
            if m:
                up.append(m.group(1).count(".parent"))
            if any(u > depth for u in up) and rel not in OUTSIDE_OK:
                bad.append(f"{rel}:{n}: {line.strip()}")
    assert not bad, "reads from the repository, which an installed package lacks:\n" + "\n".join(bad)
