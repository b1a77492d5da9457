"""What recording costs on a GPU, at GPT-2 small's shape and a long context (one CUDA device).

    python bench/gpu_recorder_cost.py [--T 2048,8192] [--batch 4] [--reps 7] [--steps 5] [--profile] [--only-full] [--no-eager]
                                      [--full-T 2048] [--no-full]
                                      [--json FILE]     # part A first; the JSON is written after each part
    python bench/gpu_recorder_cost.py --smoke           # CPU: part A's code path, tiny, under TRITON_INTERPRET=1

A. (first) Interleaved rounds (bench_tiers' ``interleave``: arms rotate, one warm-up round, medians of
   paired per-round ratios) of one training step as the trainer takes it (forward under bf16
   autocast, backward outside it, fused AdamW) of dyntool's GPT at 12 layers × 12 heads × 768,
   vocabulary 50,257, at each ``--T`` (default 2048 and 8192): ``off_compiled_flash`` (torch.compile,
   ``sdpa_kernel(FLASH_ATTENTION)``: a step without recording), ``cheap_fused_compiled`` (the cheap
   tier on every step through the fused kernel, compiled: ``FlightRecorder.prepare``), and at the
   first T also ``off_eager``, ``cheap_fused_eager`` and ``cheap_eager`` (the eager reduction at
   ``record.max_block_mib`` = 64).  Every recorded arm reads its statistics each step (the host sync
   the trainer pays at a logging step).  Each arm's time ends with ``torch.cuda.synchronize()``.
B. (second) The full tier on a probe: a ``dyntool train`` run at the same shape and ``--full-T`` (WikiText-2's vocabulary,
   eager, the cheap tier on every step), recording ``record.heads`` on a 1-sequence probe every
   10th step, streamed in blocks of ``record.max_block_mib``: the recorded steps' time against the
   median of the others, in the same run.
Needs CUDA (it exits 2 without), except ``--smoke`` (no timing reported: it checks the code path).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_tiers import interleave, ratio                      # noqa: E402
from common import dir_size                                    # noqa: E402
from gpu_check import hardware, step_times                     # noqa: E402
from dyntool.flight import FlightRecorder                      # noqa: E402
from dyntool.train.config import ModelConfig                   # noqa: E402
from dyntool.train.gpt import GPT                              # noqa: E402

VOCAB = 50257
SHAPE = dict(n_layer=12, n_head=12, n_embd=768)


SMOKE = False       # --smoke: the CPU, a tiny model, aot_eager, no autocast, no flash


def compiled(model):
    return torch.compile(model, backend="aot_eager", fullgraph=True) if SMOKE else torch.compile(model)


def step_arm(model, batch, flight=None, flash=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=not SMOKE)
    flash = flash and not SMOKE

    def run(n):
        for _ in range(n):
            with flight if flight is not None else nullcontext():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if flash else nullcontext():
                    with torch.autocast("cuda", torch.bfloat16, enabled=not SMOKE):   # the trainer's: forward only
                        loss = model(*batch)[1]
                    loss.backward()
            if flight is not None:
                flight.metrics()                     # the host sync the trainer pays
                flight.reset()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if not SMOKE:
            torch.cuda.synchronize()
    return run


def bench_cheap(T: int, B: int, reps: int, steps: int, profile: bool = False, eager_arms: bool = True) -> dict:
    dev = torch.device("cpu" if SMOKE else "cuda")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (B, T), generator=g).to(dev)
    batch = (x, torch.roll(x, -1, 1))
    names = ["off_compiled_flash", "cheap_fused_compiled"] + \
        (["off_eager", "cheap_fused_eager", "cheap_eager"] if eager_arms else [])
    models = {}
    for name in names:
        torch.manual_seed(0)
        models[name] = GPT(ModelConfig(attention="mhsa", **SHAPE), VOCAB, T, device_type=dev.type).to(dev)
    fused = FlightRecorder(models["cheap_fused_compiled"], kernel="fused")
    fused.prepare(B, T)
    arms = {"off_compiled_flash": step_arm(compiled(models["off_compiled_flash"]), batch, flash=True),
            "cheap_fused_compiled": step_arm(compiled(models["cheap_fused_compiled"]), batch, fused)}
    if eager_arms:
        arms.update(off_eager=step_arm(models["off_eager"], batch),
                    cheap_fused_eager=step_arm(models["cheap_fused_eager"], batch,
                                               FlightRecorder(models["cheap_fused_eager"], kernel="fused")),
                    cheap_eager=step_arm(models["cheap_eager"], batch,
                                         FlightRecorder(models["cheap_eager"], kernel="eager", max_block_mib=64)))
    if not SMOKE:
        torch.cuda.reset_peak_memory_stats(dev)
    t = interleave(arms, reps, steps)
    if profile:                                  # where the cheap tier's time goes, kernel by kernel
        from torch.profiler import ProfilerActivity, profile as prof
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
            arms["cheap_fused_compiled"](2)
        print(pr.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
    med = {n: statistics.median(v) for n, v in t.items()}
    recorded = [n for n in names if n.startswith("cheap")]
    torch._dynamo.reset()
    return {"shape": f"dyntool GPT mhsa L=12 nh=12 C=768 B={B} T={T} V={VOCAB}, bf16 autocast (forward), fused AdamW",
            "step_ms": {n: s * 1e3 for n, s in med.items()},
            "tokens_per_s": {n: B * T / s for n, s in med.items()},
            "attention_paths": fused.paths(),
            **{f"{n}_over_off_compiled_flash": ratio(t, n, "off_compiled_flash") for n in recorded},
            **({f"{n}_over_off_eager": ratio(t, n, "off_eager") for n in recorded} if eager_arms else {}),
            "peak_mem_gib": None if SMOKE else torch.cuda.max_memory_allocated(dev) / 2**30}


def bench_full(T: int, heads: str, data: str | None, device: str = "cuda") -> dict:
    from dyntool.train.runner import load_config, run_training
    steps = 31
    over = [f"--model.n_layer={SHAPE['n_layer']}", f"--model.n_head={SHAPE['n_head']}",
            f"--model.n_embd={SHAPE['n_embd']}", "--data.batch_size=4", "--data.eval_batch_size=4", f"--data.block_size={T}",
            f"--train.max_steps={steps}", "--train.eval_every=0", "--train.final_eval=false",
            "--train.checkpoint=false", "--train.log_every=1", "--train.compile=false", f"--device={device}",
            "--record.every=10", "--record.seqs=1", f"--record.heads={heads}", "--record.cheap_every=1",
            "--record.max_block_mib=256", "--model.dropout=0"] + ([f"--data.path={data}"] if data else [])
    cfg = load_config("wikitext_mhsa", "gpu", over)
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = run_training(cfg, tmp, name="full-tier", quiet=True, kind="bench")
        # the recorded steps are the multiples of record.every; the first 3 (step 0's warm-up) left out
        plain, rec = step_times(path, warm=3, every=10)
        size = dir_size(path / "record.zarr")
    return {"what": f"dyntool train, L=12 nh=12 C=768 B=4 T={T}, eager, cheap tier every step; full tier of "
                    f"record.heads={heads} on a 1-sequence probe every 10 steps (streamed, float32 probe pass)",
            "recorded_step_ms": rec * 1e3 if rec else None, "other_step_ms": plain * 1e3,
            "recorded_over_other": rec / plain if rec else None,
            "record_bytes_on_disk": size, "recorded_steps": len(range(0, steps, 10))}

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default="2048,8192", help="comma-separated lengths of part A")
    p.add_argument("--full-T", type=int, default=2048,
                   help="part B's length (the full tier of a 12-layer model at T = 8192 needs ~315 GiB)")
    only = p.add_mutually_exclusive_group()
    only.add_argument("--no-full", action="store_true", help="part A only")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--heads", default="L0H0,L11H0", help="record.heads of part B")
    p.add_argument("--data", default=None, help="WikiText-2 folder for part B (default: as dyntool train)")
    p.add_argument("--profile", action="store_true", help="print the CUDA kernels of two cheap-tier steps")
    only.add_argument("--only-full", action="store_true", help="part B only")
    p.add_argument("--no-eager", action="store_true",
                   help="part A's compiled arms only (the eager cheap tier alone takes ~90 s of an H100 at T = 2048)")
    p.add_argument("--json", default=None)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, interpreter: the code path only")
    a = p.parse_args(argv)
    if a.smoke:
        return smoke()
    if not torch.cuda.is_available():
        print("gpu_recorder_cost: needs a CUDA device", file=sys.stderr)
        return 2
    res = {"hardware": hardware(torch.device("cuda")), "reps": a.reps, "steps": a.steps}
    t0 = time.perf_counter()

    def save():                                  # after each part: a time limit keeps what is done
        res["seconds"] = time.perf_counter() - t0
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))
    lengths = [int(t) for t in str(a.T).split(",")]
    if not a.only_full:                          # first: the cheap tier's cost is the figure a session must bring
        for i, T in enumerate(lengths):
            res[f"cheap_T{T}"] = bench_cheap(T, a.batch, a.reps, a.steps, a.profile and i == 0,
                                             eager_arms=i == 0 and not a.no_eager)
            print(json.dumps(res[f"cheap_T{T}"], indent=1), flush=True)
            save()
    if a.no_full:
        return 0
    from dyntool.errors import ConfigError
    try:
        res["full"] = bench_full(a.full_T, a.heads, a.data)
    except ConfigError as e:                     # e.g. the run's memory check: said, part A kept
        res["full"] = {"skipped": str(e)}
        print(f"gpu_recorder_cost: part B skipped: {e}", file=sys.stderr)
        save()
        return 1
    print(json.dumps(res["full"], indent=1), flush=True)
    save()
    return 0


def smoke() -> int:
    """Part A's arms on the CPU at a tiny shape (the kernel under TRITON_INTERPRET=1): the code a
    GPU session runs, checked without one.  Prints no timing."""
    global SMOKE, VOCAB, SHAPE
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("gpu_recorder_cost --smoke: set TRITON_INTERPRET=1 (before triton is imported)", file=sys.stderr)
        return 2
    SMOKE, VOCAB, SHAPE = True, 40, dict(n_layer=2, n_head=2, n_embd=32)
    out = bench_cheap(20, 2, reps=1, steps=1)
    print("smoke ok:", sorted(out["step_ms"]), out["attention_paths"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
