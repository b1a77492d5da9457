"""Shared helpers for benchmarks: hardware description and robust timing."""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path


def hardware() -> str:
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{cpu}; {os.cpu_count()} cores; torch {torch.__version__} "
            f"({torch.get_num_threads()} threads); Python {platform.python_version()}")


def median_time(fn, repeat: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def dir_size(path: Path) -> int:
    """Bytes of every file under ``path`` (what the store costs on disk)."""
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            pass
    return total
