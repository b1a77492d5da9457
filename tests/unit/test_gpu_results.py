"""The committed GPU results (bench/gpu_*.json) and the part selection of bench/gpu_session.sh
(bench/gpu_parts.py, issues 34 and 46): every file names its hardware and holds every key of its date,
with a reason beside each null; a session owes exactly the parts whose keys no file has measured, in
issue 46's priority order, then ``tests``."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import gpu_parts  # noqa: E402


def complete(**over) -> dict:
    d = {"date": "2026-11-28", "hardware": "some GPU", **{k: 1.0 for k in gpu_parts.KEYS}, "why_null": {}}
    d.update(over)
    return d


def test_committed_files_hold_hardware_every_key_and_reasons():
    files = gpu_parts.results()
    assert files, "no bench/gpu_*.json committed"
    assert [p for n, d in files.items() for p in gpu_parts.problems(n, d)] == []


@pytest.mark.parametrize("broken,says", [
    ({"hardware": ""}, "no hardware"),
    ({"wind_tunnel": None}, "wind_tunnel is null without a reason"),
    ({"why_null": {"wind_tunnel": "  "}, "wind_tunnel": None}, "wind_tunnel is null without a reason"),
])
def test_problems_name_what_is_missing(broken, says):
    assert any(says in p for p in gpu_parts.problems("f.json", complete(**broken)))
    missing = complete()
    del missing["every50_ratio"]
    assert gpu_parts.problems("f.json", missing) == ["f.json: no key every50_ratio"]
    # a key added on 2026-11-28 is owed by the files of that date on, not by earlier ones
    old = {k: v for k, v in complete(date="2026-11-27").items() if k != "wind_tunnel_100k_paper"}
    assert gpu_parts.problems("f.json", old) == []
    assert gpu_parts.problems("f.json", {**old, "date": "2026-11-28"}) == ["f.json: no key wind_tunnel_100k_paper"]


def test_a_key_measured_by_any_file_is_not_owed():
    a = complete(best_val_ppl_ls=None, wind_tunnel=None, every50_ratio=None,
                 why_null={"best_val_ppl_ls": "x", "wind_tunnel": "x", "every50_ratio": "x"})
    assert gpu_parts.owed({"a": a}) == ["timing", "wind-tunnel", "presets", "tests"]     # priority order
    b = complete(wind_tunnel={"pc1_share": 0.9}, best_val_ppl_ls=None, why_null={"best_val_ppl_ls": "x"})
    assert gpu_parts.owed({"a": a, "b": b}) == ["presets", "tests"]
    assert gpu_parts.owed({"b": complete()}) == ["tests"]


def test_the_cli_prints_the_owed_parts_and_checks(tmp_path):
    (tmp_path / "gpu_x.json").write_text(json.dumps(complete(span_delta_val_loss_pct=None)))
    run = lambda *a: subprocess.run([sys.executable, str(BENCH / "gpu_parts.py"), "--dir", str(tmp_path), *a],  # noqa: E731
                                    capture_output=True, text=True)
    assert run().stdout.split() == ["span", "tests"]
    r = run("--check")
    assert r.returncode == 1 and "span_delta_val_loss_pct is null without a reason" in r.stderr
