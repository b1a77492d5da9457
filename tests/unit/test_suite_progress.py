"""The suite's own output says which tier runs and how far it is (tests/conftest.py hooks,
pyproject's console_output_style = count and --durations)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_two_tier_run_names_its_tiers_progress_and_times():
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                          "tests/unit/test_gitignore.py",
                          "tests/integration/test_step_convention.py::test_an_unfinished_run_counts_its_training_rows"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("tiers: "))
    assert head.startswith("tiers: unit ") and ", integration 1 (" in head and "marks: not slow" in head
    n_unit = int(head.split("tiers: unit ")[1].split(",")[0])
    total = n_unit + 1
    assert f"== tier unit: {n_unit} tests, starting at test 1 of {total}, elapsed 0:00 ==" in lines
    assert any(ln.startswith(f"== tier integration: 1 tests, starting at test {total} of {total}, elapsed ")
               for ln in lines)
    assert any(ln.rstrip().endswith(f"[{total}/{total}]") for ln in lines)      # the count style
    assert any(ln.startswith("time per tier: unit ") and ", integration " in ln for ln in lines)
    assert any("slowest 5 durations" in ln for ln in lines)
