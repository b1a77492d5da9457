"""The tile sizes are a tuning knob (``DYNTOOL_KERNEL_TILES``, bench/gpu_kernel_tune.py): with tiles
other than the interpreter's 16 × 16, rectangular either way, every case still equals float64 (the
causal, window and padding ranges and the statistics' per-tile layout do not assume square tiles).
Each setting runs in its own process: the tiles are read once, at import."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dyntool.errors import ConfigError
from dyntool.kernels.op import DQ_ENV, TUNING_ENV, dq_policy, tuning

ROOT = Path(__file__).resolve().parents[2]
CHECK = ("import tests.kernels.test_attention as t\n"
         "from tests.kernels.cases import CASES\n"
         "from dyntool.kernels import op\n"
         "print(op.blocks(64)[:2], op.DQ_DEFAULT)\n"
         "for n in CASES:\n"
         "    t.check_case(n)\n")


@pytest.mark.parametrize("tiles,dq", [("32,16", "split"), ("16,32", "atomic")])
def test_every_case_equals_float64_with_other_tiles(tiles, dq):
    """Each tile setting with one dQ policy (the atomic policy's adds cross query tiles of
    another height than its key tiles at 16 × 32), both chosen through the environment."""
    env = dict(os.environ, TRITON_INTERPRET="1", **{TUNING_ENV: tiles, DQ_ENV: dq})
    r = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == f"{tuple(int(x) for x in tiles.split(','))} {dq}"


def test_tuning_spec():
    assert dq_policy(None) == "split" and dq_policy("atomic") == "atomic"
    with pytest.raises(ConfigError, match=f"^config error: {DQ_ENV}: 'fast' is not one of split, atomic$"):
        dq_policy("fast")
    assert tuning(None) is None and tuning("") is None
    assert tuning("128,64,8,3") == (128, 64, 8, 3) and tuning("64,32") == (64, 32, None, None)
    for bad in ("64", "48,64", "8,16", "64,64,3", "a,b", "64,64,4,0", "64,64,4,2,1"):
        with pytest.raises(ConfigError, match=f"^config error: {TUNING_ENV}: '{bad}' is not BLOCK_M,BLOCK_N"):
            tuning(bad)


def test_tuning_sweep_runs_a_setting_in_its_own_process():
    """bench/gpu_kernel_tune.py's code path (--smoke: the interpreter, no timing): a setting reaches
    the kernel through the environment, passes its accuracy check and reports its speed section."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_kernel_tune
    r = gpu_kernel_tune.run_one("32,16", "40", 1, smoke=True, timeout=300)
    assert r["ok"] and r["accuracy_fail"] == [] and set(r["speed"]) == {"T40"}, r
    bad = gpu_kernel_tune.run_one("32,16,4,0", "40", 1, smoke=True, timeout=300)
    assert not bad["ok"] and "config error: DYNTOOL_KERNEL_TILES: '32,16,4,0' is not" in bad["error"]
