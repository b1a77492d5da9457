"""The fused attention's census on a machine without a GPU (issue 45): every program compiled for
sm_90 by the Triton wheel's own compiler as a GPT-2-shaped bf16 run would compile it, read with the
wheel's cuobjdump / nvdisasm (dyntool/kernels/census.py says what is counted and why).

    python bench/kernel_census.py                        # d = 64 and 128, statistics on and off
    python bench/kernel_census.py --d 64 --json census.json

Run it without TRITON_INTERPRET (the interpreter compiles nothing).  The bounds it prints beside each
hot loop are the ones tests/kernels/test_census.py holds in CI.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", default="64,128", help="head dimensions, comma-separated (default 64,128)")
    ap.add_argument("--T", type=int, default=2048, help="sequence length of the specialisation (default 2048)")
    ap.add_argument("--stats", choices=["on", "off", "both"], default="both", help="with the statistics, "
                    "without, or both (default)")
    ap.add_argument("--dq", choices=["split", "atomic", "both"], default="both", help="the backward's dQ "
                    "policy (DYNTOOL_KERNEL_DQ): the deterministic split, FA2's atomic adds, or both (default)")
    ap.add_argument("--step", action="store_true", help="also count the ATen ops and host reads that reading "
                    "a recorded step's statistics costs outside the graph (bench/step_ops.py, 12 x 12 fused sites, "
                    "in a subprocess under the interpreter)")
    ap.add_argument("--json", default=None, help="also write every number here")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("kernel_census: unset TRITON_INTERPRET (the interpreter compiles nothing)", file=sys.stderr)
        return 2
    import triton
    from dyntool.kernels import census
    out = {"triton": triton.__version__, "python": platform.python_version(), "target": "sm_90",
           "T": args.T, "bounds": census.HOT_BOUNDS | census.HOT_BOUNDS_ATOMIC, "census": []}
    policies = ("split", "atomic") if args.dq == "both" else (args.dq,)
    for D in (int(x) for x in args.d.split(",")):
        for stats in {"on": (True,), "off": (False,), "both": (True, False)}[args.stats]:
            for dq in policies:
                progs = census.attention_census(D, stats=stats, T=args.T, dq=dq)
                print(("with" if stats else "without") + f" statistics, dQ {dq}")
                print(census.table(progs, D))
                out["census"].append({"d": D, "stats": stats, "dq": dq,
                                      "programs": [p.row() | {"spills": p.spills} for p in progs]})
    if args.step:
        import subprocess
        env = dict(os.environ, TRITON_INTERPRET="1")
        r = subprocess.run([sys.executable, str(Path(__file__).with_name("step_ops.py")), "--json"], env=env,
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            print(f"kernel_census: the step's op count failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        out["step"] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"recorded step, {out['step']['layers']} x {out['step']['heads']} fused sites: {out['step']['ops']} "
              f"ATen ops outside the graph to read the statistics, {out['step']['host_reads']} blocking reads")
    bounds = census.HOT_BOUNDS | census.HOT_BOUNDS_ATOMIC
    print("bounds (statistics on): hot loop " + ", ".join(f"{k} <= {v}" for k, v in bounds.items())
          + "; no FSETP in a hot loop; no LDSM/STSM in dK/dV's; 0 spills; forward >= 3 blocks/SM at d = 64")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
