"""What the GPU session scripts share (bench/gpu_check.py, gpu_throughput.py, gpu_recorder_cost.py):
the result list and its PASS / FAIL / SKIP lines, the hardware line, the constants."""
from __future__ import annotations

import os
from pathlib import Path

import torch

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A40": 149.7}
VOCAB = 33278
RESULTS: list[dict] = []
TINY = ["--model.n_layer=2", "--model.n_embd=64", "--data.batch_size=4", "--data.block_size=32"]  # CPU smoke


def report(section: str, name: str, status: str, **info) -> None:
    RESULTS.append({"section": section, "name": name, "status": status, **info})
    extra = "  ".join(f"{k}={fmt(v)}" for k, v in info.items())
    print(f"  {status:<4}  {section}/{name}  {extra}", flush=True)


def fmt(v):
    return f"{v:.3g}" if isinstance(v, float) else v


def hardware(device: torch.device) -> str:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return f"{p.name}, {p.total_memory / 2**30:.0f} GiB; torch {torch.__version__}; CUDA {torch.version.cuda}"
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "?"
    return f"CPU ({os.cpu_count()} cores, loadavg {load}); torch {torch.__version__}"
