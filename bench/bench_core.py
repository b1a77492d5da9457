"""Core benchmarks (issue: Core).  Ratios are measured in one process on the same machine.

1. Instrumentation overhead: mean training-step time, recording every 50 steps on a fixed probe
   batch vs recording off (target ≤ 1.05×).
2. Recorder throughput: MB/s written and compression ratio for float16 attention matrices.
3. Read latency: one step's (T × T) slice of one head from a ≥ 1 GB record (target < 100 ms).

    python bench/bench_core.py [--quick]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import dir_size, hardware

from dyntool.attention import CausalSelfAttention
from dyntool.record.policy import RecordConfig
from dyntool.recorder import Recorder
from dyntool.record.store import StoreReader
from dyntool.record.store_writer import StoreWriter


class Block(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, nh)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, V=512, C=128, nh=4, L=2, T=128):
        super().__init__()
        self.emb, self.pos = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, nh) for _ in range(L))
        for i, b in enumerate(self.blocks):
            b.attn.core.layer_index = i
        self.head = nn.Linear(C, V)

    def forward(self, idx):
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def bench_overhead(steps: int, every: int, tmp: Path) -> dict:
    torch.manual_seed(0)
    V, T, B = 512, 128, 16
    data = torch.randint(V, (steps, B, T + 1))
    probe = torch.randint(V, (1, T + 1))

    def loss_of(model, batch):
        return F.cross_entropy(model(batch[:, :-1]).reshape(-1, V), batch[:, 1:].reshape(-1))

    def train(record: bool, tag: str) -> float:
        torch.manual_seed(0)
        model = TinyLM(V=V, T=T)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        rec = None
        if record:
            cfg = RecordConfig(every=every, dtype="float16")
            store = StoreWriter(tmp / f"{tag}.zarr", cfg.chunk_steps)
            rec = Recorder(store, cfg, steps, T)
        t0 = time.perf_counter()
        for s in range(steps):
            if rec is not None and rec.wants(s):
                rec.record_probe(model, lambda m: loss_of(m, probe), s)
            opt.zero_grad(set_to_none=True)
            loss_of(model, data[s]).backward()
            opt.step()
        if rec is not None:
            rec.close()
        return (time.perf_counter() - t0) / steps

    off, on = [], []
    for r in range(3):                         # interleave to cancel drift
        off.append(train(False, f"off{r}"))
        on.append(train(True, f"on{r}"))
    return {"step_ms_off": 1e3 * statistics.median(off), "step_ms_on": 1e3 * statistics.median(on),
            "ratio": statistics.median(on) / statistics.median(off), "steps": steps, "every": every}


def realistic_attention(T: int, H: int, seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(H, T, 32, generator=g), torch.randn(H, T, 32, generator=g)
    s = (q @ k.transpose(-1, -2)) / 32 ** 0.5 * 2
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1).numpy().astype(np.float16)


def bench_write(tmp: Path, T: int, H: int, steps: int) -> dict:
    base = realistic_attention(T, H, 0)[None, :, None]                 # (1, H, 1, T, T)
    w = StoreWriter(tmp / "write.zarr", chunk_steps=8)
    t0 = time.perf_counter()
    for s in range(steps):
        w.append(s, {"attn": np.roll(base, s, axis=-1)})
    w.close()
    dt = time.perf_counter() - t0
    raw = base.nbytes * steps
    disk = dir_size(tmp / "write.zarr")
    return {"MB_per_s": raw / dt / 1e6, "raw_MB": raw / 1e6, "disk_MB": disk / 1e6,
            "compression_ratio": raw / disk}


def bench_read(tmp: Path, T: int, H: int, steps: int) -> dict:
    path = tmp / "big.zarr"
    w = StoreWriter(path, chunk_steps=4)
    pats = [realistic_attention(T, H, s)[None, :, None] for s in range(4)]
    for s in range(steps):
        w.append(s, {"attn": pats[s % 4]})
    w.close()
    disk = dir_size(path)
    r = StoreReader(path)
    a = r["attn"]
    rng = np.random.default_rng(0)
    lat = []
    for _ in range(30):
        i, h = int(rng.integers(steps)), int(rng.integers(H))
        t0 = time.perf_counter()
        x = a[i, 0, h, 0]
        lat.append(time.perf_counter() - t0)
        assert x.shape == (T, T)
    return {"record_GB_on_disk": disk / 1e9, "record_GB_raw": steps * pats[0].nbytes / 1e9,
            "read_ms_median": 1e3 * statistics.median(lat), "read_ms_max": 1e3 * max(lat)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test of the bench)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dyntool-bench-"))
    try:
        print("hardware:", hardware())
        ov = bench_overhead(steps=60 if args.quick else 300, every=50, tmp=tmp)
        print(f"1. recording every {ov['every']} steps: {ov['step_ms_on']:.1f} ms/step vs off "
              f"{ov['step_ms_off']:.1f} ms/step -> ratio {ov['ratio']:.3f} (target <= 1.05)")
        wr = bench_write(tmp, T=512 if args.quick else 1024, H=4, steps=16 if args.quick else 64)
        print(f"2. recorder: {wr['MB_per_s']:.0f} MB/s of float16 attention, {wr['raw_MB']:.0f} MB raw -> "
              f"{wr['disk_MB']:.0f} MB on disk (compression ratio {wr['compression_ratio']:.2f})")
        rd = bench_read(tmp, T=1024 if args.quick else 2048, H=4, steps=8 if args.quick else 160)
        print(f"3. read one step's {2048 if not args.quick else 1024}² slice of one head from a "
              f"{rd['record_GB_on_disk']:.2f} GB record ({rd['record_GB_raw']:.2f} GB raw): "
              f"median {rd['read_ms_median']:.1f} ms, max {rd['read_ms_max']:.1f} ms (target < 100 ms)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
