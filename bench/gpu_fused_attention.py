"""The fused cheap-tier attention (dyntool.kernels) on a GPU: accuracy in bf16, compilation, speed.

    python bench/gpu_fused_attention.py [--T 2048,4096,8192] [--B 4] [--rounds 5] [--json FILE]
    python bench/gpu_fused_attention.py --smoke     # CPU: tiny shapes under TRITON_INTERPRET=1
    DYNTOOL_KERNEL_TILES=128,64,8,3 python bench/gpu_fused_attention.py --sections accuracy,speed   # other tiles

Sections (PASS / FAIL / INFO lines; exit 1 on a FAIL):

accuracy  bf16 at GPT-2 small's head shape (H = 12, d = 64, causal, T = 1024, trained-size logits):
          out, dq, dk, dv of the fused kernel against float64 autograd on the same bf16-rounded
          inputs; PASS when each error is ≤ 2× torch SDPA's own bf16 error there.  The kernel's
          statistics against the eager reduction (dyntool.cheap_stats) in float64 of the same inputs.
compile   a ``torch.compile(fullgraph=True)`` function calling the fused op (forward + backward)
          traces without a graph break and gives the eager call's output.
speed     per T: forward + backward of the fused kernel with statistics, without, and of flash SDPA
          (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``), same shapes (B, H = 12, d = 64, bf16,
          causal); rounds interleaved, CUDA-event medians; ratios fused/SDPA (aim ≤ 1.3×) and
          statistics on/off (the statistics' own cost, aim ≤ 1.05×).
Timings are only reported for a GPU (named in the output); --smoke checks the script's code path.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
RESULTS: list[dict] = []


def report(section, name, status, **info):
    RESULTS.append({"section": section, "name": name, "status": status, **info})
    extra = "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
    print(f"  {status:<4}  {section}/{name}  {extra}", flush=True)


def inputs(torch, B, H, T, D, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    gain = 1.8 * D ** 0.25                       # |τ q·k| reaches 20+, as in a trained model
    mk = lambda s: (torch.randn(B, H, T, D, generator=g) * s).to(device=device, dtype=dtype)  # noqa: E731
    return mk(gain), mk(gain), mk(1.0), mk(1.0)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def accuracy(torch, op, device, T, smoke):
    import torch.nn.functional as F
    from dyntool import cheap_stats
    from dyntool.kernels import stats as kstats
    dtype = torch.float16 if smoke else torch.bfloat16
    B, H, D = (1, 2, 32) if smoke else (2, 12, 64)
    q, k, v, do = inputs(torch, B, H, T, D, dtype, device)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    r = F.scaled_dot_product_attention(*leaves64, is_causal=True)
    r.backward(do.double())
    ref = [r] + [t.grad for t in leaves64]
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    token = torch.zeros(op.bwd_stats_size(q, k), device=device, requires_grad=True)
    out, _, fst = op.attention(*mine, token=token, stats=True)
    out.backward(do)
    sd = [t.clone().requires_grad_() for t in (q, k, v)]
    so = F.scaled_dot_product_attention(*sd, is_causal=True)
    so.backward(do)
    for name, a, s, rr in zip(("out", "dq", "dk", "dv"), [out] + [t.grad for t in mine], [so] + [t.grad for t in sd], ref):
        e, es = rel(a, rr), rel(s, rr)
        report("accuracy", f"{name}_{str(dtype)[6:]}", "PASS" if e <= 2 * es else "FAIL", fused=e, sdpa=es)
    sums = cheap_stats.Sums(H, torch.float64, device)
    allowed = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None, None]
    cheap_stats.accumulate(sums, q.double(), k.double(), v.double(), out.detach().double(), do.double(), allowed,
                           1 / math.sqrt(D), max_block_mib=256)
    eager = sums.finish()
    ks = cheap_stats.Sums(H, torch.float64, device)
    kstats.add_to(ks, kstats.head_sums(fst, token.grad), B, T)
    for n, x in ks.finish().items():
        report("accuracy", f"stat_{n}", "INFO", rel_err=rel(x, eager[n]))


def compile_check(torch, op, device, smoke):
    import torch._dynamo
    q, k, v, do = inputs(torch, 1, 2, 64 if smoke else 512, 32 if smoke else 64,
                         torch.float32 if smoke else torch.bfloat16, device)

    def step(q, k, v):
        return op.attention(q, k, v)[0]
    torch._dynamo.reset()
    try:
        explain = torch._dynamo.explain(step)(q, k, v)
        eager = step(q, k, v)
        comp = torch.compile(step, fullgraph=True)(q, k, v)
        report("compile", "fullgraph", "PASS" if explain.graph_break_count == 0 else "FAIL",
               graph_breaks=explain.graph_break_count, max_abs_diff=float((comp - eager).abs().max()))
    except Exception as e:                      # noqa: BLE001  reported, not raised: the timings still run
        report("compile", "fullgraph", "FAIL", error=f"{type(e).__name__}: {str(e)[:200]}")


def speed(torch, op, device, Ts, B, rounds, smoke):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    H, D = (2, 32) if smoke else (12, 64)
    dtype = torch.float16 if smoke else torch.bfloat16
    for T in Ts:
        q, k, v, do = inputs(torch, B, H, T, D, dtype, device)
        leaves = [t.requires_grad_() for t in (q, k, v)]

        def fused(stats, dq="split"):
            token = torch.zeros(op.bwd_stats_size(q, k), device=device, requires_grad=True) if stats else None
            op.attention(*leaves, token=token, stats=stats, dq=dq)[0].backward(do)

        def sdpa():
            ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if device.type == "cuda" else sdpa_kernel(SDPBackend.MATH)
            with ctx:
                F.scaled_dot_product_attention(*leaves, is_causal=True).backward(do)
        fns = {"fused_stats": lambda: fused(True), "fused_nostats": lambda: fused(False),
               "fused_stats_atomic_dq": lambda: fused(True, "atomic"), "sdpa": sdpa}   # both dQ policies
        times = {n: [] for n in fns}
        for f in fns.values():
            f()                                  # warm-up (and Triton's compilation)
        for _ in range(rounds):                  # interleaved: drifts hit every variant alike
            for n, f in fns.items():
                if device.type == "cuda":
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record(); f(); b.record(); torch.cuda.synchronize()      # noqa: E702
                    times[n].append(a.elapsed_time(b))
                else:
                    import time
                    t0 = time.perf_counter(); f(); times[n].append(1e3 * (time.perf_counter() - t0))  # noqa: E702
        med = {n: statistics.median(t) for n, t in times.items()}
        status = "INFO" if device.type == "cuda" else "SMOKE"
        report("speed", f"T{T}", status, ms_fused_stats=med["fused_stats"], ms_fused=med["fused_nostats"],
               ms_sdpa=med["sdpa"], fused_vs_sdpa=med["fused_stats"] / med["sdpa"],
               ms_fused_stats_atomic_dq=med["fused_stats_atomic_dq"],
               atomic_dq_vs_sdpa=med["fused_stats_atomic_dq"] / med["sdpa"],
               stats_on_vs_off=med["fused_stats"] / med["fused_nostats"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", default="2048,4096,8192")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny shapes under the Triton interpreter")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sections", default="accuracy,compile,speed",
                    help="comma-separated (the tuning sweep, bench/gpu_kernel_tune.py, skips compile)")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    if not sections or not sections <= {"accuracy", "compile", "speed"}:
        ap.error(f"--sections: of accuracy, compile, speed; got {args.sections!r}")
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"     # before dyntool.kernels defines its kernels
    import torch
    if not args.smoke and not torch.cuda.is_available():
        print("SKIP: needs CUDA (or --smoke on the CPU)")
        return 0
    from dyntool.kernels import op
    device = torch.device("cpu" if args.smoke else "cuda")
    hw = (torch.cuda.get_device_name(0) + f"; torch {torch.__version__}; CUDA {torch.version.cuda}"
          if device.type == "cuda" else f"CPU smoke run (interpreter); torch {torch.__version__}")
    hw += f"; tiles (BLOCK_M, BLOCK_N) {op.blocks(64)[:2]}" + (f", {op.TUNING_ENV}={os.environ[op.TUNING_ENV]}"
                                                               if op.TUNED else "")
    print(hw)
    Ts = [40] if args.smoke else [int(t) for t in args.T.split(",")]
    if "accuracy" in sections:
        accuracy(torch, op, device, 40 if args.smoke else 1024, args.smoke)
    if "compile" in sections:
        compile_check(torch, op, device, args.smoke)
    if "speed" in sections:
        speed(torch, op, device, Ts, 1 if args.smoke else args.B, 1 if args.smoke else args.rounds, args.smoke)
    if args.json:
        Path(args.json).write_text(json.dumps({"hardware": hw, "results": RESULTS}, indent=1))
    return 1 if any(r["status"] == "FAIL" for r in RESULTS) else 0


if __name__ == "__main__":
    sys.exit(main())
