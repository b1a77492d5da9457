"""Shared helpers for benchmarks: hardware description and robust timing."""
from __future__ import annotations

import os
import platform
import statistics
import time


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
