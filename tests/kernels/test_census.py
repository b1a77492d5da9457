"""The fused attention's compiled census holds the bounds of issue 45 (checked on the CPU).

``bench/kernel_census.py`` compiles every program for sm_90 as a GPT-2-shaped bf16 run would (the
Triton wheel's compiler, ptxas and nvdisasm; no GPU), at d = 64 and 128 with the statistics on, and
counts each hot loop's instructions per iteration.  Before the rewrite they were 989 / 778 / 941
(forward / dQ / dK,dV), 32–38 FSETP per loop, 8 LDSM + 8 STSM per dK/dV iteration and 2 forward
blocks per SM: each bound below fails on that kernel."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_cuda_compile import _nvidia_backend

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def census(tmp_path_factory):
    out = tmp_path_factory.mktemp("census") / "census.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "bench/kernel_census.py", "--stats", "on", "--json", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    return {(c["d"], c["dq"], p["program"]): p for c in data["census"] for p in c["programs"]}, data["bounds"]


@pytest.mark.skipif(not _nvidia_backend(), reason="this Triton has no CUDA backend to compile with")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dq,program", [("split", "attn_fwd"), ("split", "attn_bwd_dq"), ("split", "attn_bwd_dkdv"),
                                        ("atomic", "attn_bwd_dkdv+dq")])
def test_hot_loops_within_bounds(census, d, dq, program):
    """Both dQ policies; the atomic one's single backward loop does dQ's work too, so it gets the
    split's two loops' shared-memory traffic budget (its dS tile is dQ's operand) but no spill."""
    progs, bounds = census
    p = progs[(d, dq, program)]
    hot = [lp for lp in p["loops"] if lp["hot"]]
    assert len(hot) == 1, f"{program}: expected one hot loop, found {p['loops']}"
    lp = hot[0]
    assert lp["instructions"] <= bounds[program], lp
    assert lp["fsetp"] == 0, lp                          # no float compare (a `where` or the exp fix-up)
    assert lp["hgmma"] > 0, lp                           # the census found the loop that does the work
    assert p["spills"] == 0, p
    if program == "attn_bwd_dkdv":
        assert lp["ldsm_stsm"] == 0, lp                  # key-major: no register tile through shared memory
    if program == "attn_fwd" and d == 64:
        assert p["blocks_per_sm"] >= 3, p


@pytest.mark.skipif(not _nvidia_backend(), reason="this Triton has no CUDA backend to compile with")
@pytest.mark.parametrize("d", [64, 128])
def test_atomic_policy_prepares_without_a_loop(census, d):
    """With atomic dQ the dQ program only computes D_i and the row sums: no loop over keys."""
    progs, _ = census
    assert progs[(d, "atomic", "attn_bwd_dq")]["loops"] == [] or not any(
        lp["hot"] for lp in progs[(d, "atomic", "attn_bwd_dq")]["loops"])
    assert progs[(d, "atomic", "attn_fwd")] == progs[(d, "split", "attn_fwd")]
