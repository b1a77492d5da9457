"""GPU check: the one command a GPU session runs first (it also runs on CPU, skipping what needs CUDA).

    python bench/gpu_check.py [--only parity,graph_breaks,throughput,resume,ddp] [--quick] [--arms mhsa,ls,span]
                              [--steps 60] [--peak-tflops X] [--json FILE]

Sections (each prints PASS / FAIL / SKIP lines with the reason; exit 1 if anything FAILs):

parity        attention outputs and q/k/v gradients of ``AttentionCore`` for the manual / sdpa / flex
              backends × float32 / bfloat16 × eager / compiled, on a causal and an LS mask (5 local +
              1 global heads, window 50, T not a multiple of 128), against the manual backend in
              float64 on CPU.  flex has no CPU backward (forward only there); on CPU ``compile`` uses
              the ``aot_eager`` backend (inductor on CUDA) unless ``--compile-backend`` says otherwise.
graph_breaks  torch._dynamo graph-break counter over one compiled training step of the GPT for mhsa,
              ls (flex on CUDA), qknorm, span c1_orthogonal and span c1_oblique.  Must be 0.
throughput    tokens/s (median step time after warmup) of the trainer for mhsa / ls / span on the
              ``gpu`` preset with recording off and every 50 steps, and of the nanoGPT-style
              reference (bench/nanogpt_ref.py, same dims, same dropout / vocab padding, same
              autocast, compile, fused AdamW and clipping) on the same device; MFU from nanoGPT's
              6N + 12·L·H·hs·T FLOPs per token (the dense count for every variant) against
              ``--peak-tflops`` (H100/H200 bf16 dense: 989); peak CUDA memory per run.  On CPU:
              a 2-layer, 64-wide model for 4 steps (a smoke run of the code path, not a measurement).
resume        N steps straight vs N/2, checkpoint, resume to N: the parameter sha256 must match.
              On CUDA with the deterministic switch (``train.deterministic`` if the config has it;
              otherwise this script sets ``torch.use_deterministic_algorithms`` and
              ``CUBLAS_WORKSPACE_CONFIG`` itself: TODO(trainops) use the trainer's switch).  On CPU:
              the tiny model for 6 steps.
ddp           a 2-process torchrun: nccl when 2 GPUs exist, else gloo on CPU; the ranks' parameter
              digests must agree.

WikiText-2 is found as for ``dyntool train``; if it is missing (a bare device machine) the
throughput / resume / ddp sections use a synthetic corpus with the same 33,278-word vocabulary
(throughput does not depend on the words).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_common import RESULTS, TINY, hardware, report   # noqa: E402,F401  (hardware: used by gpu_recorder_cost)
from gpu_throughput import check_throughput, data_path, flops_per_token, step_times   # noqa: E402,F401

from dyntool import masks                                  # noqa: E402
from dyntool.attention import AttentionCore                # noqa: E402
from dyntool.train.runner import load_config, run_training   # noqa: E402

SECTIONS = ("parity", "graph_breaks", "throughput", "resume", "ddp")
# ------------------------------------------------------------------------------------------ parity
def _attend(backend, mask, H, q, k, v, compiled, compile_backend, grad):
    core = AttentionCore(mask, H, backend).to(q.device)
    fn = core.attend
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(core.attend, backend=compile_backend, fullgraph=True)
    qq, kk, vv = (t.detach().clone().requires_grad_(grad) for t in (q, k, v))
    with (contextlib.nullcontext() if grad else torch.no_grad()):
        y = fn(qq, kk, vv)
    if not grad:
        return y, None
    g = torch.autograd.grad(y, (qq, kk, vv), torch.ones_like(y) / y.numel() ** 0.5)
    return y.detach(), g


def check_parity(device, args) -> None:
    B, H, hd = 2, 6, 32
    T = 200 if args.quick else 300                                   # not a multiple of 128
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, hd, generator=gen, dtype=torch.float64) for _ in range(3))
    cb = args.compile_backend or ("inductor" if device.type == "cuda" else "aot_eager")
    tol = {torch.float32: 2e-4, torch.bfloat16: 3e-2}               # relative to the reference's max
    for mname, mask in (("causal", masks.causal()), ("ls", masks.local_global(5, 1, 50))):
        ref_y, ref_g = _attend("manual", mask, H, q, k, v, False, None, True)  # float64, CPU
        for backend in ("manual", "sdpa", "flex"):
            for dt in (torch.float32, torch.bfloat16):
                for compiled in (False, True):
                    name = f"{mname}/{backend}/{str(dt)[6:]}/{'compile' if compiled else 'eager'}"
                    grad = not (backend == "flex" and device.type != "cuda")
                    if args.quick and compiled and backend != "flex":
                        report("parity", name, "SKIP", why="--quick")
                        continue
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            y, g = _attend(backend, mask, H, *(t.to(device, dt) for t in (q, k, v)),
                                           compiled, cb, grad)
                    except Exception as e:                           # noqa: BLE001 - reported
                        report("parity", name, "FAIL", error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
                        continue
                    err = {"out": float((y.double().cpu() - ref_y).abs().max() / ref_y.abs().max())}
                    if g is not None:
                        for n, a, b in zip("qkv", g, ref_g):
                            err[f"d{n}"] = float((a.double().cpu() - b).abs().max() / b.abs().max())
                    worst = max(err.values())
                    info = {f"rel_err_{n}": e for n, e in err.items()}
                    if g is None:
                        info["note"] = "forward only (flex has no CPU backward)"
                    if compiled:
                        info["compile_backend"] = cb
                    report("parity", name, "PASS" if worst <= tol[dt] else "FAIL", **info)


# ------------------------------------------------------------------------------------ graph breaks
def _tiny_model(attention, device, span=None, **kw):
    from dyntool.span import SpanConfig
    from dyntool.train.config import ModelConfig
    from dyntool.train.gpt import GPT
    backend = "flex" if attention == "ls" and device.type == "cuda" else "auto"
    cfg = ModelConfig(attention=attention, n_layer=2, n_head=6, n_embd=192, n_local=5, n_global=1,
                      window=50, backend=backend, **kw)
    torch.manual_seed(0)
    return GPT(cfg, 1000, 256, span=SpanConfig(**(span or {})), device_type=device.type).to(device)


def check_graph_breaks(device, args) -> None:
    from torch._dynamo.utils import counters
    cb = args.compile_backend or ("inductor" if device.type == "cuda" else "aot_eager")
    arms = {"mhsa": ("mhsa", None), "ls": ("ls", None), "qknorm": ("qknorm", None),
            "span_c1_orthogonal": ("span", {"alpha_q": 2.0, "alpha_k": 2.0}),
            "span_c1_oblique": ("span", {"candidate": "c1_oblique", "alpha_q": 2.0, "alpha_k": 2.0})}
    for name, (att, span) in arms.items():
        model = _tiny_model(att, device, span)
        x = torch.randint(0, 1000, (2, 256), device=device)
        torch._dynamo.reset()
        counters.clear()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cm = torch.compile(model, backend=cb)
                amp = torch.autocast(device.type, torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
                with amp:
                    _, loss = cm(x, x)
                loss.backward()
        except Exception as e:                                       # noqa: BLE001 - reported
            report("graph_breaks", name, "FAIL", error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            continue
        breaks = dict(counters["graph_break"])
        report("graph_breaks", name, "PASS" if not breaks else "FAIL", graph_breaks=sum(breaks.values()),
               compile_backend=cb, **({"reasons": list(breaks)[:3]} if breaks else {}))


def _deterministic(cfg_keys: set, gpu: bool) -> list[str]:
    if "deterministic" in cfg_keys:
        return ["--train.deterministic=true"]
    if gpu:   # TODO(trainops): replace with the trainer's deterministic switch once it is merged
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    return []


def check_resume(device, args, tmp: Path) -> None:
    from dyntool.train.config import TrainLoopConfig

    gpu = device.type == "cuda"
    n = 20 if gpu else 6
    det = _deterministic(set(TrainLoopConfig.__dataclass_fields__), gpu)
    base = [f"--data.path={data_path(tmp)}", f"--train.max_steps={n}", "--train.eval_every=0",
            "--train.final_eval=false", "--record.every=0", f"--device={'cuda' if gpu else 'cpu'}"] + det
    if not gpu:
        base += TINY
    cfg_file = "wikitext_mhsa"
    preset = "gpu" if gpu else "small"
    try:
        _, full = run_training(load_config(cfg_file, preset, base), str(tmp / "runs"), name="straight", quiet=True)
        half, _ = run_training(load_config(cfg_file, preset, base + [f"--train.stop_at={n // 2}"]),
                               str(tmp / "runs"), name="half", quiet=True)
        _, resumed = run_training(load_config(None, None, [], resume=str(half)), str(tmp / "runs"),
                                  name="resumed", resume=str(half), quiet=True)
    except Exception as e:                                           # noqa: BLE001 - reported
        report("resume", "exact", "FAIL", error=f"{type(e).__name__}: {str(e)[:200]}")
        return
    same = full["param_sha256"] == resumed["param_sha256"]
    report("resume", "exact", "PASS" if same else "FAIL", steps=n,
           deterministic=("train.deterministic" if det else ("torch.use_deterministic_algorithms (TODO: trainer switch)"
                                                            if gpu else "n/a on CPU")))


# ------------------------------------------------------------------------------------------- ddp
def check_ddp(device, args, tmp: Path) -> None:
    two_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    dev = "cuda" if two_gpus else "cpu"
    if not two_gpus:
        print("  note  fewer than 2 GPUs: DDP runs 2 CPU processes with gloo", flush=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "dyntool",
           "train", "--config", "wikitext_mhsa", "--preset", "small",
           "--out", str(tmp / "ddp"), "--name", "ddp", "--quiet", f"--data.path={data_path(tmp)}",
           f"--device={dev}", "--train.max_steps=4", "--train.eval_every=0", "--train.final_eval=false",
           "--record.every=0"] + TINY
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        report("ddp", dev, "FAIL", rc=p.returncode, error=(p.stderr or p.stdout).strip().splitlines()[-1][:200])
        return
    meta = json.loads((tmp / "ddp" / "ddp" / "meta.json").read_text())
    digests = meta.get("final", {}).get("param_sha256_ranks", [])
    ok = len(digests) == 2 and len(set(digests)) == 1
    report("ddp", dev, "PASS" if ok else "FAIL", world=meta.get("world_size"), ranks_agree=ok)


# ------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="smaller parity problem, skip compiled manual/sdpa")
    p.add_argument("--steps", type=int, default=60, help="trainer steps per throughput run on CUDA")
    p.add_argument("--arms", default="mhsa,ls,span", help="throughput: the attention variants to time")
    p.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOPS for MFU")
    p.add_argument("--compile-backend", default=None, help="default: inductor on CUDA, aot_eager on CPU")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        print(f"gpu_check: error: unknown section(s) {bad} (one of {', '.join(SECTIONS)})", file=sys.stderr)
        return 2
    RESULTS.clear()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hw = hardware(device)
    print(f"gpu_check on {hw}", flush=True)
    if device.type != "cuda":
        print("  note  no CUDA device: GPU-only parts are skipped or run as CPU smoke checks "
              "(flex backward, inductor compile, MFU, peak memory, nccl)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for s in only:
            print(f"[{s}]", flush=True)
            t0 = time.perf_counter()
            try:
                if s == "parity":
                    check_parity(device, args)
                elif s == "graph_breaks":
                    check_graph_breaks(device, args)
                else:
                    {"throughput": check_throughput, "resume": check_resume, "ddp": check_ddp}[s](
                        device, args, Path(tmp))
            except Exception as e:                                   # noqa: BLE001 - one section fails
                report(s, "section", "FAIL", error=f"{type(e).__name__}: {e}")
                if os.environ.get("DYNTOOL_DEBUG"):
                    traceback.print_exc()
            print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    n = {k: sum(r["status"] == k for r in RESULTS) for k in ("PASS", "FAIL", "SKIP")}
    print(f"gpu_check: {n['PASS']} passed, {n['FAIL']} failed, {n['SKIP']} skipped", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"hardware": hw, "results": RESULTS}, indent=2, default=str))
    return 1 if n["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
