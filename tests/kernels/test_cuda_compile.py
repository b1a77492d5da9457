"""The fused attention's programs compile for an H100 (sm_90) as a GPU would run them, checked on
the CPU: the interpreter (the rest of tests/kernels) executes a kernel without type-checking it, so a
kernel can pass every interpreted test and still fail Triton's compiler.  The first GPU session found
one: inductor passes a Python float to a user-defined kernel as fp64, which turned a loop-carried
fp32 accumulator fp64 (fixed by ``tiles.fp32_scalars``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _nvidia_backend() -> bool:
    try:
        from triton.backends import backends
    except ImportError:
        return False
    return "nvidia" in backends


@pytest.mark.skipif(not _nvidia_backend(), reason="this Triton has no CUDA backend to compile with")
@pytest.mark.parametrize("floats,dtype", [("fp64", "bf16"), ("fp32", "fp32")],
                         ids=["inductor-fp64-floats-bf16", "eager-fp32"])
def test_programs_compile_for_sm90(floats, dtype):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "tests.kernels.cuda_compile", floats, dtype, "90"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": compiled") == 3, r.stdout
