"""What to record, when, and how big it gets (checked against a disk budget before a run).

``RecordConfig`` is the ``[record]`` section of every run config.
"""
from __future__ import annotations

import math
import shutil
import warnings
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..config import DeprecatedKeyWarning
from ..errors import ConfigError
from . import names
from .selection import parse_heads

DEFAULT_ARRAYS = [n for n in names.DIMS if not n.endswith("_pooled")]


@dataclass
class RecordConfig:
    enabled: bool = True
    every: int = 50                   # record every N steps (0: off) ...
    steps: list[int] = field(default_factory=list)   # ... and/or these explicit steps ...
    log_spaced: int = 0               # ... and/or this many log-spaced steps over the run
    batch: str = "probe"              # "probe": a fixed probe batch; "train": the training batch
    seqs: int = 1                     # sequences of the batch to record
    arrays: list[str] = field(default_factory=lambda: list(DEFAULT_ARRAYS))
    # the crop of the stored T×T matrices: [start, stop) of query / key positions; [] = all
    query_crop: list[int] = field(default_factory=list)
    key_crop: list[int] = field(default_factory=list)
    heads: str = "all"                # the full tier's heads: "all" or L0H3,L5H*,L*H0 (record/selection.py)
    pool: int = 0                     # block size of the pooled overview of full matrices (0: off)
    dtype: str = "float16"            # storage dtype of forward quantities (α, S, q/k/v, entropies)
    # storage dtype of the gradient quantities (U, B, A, ∂L/∂S, dQ/dK/dV, E_α[b]): float16's normal
    # range ends at 6e-5, below most score gradients of a real LM (median |∂L/∂S| 1.5e-5 measured on
    # the HF Trainer example: 6.4 % of them stored as exactly 0 in float16), so float32 by default
    grad_dtype: str = "float32"
    disk_budget_gb: float = 4.0       # refuse to start if the estimate exceeds this
    chunk_steps: int = 16             # steps per writer flush / chunk along step
    flush_seconds: float = 30.0       # also flush at least this often (bounds loss on kill -9)
    # the cheap tier (dyntool.flight): per-head statistics on the training batch, no T×T kept
    cheap_every: int = 0              # every N steps (1: every step; 0: off)
    cheap_seqs: int = 0               # sequences of each micro-batch it reduces over (0: all)
    # memory of one query-row block of the tiers' T×T work; 0: sized for the device (64 MiB on the
    # CPU, 1/32 of a GPU's memory up to 2 GiB: dyntool.cheap_stats.block_budget_mib)
    max_block_mib: float = 0.0
    # the cheap tier's path (dyntool.fused_path): auto (the fused Triton kernel on CUDA, eager
    # elsewhere), eager, or fused (the kernel or a one-line refusal naming the site)
    kernel: str = "auto"
    # the crop's old names: "window" is the attention's own (LS), so the crop is only called a crop.
    # Accepted in configs (dyntool.config.rename) and, for code built on RecordConfig(...), here.
    RENAMED: ClassVar[dict[str, str]] = {"query_window": "query_crop", "key_window": "key_crop"}
    query_window: InitVar[list[int] | None] = None
    key_window: InitVar[list[int] | None] = None

    def __post_init__(self, query_window, key_window):
        for old, value in (("query_window", query_window), ("key_window", key_window)):
            if value is None:
                continue
            new = self.RENAMED[old]
            warnings.warn(f"RecordConfig({old}=...) is deprecated, use {new}", DeprecatedKeyWarning, stacklevel=3)
            if getattr(self, new) and list(getattr(self, new)) != list(value):
                raise ConfigError(new, f"{old} is its older name; give one of them")
            setattr(self, new, list(value))

    def validate(self, prefix: str = "") -> None:
        p = prefix
        if self.every < 0:
            raise ConfigError(p + "every", f"must be >= 0, got {self.every}")
        if self.batch not in ("probe", "train"):
            raise ConfigError(p + "batch", f"must be 'probe' or 'train', got {self.batch!r}")
        for key in ("dtype", "grad_dtype"):
            if getattr(self, key) not in ("float16", "float32"):
                raise ConfigError(p + key, f"must be float16 or float32, got {getattr(self, key)!r}")
        unknown = [a for a in self.arrays if a not in names.DIMS or a.endswith("_pooled")]
        if unknown:
            raise ConfigError(p + "arrays", f"unknown array(s) {unknown} (known: {', '.join(DEFAULT_ARRAYS)})")
        for key in ("query_crop", "key_crop"):
            w = getattr(self, key)
            if w and (len(w) != 2 or w[0] < 0 or w[1] <= w[0]):
                raise ConfigError(p + key, f"must be [start, stop) with 0 <= start < stop, got {w}")
        parse_heads(self.heads, p + "heads")
        if self.pool < 0 or self.seqs < 1 or self.chunk_steps < 1:
            raise ConfigError(p + "pool/seqs/chunk_steps", "pool >= 0, seqs >= 1, chunk_steps >= 1")
        if any(s < 0 for s in self.steps):
            raise ConfigError(p + "steps", "steps must be >= 0")
        if self.cheap_every < 0 or self.cheap_seqs < 0:
            raise ConfigError(p + "cheap_every/cheap_seqs", f"must be >= 0, got {self.cheap_every}, {self.cheap_seqs}")
        if self.kernel not in ("auto", "eager", "fused"):
            raise ConfigError(p + "kernel", f"must be auto, eager or fused, got {self.kernel!r}")
        if not self.flush_seconds >= 0:
            raise ConfigError(p + "flush_seconds", f"must be >= 0 (seconds between flushes), got {self.flush_seconds}")
        if not self.max_block_mib >= 0:
            raise ConfigError(p + "max_block_mib", f"must be > 0 (MiB) or 0 (sized for the device), "
                                                   f"got {self.max_block_mib}")
        if self.log_spaced < 0 or self.disk_budget_gb <= 0:
            raise ConfigError(p + "log_spaced/disk_budget_gb", "log_spaced >= 0 and disk_budget_gb > 0")


def schedule(cfg: RecordConfig, max_steps: int) -> np.ndarray:
    """Sorted unique steps in [0, max_steps) to record (always includes the last when any)."""
    if not cfg.enabled:
        return np.zeros(0, dtype=np.int64)
    s: set[int] = set(int(x) for x in cfg.steps if x < max_steps)
    if cfg.every > 0:
        s.update(range(0, max_steps, cfg.every))
        s.add(max_steps - 1)
    if cfg.log_spaced > 0 and max_steps > 0:
        s.update(int(x) for x in np.unique(np.round(np.geomspace(1, max_steps, cfg.log_spaced)) - 1))
    return np.array(sorted(x for x in s if 0 <= x < max_steps), dtype=np.int64)


def cheap_wants(cfg: RecordConfig, step: int) -> bool:
    """Is ``step`` a cheap-tier step?"""
    return cfg.enabled and cfg.cheap_every > 0 and step % cfg.cheap_every == 0


def _span(w: list[int], T: int) -> tuple[int, int]:
    return (min(w[0], T), min(w[1], T)) if w else (0, T)


def crops(cfg: RecordConfig, T: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The crop ``(q0, q1), (k0, k1)`` of the stored matrices at length ``T``; a crop reaching past
    ``T`` is refused (it would be cut silently, and the stored shape would not be the one asked for)."""
    q0, q1 = _span(cfg.query_crop, T)
    k0, k1 = _span(cfg.key_crop, T)
    if q1 <= q0 or k1 <= k0:
        raise ConfigError("record.query_crop/key_crop", f"the crop is empty for T={T}")
    for key in ("query_crop", "key_crop"):
        w = getattr(cfg, key)
        if w and w[1] > T:
            raise ConfigError(f"record.{key}", f"{list(w)} reaches past the sequence length T={T}; "
                                               f"stop at {T} or less")
    return (q0, q1), (k0, k1)


def per_step_shapes(cfg: RecordConfig, L: int, H: int, T: int, d_k: int, d_v: int) -> dict[str, tuple]:
    """Shapes (without the step axis) of every array this config records."""
    S = cfg.seqs
    (q0, q1), (k0, k1) = crops(cfg, T)
    nq, nk = q1 - q0, k1 - k0
    dim = {"query": T, "key": T, "d_k": d_k, "d_v": d_v, "layer": L, "head": H, "seq": S}
    out = {}
    for name in cfg.arrays:
        d = names.DIMS[name]
        if name in names.MATRICES:
            out[name] = (L, H, S, nq, nk)
        else:
            out[name] = tuple(dim[x] for x in d)
    if cfg.pool > 0:
        nb = math.ceil(T / cfg.pool)
        for m, pooled in names.POOLED.items():
            if m in cfg.arrays:
                out[pooled] = (L, H, S, nb, nb)
    out["grad_scale"] = ()
    return out


def storage_dtype(cfg: RecordConfig, name: str) -> str:
    """The dtype array ``name`` is stored in under ``cfg`` (pooled overviews follow their matrix)."""
    base = name[: -len("_pooled")] if name.endswith("_pooled") else name
    if base in names.FLOAT32_ALWAYS:
        return "float32"
    return cfg.grad_dtype if base in names.GRADIENTS else cfg.dtype


def estimate_bytes(cfg: RecordConfig, n_steps: int, L: int, H: int, T: int, d_k: int, d_v: int) -> int:
    per = sum(math.prod(s) * (2 if storage_dtype(cfg, n) == "float16" else 4)
              for n, s in per_step_shapes(cfg, L, H, T, d_k, d_v).items())
    return (per + 8) * n_steps


def check_budget(cfg: RecordConfig, n_steps: int, out_dir: Path, **dims) -> int:
    """Raise ConfigError if the (uncompressed) estimate exceeds the budget or the free disk."""
    est = estimate_bytes(cfg, n_steps, **dims)
    gb = est / 1e9
    if gb > cfg.disk_budget_gb:
        raise ConfigError("record.disk_budget_gb",
                          f"recording would need ~{gb:.2f} GB uncompressed ({n_steps} steps × "
                          f"{est / max(n_steps, 1) / 1e6:.1f} MB/step), over the budget of "
                          f"{cfg.disk_budget_gb} GB; record fewer steps (record.every), fewer heads "
                          f"(record.heads), a crop (record.query_crop), pooling (record.pool), or raise the budget")
    if isinstance(out_dir, str):                 # an object-store URL: no free-space figure to check
        return est
    probe = out_dir if out_dir.exists() else out_dir.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if est > free:
        raise ConfigError("record.disk_budget_gb",
                          f"recording would need ~{gb:.2f} GB but only {free / 1e9:.2f} GB is free at {probe}")
    return est
