"""Compile the fused attention's Triton programs for a CUDA target, on a machine without a GPU.

    python -m tests.kernels.cuda_compile FLOAT DTYPE [sm]   # e.g. fp64 bf16 90

Run without ``TRITON_INTERPRET`` (the interpreter never type-checks a kernel): Triton's own
compiler takes each program from Python to a cubin for ``sm`` (default 90, the H100), with the
float arguments typed ``FLOAT`` (``fp64`` is how torch.compile's inductor passes Python floats to a
user-defined kernel) and q, k, v, o and their gradients ``DTYPE``; every ``HAS_*`` switch on, so
each branch is compiled.  Prints one line per program and exits 1 if any fails to compile."""
from __future__ import annotations

import os
import sys

INTS = {"H", "G", "T", "D"}                             # upper-case names that are not pointers
INT32_POINTERS = {"LO", "HI", "WIN"}                    # op.attention's int32 tensors
INT8_POINTERS = {"KM"}                                  # the key mask, int8
ELEMENT_POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
SWITCHES = dict(BLOCK_M=64, BLOCK_N=64, D_PAD=64, CAUSAL=True, HAS_WINDOW=True, HAS_SOFTCAP=True,
                HAS_ALIBI=True, HAS_KM=True, HAS_SINK=True, STATS=True, EVEN_D=True, GROUPED=True,
                PRE_ONLY=False, ATOMIC_DQ=False)   # the atomic dQ policy: compiled by the census (test_census)


def signature(fn, floats: str, dtype: str) -> tuple[dict, dict]:
    sig, const = {}, {}
    for p in fn.params:
        n = p.name
        if p.is_constexpr:                 # a new switch must be named in SWITCHES, not guessed
            sig[n] = "constexpr"
            const[n] = ("ieee" if dtype == "fp32" else "tf32") if n == "PRECISION" else SWITCHES[n]
        elif n in ("scale", "softcap"):
            sig[n] = floats
        elif n.isupper() and n not in INTS:
            sig[n] = ("*i32" if n in INT32_POINTERS else "*i8" if n in INT8_POINTERS
                      else f"*{dtype}" if n in ELEMENT_POINTERS else "*fp32")
        else:
            sig[n] = "i32"
    return sig, const


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("cuda_compile: unset TRITON_INTERPRET (the interpreter does not compile)", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dyntool.kernels import backward as bw
    from dyntool.kernels import forward as fw
    floats, dtype = argv[0], argv[1]
    target = GPUTarget("cuda", int(argv[2]) if len(argv) > 2 else 90, 32)
    failed = 0
    for fn in (fw.attn_fwd, bw.attn_bwd_dq, bw.attn_bwd_dkdv):
        sig, const = signature(fn, floats, dtype)
        try:
            kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=target,
                                    options={"num_warps": 4})
            print(f"{fn.__name__}: compiled ({len(kernel.asm['cubin'])} bytes of cubin)")
        except Exception as e:                 # noqa: BLE001  every program is tried; the first line says why
            failed += 1
            print(f"{fn.__name__}: FAILED {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
