"""gpu_check's throughput section: the trainer's tokens/s on the ``gpu`` preset (recording off and
every 50 steps) against the nanoGPT-style reference (bench/nanogpt_ref.py) fed by the same tokens,
MFU and peak memory; a CPU smoke run of the code path without CUDA.  See bench/gpu_check.py."""
from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_common import PEAK_TFLOPS, TINY, VOCAB, report    # noqa: E402

from dyntool.train.runner import load_config, run_training   # noqa: E402


# ------------------------------------------------------------------------------------------- data
def data_path(tmp: Path) -> str:
    from dyntool.data.wikitext import DataError, resolve_data_dir
    try:
        return str(resolve_data_dir(None))
    except DataError:
        pass
    import random
    d = tmp / "synthetic-wikitext"
    if (d / "test.txt").is_file():                                   # built by an earlier section
        return str(d)
    d.mkdir(exist_ok=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(VOCAB - 1)]                      # + <eos>: the same vocab size
    for split, n in (("train", 400_000), ("valid", 40_000), ("test", 40_000)):
        toks = words if split == "train" else []
        toks = toks + [rng.choice(words) for _ in range(n)]
        lines = [" ".join(toks[i:i + 20]) for i in range(0, len(toks), 20)]
        (d / f"{split}.txt").write_text("\n".join(lines) + "\n")
    print(f"  note  WikiText-2 not found: synthetic corpus with {VOCAB} words in {d}", flush=True)
    return str(d)


# ------------------------------------------------------------------------------------- throughput
def flops_per_token(cfg, n_params: int) -> float:
    m, T = cfg.model, cfg.data.block_size
    return 6 * n_params + 12 * m.n_layer * m.n_head * (m.n_embd // m.n_head) * T


def step_times(path: Path, warm: int, every: int) -> tuple[float, float | None]:
    """Median step time of the plain steps after warm-up, and of the recorded ones (multiples of
    ``every`` after warm-up; None without recording): metrics.jsonl does not flag recorded rows."""
    rows = [json.loads(s) for s in (path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] >= warm and "val_loss" not in r and "step_time" in r]
    rec = [r["step_time"] for r in rows if every and r["step"] % every == 0]
    plain = [r["step_time"] for r in rows if not (every and r["step"] % every == 0)]
    return (statistics.median(plain) if plain else float("nan")), (statistics.median(rec) if rec else None)


def _ref_throughput(cfg, device, steps, warm) -> tuple[float, float]:
    from nanogpt_ref import RefGPT, get_batch
    from dyntool.data.wikitext import load_wikitext
    m, d = cfg.model, cfg.data
    train = load_wikitext(d.path or None).train                       # the trainer's tokens
    torch.manual_seed(0)
    model = RefGPT(VOCAB, d.block_size, m.n_layer, m.n_head, m.n_embd, m.bias,
                   dropout=m.dropout, vocab_multiple=m.vocab_multiple).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=(0.9, 0.95),
                            fused=device.type == "cuda" or None)
    net = torch.compile(model) if cfg.train.compile else model
    gen = torch.Generator().manual_seed(0)
    x, y = get_batch(train, d.batch_size, d.block_size, device, gen)
    amp = torch.autocast(device.type, torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(steps):
        t = time.perf_counter()
        with amp:
            _, loss = net(x, y)
        x, y = get_batch(train, d.batch_size, d.block_size, device, gen)   # prefetched, as nanoGPT
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss.detach())                                          # one sync per step, as the trainer
        if i >= warm:
            times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return statistics.median(times), peak


def check_throughput(device, args, tmp: Path) -> None:

    gpu = device.type == "cuda"
    preset, steps = ("gpu", args.steps) if gpu else ("small", 4)
    warm = min(20, steps // 3) if gpu else 2
    if not gpu:
        print("  note  no CUDA: throughput is a smoke run of a tiny model (not a measurement; no MFU, "
              "no peak memory)", flush=True)
    peak_tf = args.peak_tflops
    if peak_tf is None and gpu:
        name = torch.cuda.get_device_name(device)
        peak_tf = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    dpath = data_path(tmp)
    base = [f"--train.max_steps={steps}", "--train.eval_every=0", "--train.final_eval=false",
            "--train.checkpoint=false", f"--data.path={dpath}", "--train.log_every=1",
            f"--device={'cuda' if gpu else 'cpu'}"] + ([] if gpu else TINY)
    rec = {"off": ["--record.enabled=false", "--train.logit_stat=off"],
           "every50": ["--record.every=50", "--train.logit_stat=exact"]}
    # the reference first: a run cut short by a time limit still has its ratio
    cfg = load_config("wikitext_mhsa", preset, base)
    try:
        dt, peak = _ref_throughput(cfg, device, steps, warm)
    except Exception as e:                                           # noqa: BLE001 - reported
        report("throughput", "nanogpt_ref", "FAIL", error=f"{type(e).__name__}: {str(e)[:160]}")
        return
    ref_tps = cfg.data.batch_size * cfg.data.block_size / dt
    info = {"tokens_per_s": ref_tps, "step_ms": dt * 1e3}
    if gpu:
        info["peak_mem_gib"] = peak
    report("throughput", "nanogpt_ref", "PASS", **info)
    out = {}
    for att in args.arms.split(","):
        for rname, ro in rec.items():
            cfg = load_config(f"wikitext_{att}", preset, base + ro)
            if gpu:
                torch.cuda.reset_peak_memory_stats(device)
            try:
                path, _ = run_training(cfg, str(tmp / "runs"), name=f"tp-{att}-{rname}", quiet=True, kind="bench")
            except Exception as e:                                   # noqa: BLE001 - reported
                report("throughput", f"{att}/{rname}", "FAIL", error=f"{type(e).__name__}: {str(e)[:160]}")
                continue
            meta = json.loads((path / "meta.json").read_text())
            every = cfg.record.every if cfg.record.enabled else 0
            dt, dt_rec = step_times(path, warm, every)
            tps = cfg.data.batch_size * cfg.data.block_size / dt
            info = {"tokens_per_s": tps, "step_ms": dt * 1e3}
            if dt_rec is not None:                                   # one recorded step per `every`
                amort = dt + (dt_rec - dt) / every
                info.update(recorded_step_ms=dt_rec * 1e3,
                            tokens_per_s_amortized=cfg.data.batch_size * cfg.data.block_size / amort)
            if gpu:
                info["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                if peak_tf:
                    info["mfu"] = flops_per_token(cfg, meta.get("n_params", 0)) * tps / (peak_tf * 1e12)
            out[(att, rname)] = info
            report("throughput", f"{att}/{rname}", "PASS", **info)
            _ratios(out, att, rname, ref_tps, gpu)                  # at once: a cut run keeps them


def _ratios(out: dict, att: str, rname: str, ref_tps: float, gpu: bool) -> None:
    if (att, rname) == ("mhsa", "off"):
        r = out[("mhsa", "off")]["tokens_per_s"] / ref_tps
        status = ("PASS" if r >= 1.0 else "FAIL") if gpu else "SKIP"
        report("throughput", "mhsa_off_over_ref", status, ratio=r, target=">= 1.0 (GPU only)")
    off, rec = out.get((att, "off")), out.get((att, "every50"))
    if rname == "every50" and off and rec and "tokens_per_s_amortized" in rec:    # recording's cost
        r = off["tokens_per_s"] / rec["tokens_per_s_amortized"]
        status = ("PASS" if r <= 1.05 else "FAIL") if gpu else "SKIP"
        report("throughput", f"{att}_every50_slowdown", status, ratio=r, target="<= 1.05 (GPU only)")


# ---------------------------------------------------------------------------------------- resume
