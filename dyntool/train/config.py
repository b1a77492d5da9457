"""``TrainConfig``: the sections of a ``dyntool train`` config (TOML top-level tables).

``[data] [model] [span] [optim] [train] [record]`` plus top-level ``seed`` and ``device``.
Every value can be overridden as ``--section.key=value``; unknown keys, wrong types, non-finite
floats and values outside the bounds annotated below are errors naming the key
(:func:`dyntool.config.load`, the one validation layer).  ``[span]`` is
:class:`dyntool.span.SpanConfig` itself (it checks its own values).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from ..config import Device, NonNegFloat, NonNegInt, PosInt, Range, Seed
from ..data import sources
from ..errors import ConfigError
from ..record.policy import RecordConfig
from ..record.selection import resolve
from ..span_config import SpanConfig
from .final_eval import MODES, normalize

ATTENTIONS = ("mhsa", "ls", "span", "qknorm")


@dataclass
class DataConfig:
    # a folder of train/valid/test.txt or of the hub's parquet files, or hf:Salesforce/wikitext[/CONFIG];
    # "" = ../shared/data/wikitext-2 if present, else hf:Salesforce/wikitext
    path: str = ""
    batch_size: int = 16            # sequences per micro-batch (per rank)
    block_size: int = 64            # T, tokens per sequence
    eval_batch_size: int = 16
    eval_max_batches: int = 0       # cap of the periodic validation (0 = the whole split)
    probe_split: str = "valid"      # where the fixed probe batch comes from
    probe_offset: NonNegInt = 0

    def validate(self, prefix: str = "") -> None:
        if self.batch_size < 1 or self.block_size < 2 or self.eval_batch_size < 1:
            raise ConfigError(prefix + "batch_size/block_size", "batch_size >= 1, block_size >= 2")
        if self.probe_split not in ("train", "valid", "test"):
            raise ConfigError(prefix + "probe_split", f"train, valid or test, got {self.probe_split!r}")
        if self.eval_max_batches < 0:
            raise ConfigError(prefix + "eval_max_batches", "must be >= 0")


@dataclass
class ModelConfig:
    attention: str = "mhsa"         # mhsa | ls | span | qknorm
    n_layer: PosInt = 4
    n_head: PosInt = 4
    n_embd: PosInt = 128
    bias: bool = False
    tie_weights: bool = True        # share wte and lm_head (the 33k-word vocab dominates otherwise)
    backend: str = "auto"           # auto | sdpa | manual | flex  (auto: flex for ls on CUDA, else sdpa)
    n_local: int = 3                # ls: sliding-window heads (first n_local heads) ...
    n_global: int = 1               # ... then causal heads; n_local + n_global == n_head
    window: int = 16                # ls: query i sees keys i-window+1 .. i (window includes itself)
    qk_norm: bool = False           # LayerNorm on q, k per head (implied by attention = "qknorm")
    init_std: NonNegFloat = 0.02
    dropout: Annotated[float, Range(0, 1)] = 0.0  # on the embedding sum, the attention output and the MLP output
    vocab_multiple: PosInt = 1        # pad wte/lm_head rows to a multiple (64 on GPU: tensor-core shapes)

    def validate(self, prefix: str = "") -> None:
        p = prefix
        if self.attention not in ATTENTIONS:
            raise ConfigError(p + "attention", f"one of {', '.join(ATTENTIONS)}, got {self.attention!r}")
        if self.backend not in ("auto", "sdpa", "manual", "flex"):
            raise ConfigError(p + "backend", f"auto, sdpa, manual or flex, got {self.backend!r}")
        if self.n_layer < 1 or self.n_head < 1 or self.n_embd % self.n_head:
            raise ConfigError(p + "n_embd", f"n_layer, n_head >= 1 and n_embd ({self.n_embd}) divisible "
                                            f"by n_head ({self.n_head})")
        if self.attention == "ls":
            if self.n_local < 0 or self.n_global < 0 or self.n_local + self.n_global != self.n_head:
                raise ConfigError(p + "n_local", f"n_local + n_global must equal n_head={self.n_head} "
                                                 f"(got {self.n_local} + {self.n_global})")
        if self.window < 1:                     # whatever the attention: a window of 0 keys means nothing
            raise ConfigError(p + "window", f"must be >= 1, got {self.window}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(p + "dropout", f"must be in [0, 1), got {self.dropout}")
        if self.vocab_multiple < 1:
            raise ConfigError(p + "vocab_multiple", f"must be >= 1, got {self.vocab_multiple}")
        if self.attention == "span" and self.backend in ("manual", "flex"):
            raise ConfigError(p + "backend", "span runs on sdpa (its backward replaces SDPA's); use auto or sdpa")


@dataclass
class OptimConfig:
    lr: float = 2e-3                # peak learning rate
    min_lr_ratio: float = 0.1       # cosine decays to lr * min_lr_ratio at max_steps
    warmup_steps: int = 50          # linear warmup from 0
    weight_decay: NonNegFloat = 0.1  # on 2-D weights only (not biases, LayerNorms)
    beta1: Annotated[float, Range(0, 1)] = 0.9
    beta2: Annotated[float, Range(0, 1)] = 0.95
    grad_clip: float = 1.0          # global-norm clip (0 = off)
    accum: int = 1                  # gradient accumulation micro-steps per step

    def validate(self, prefix: str = "") -> None:
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise ConfigError(prefix + "lr", "lr > 0, 0 <= min_lr_ratio <= 1, warmup_steps >= 0")
        if self.accum < 1 or self.grad_clip < 0:
            raise ConfigError(prefix + "accum", "accum >= 1 and grad_clip >= 0")


@dataclass
class TrainLoopConfig:
    max_steps: PosInt = 500         # optimizer steps; the LR schedule spans these
    stop_at: int = 0                # stop (checkpointed) after this many steps; 0 = max_steps
    eval_every: int = 100           # validation every N steps and at the last; 0 = none (final_eval only)
    checkpoint_every: int = 100     # checkpoint every N steps (0 = only at the end, stop_at, signal)
    checkpoint: bool = True         # write checkpoint.pt (needed for --resume)
    # validation + test perplexity at the end (meta.final): auto = the whole splits, or bounded to
    # about the tokens trained on when the run read fewer; full = always exact; off = none
    # (the old true/false still load: true = full).  dyntool/train/final_eval.py
    final_eval: str = "auto"
    dtype: str = "auto"             # auto (bf16 autocast on CUDA, float32 on CPU) | float32 | float64 | bfloat16
    compile: bool = False           # torch.compile; full-tier steps run eager, cheap-tier steps too unless fused
    logit_stat: str = "exact"       # per-step max|logit|: exact | bound | off (see recording.py)
    log_every: int = 1              # metrics row every N steps (recording steps always)
    threads: NonNegInt = 0          # torch.set_num_threads (0 = leave)
    deterministic: bool = False     # deterministic kernels (exact resume on CUDA; slower)
    parallel: str = "auto"          # under torchrun: auto (= ddp) | ddp | fsdp (FSDP2, dyntool/train/fsdp.py)
    # "every N steps" is `every` in every config (record.every, eval_every of the sims); old names accepted
    RENAMED: ClassVar[dict[str, str]] = {"eval_interval": "eval_every", "checkpoint_interval": "checkpoint_every",
                                         "log_interval": "log_every"}

    def __post_init__(self) -> None:
        self.final_eval = normalize(self.final_eval)

    def validate(self, prefix: str = "") -> None:
        p = prefix
        if self.final_eval not in MODES:
            raise ConfigError(p + "final_eval", f"auto, full or off, got {self.final_eval!r}")
        if self.max_steps < 1 or self.stop_at < 0:
            raise ConfigError(p + "max_steps", "max_steps >= 1 and stop_at >= 0")
        if self.eval_every < 0 or self.checkpoint_every < 0 or self.log_every < 1:
            raise ConfigError(p + "eval_every", "eval_every, checkpoint_every must be >= 0, log_every >= 1")
        if self.dtype not in ("auto", "float32", "float64", "bfloat16"):
            raise ConfigError(p + "dtype", f"auto, float32, float64 or bfloat16, got {self.dtype!r}")
        if self.logit_stat not in ("exact", "bound", "off"):
            raise ConfigError(p + "logit_stat", f"exact, bound or off, got {self.logit_stat!r}")
        if self.parallel not in ("auto", "ddp", "fsdp"):
            raise ConfigError(p + "parallel", f"auto, ddp or fsdp, got {self.parallel!r}")


@dataclass
class TrainConfig:
    seed: Seed = 0
    device: Device = "auto"         # auto | cpu | cuda | cuda:N | mps
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    span: SpanConfig = field(default_factory=SpanConfig)   # used when model.attention = "span"
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    record: RecordConfig = field(default_factory=lambda: RecordConfig(every=50, seqs=1))

    def validate(self, prefix: str = "") -> None:
        if self.data.path and not self.data.path.startswith(sources.HUB_PREFIX):
            sources.local_source(self.data.path)     # a missing or wrong folder: refused before torch loads
        rc = self.record
        if rc.enabled and rc.cheap_every > 0:
            # deferred: keeps torch off checking a config (`dyntool train` refuses a bad value before torch loads)
            from ..cheap_stats import CPU_BLOCK_MIB, block_rows
            S = min(rc.cheap_seqs or self.data.batch_size, self.data.batch_size)
            T = self.data.block_size
            # 0 (sized for the device) is at least the CPU's 64 MiB: checked as that
            if block_rows(S, self.model.n_head, T, T, 4, rc.max_block_mib or CPU_BLOCK_MIB) < 1:
                raise ConfigError(prefix + "record.max_block_mib", f"{rc.max_block_mib} MiB is too small for one "
                                  f"query row of the cheap tier ({S}×{self.model.n_head}×{T} scores)")
        if rc.enabled and (rc.every or rc.steps or rc.log_spaced):
            from ..stream import rows_per_block         # deferred: as cheap_stats above
            resolve(rc.heads, self.model.n_layer, self.model.n_head, prefix + "record.heads")
            from ..cheap_stats import CPU_BLOCK_MIB     # deferred: as above
            if rows_per_block(rc.seqs, self.data.block_size, 4, rc.max_block_mib or CPU_BLOCK_MIB, rc.pool or 1) < 1:
                raise ConfigError(prefix + "record.max_block_mib", f"{rc.max_block_mib} MiB is too small for one "
                                  f"query-row block of the full tier ({rc.seqs}×{max(rc.pool, 1)}×"
                                  f"{self.data.block_size} scores)")
        if self.record.batch == "train" and self.record.seqs > self.data.batch_size:
            raise ConfigError(prefix + "record.seqs", f"{self.record.seqs} > data.batch_size "
                                                      f"{self.data.batch_size}")
