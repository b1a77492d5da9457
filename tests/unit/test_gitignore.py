"""Every path README's commands create is git-ignored (a newcomer's `git status` stays clean)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# what README's commands write, relative to the repository root
CREATED = ["venv/bin/python", ".venv/bin/python", "runs/sticky-markov/default/summary.json",
           "paper-figs/f3.pdf", "gpu_check.json", "tb/RUN/events", "out/metrics.csv",
           "runs/studies/span/summary.json", ".dyntool-cache/x.npy", "bench/results/x.json"]


def test_readme_outputs_are_ignored():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    readme = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    for needle in ("venv/bin/python", "--out paper-figs", "--json gpu_check.json", "--to-tensorboard tb/",
                   "--to out/"):
        assert needle in readme, needle           # the list above follows README and docs/
    r = subprocess.run(["git", "check-ignore", "--no-index", *CREATED], cwd=REPO, capture_output=True, text=True)
    ignored = set(r.stdout.split())
    assert ignored == set(CREATED), sorted(set(CREATED) - ignored)
    assert not re.search(r"^!", (REPO / ".gitignore").read_text(), re.M)
