"""The fused attention's tuning sweep on a GPU: tiles, warps and pipeline stages, each setting against
flash SDPA in its own process (the tiles are read once, at import: ``DYNTOOL_KERNEL_TILES``).

    python bench/gpu_kernel_tune.py [--configs "64,64,4 128,64,8,3 ..."] [--T 2048,8192] [--json FILE]
    python bench/gpu_kernel_tune.py --smoke      # CPU: two settings through the interpreter (code path only)

Every setting runs ``bench/gpu_fused_attention.py --sections accuracy,speed``: bf16 accuracy against
float64 (PASS when within 2x SDPA's own error) and forward + backward with the statistics vs flash
SDPA, interleaved rounds, CUDA-event medians, B = 4, H = 12, d = 64, causal.  The table is sorted
by the geometric mean over T of fused / SDPA; a setting that fails its accuracy check or to
compile is listed with the reason and never ranked.  The winner becomes ``op.blocks`` / ``_launch``'s
default only after a session commits its numbers (docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# BLOCK_M,BLOCK_N,WARPS[,STAGES]: today's default first (64 x 64, 4 warps, Triton's default stages)
CONFIGS = "64,64,4 64,64,4,3 128,64,4,3 128,64,8,3 128,32,4,3 64,32,4,3 128,128,8,2 64,128,4,3"
SMOKE_CONFIGS = "16,16 32,16"


def run_one(spec: str, Ts: str, rounds: int, smoke: bool, timeout: float) -> dict:
    """One setting in its own process: {"spec", "ok", "speed": {T: ratio}, "accuracy_fail", "error"}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, str(ROOT / "bench" / "gpu_fused_attention.py"), "--sections", "accuracy,speed",
               "--json", str(out)] + (["--smoke"] if smoke else ["--T", Ts, "--rounds", str(rounds)])
        env = dict(os.environ, DYNTOOL_KERNEL_TILES=spec)
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"spec": spec, "ok": False, "error": f"over its {timeout:.0f} s"}
        if not out.exists():
            tail = (r.stderr or r.stdout).strip().splitlines()
            return {"spec": spec, "ok": False, "error": tail[-1][:200] if tail else f"exit {r.returncode}"}
        res = json.loads(out.read_text())["results"]
    failed = [x["name"] for x in res if x["section"] == "accuracy" and x["status"] == "FAIL"]
    speed = {x["name"]: {k: x[k] for k in ("fused_vs_sdpa", "stats_on_vs_off", "ms_fused_stats", "ms_sdpa")}
             for x in res if x["section"] == "speed"}
    return {"spec": spec, "ok": not failed and bool(speed), "accuracy_fail": failed, "speed": speed}


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=None, help=f"space-separated BLOCK_M,BLOCK_N[,WARPS[,STAGES]] "
                                                    f"(default: {CONFIGS})")
    ap.add_argument("--T", default="2048,8192")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120, help="seconds per setting")
    ap.add_argument("--smoke", action="store_true", help="CPU, interpreter, two settings: the code path only")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from dyntool.errors import ConfigError
    from dyntool.kernels.op import tuning
    specs = (a.configs or (SMOKE_CONFIGS if a.smoke else CONFIGS)).split()
    for s in specs:
        try:
            tuning(s)
        except ConfigError as e:
            ap.error(str(e))
    if not a.smoke:
        import torch
        if not torch.cuda.is_available():
            print("gpu_kernel_tune: needs a CUDA device (or --smoke)", file=sys.stderr)
            return 2
    rows = []
    for s in specs:
        r = run_one(s, a.T, a.rounds, a.smoke, a.timeout)
        rows.append(r)
        what = (" ".join(f"{t}={v['fused_vs_sdpa']:.2f}x" for t, v in r.get("speed", {}).items())
                if r["ok"] else f"not ranked: {r.get('error') or 'accuracy ' + ','.join(r['accuracy_fail'])}")
        print(f"  {s:<14} {what}", flush=True)
        if a.json:                                  # after each setting: a time limit keeps what is done
            Path(a.json).write_text(json.dumps({"smoke": a.smoke, "settings": rows}, indent=1))
    ranked = sorted((r for r in rows if r["ok"]), key=lambda r: geomean(v["fused_vs_sdpa"] for v in r["speed"].values()))
    print("ranked by the geometric mean of fused / SDPA over T" + (" (smoke: not timings)" if a.smoke else "") + ":")
    for r in ranked:
        print(f"  {r['spec']:<14} {geomean(v['fused_vs_sdpa'] for v in r['speed'].values()):.3f}")
    return 0 if ranked else 1


if __name__ == "__main__":
    sys.exit(main())
