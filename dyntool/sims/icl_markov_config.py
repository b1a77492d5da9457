"""The configuration of ``dyntool sim icl-markov`` (presets in ``dyntool/presets/icl_markov.toml``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from ..config import Device, NonNegFloat, NonNegInt, Pattern, PosFloat, PosInt, Range, Seed
from ..errors import ConfigError
from ..record.policy import RecordConfig
from .icl_markov_task import BIRKHOFF_MAX_K, PRIORS

_PRIOR = Pattern("|".join(PRIORS), " or ".join(PRIORS))


@dataclass
class ICLMarkovModelConfig:
    n_layer: Annotated[int, Range(1, 8)] = 2
    n_head: PosInt = 1                  # heads per layer
    n_embd: PosInt = 16
    backend: Annotated[str, Pattern("sdpa|manual", "sdpa or manual")] = "sdpa"
    init_std: PosFloat = 0.02
    proj_std: PosFloat = 0.01           # the output projections (the authors' init)
    dropout: NonNegFloat = 0.0          # refused above 0: recording needs the attention as computed

    def validate(self, prefix: str = "") -> None:
        if self.n_embd % self.n_head:
            raise ConfigError(prefix + "n_embd", f"must be divisible by n_head ({self.n_head}), got {self.n_embd}")
        if self.dropout > 0:
            raise ConfigError(prefix + "dropout", "dropout is not supported: attention dropout would make the "
                                                  "recorded α differ from the α that produced the output")


@dataclass
class ICLMarkovConfig:
    seeds: list[Seed] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    k: Annotated[int, Range(2, 8)] = 3
    alpha: PosFloat = 1.0               # Dirichlet concentration of every transition row
    T: Annotated[int, Range(4, 4096)] = 100
    prior: Annotated[str, _PRIOR] = "dirichlet"
    control: bool = True                # also run every seed under the control prior
    control_prior: Annotated[str, _PRIOR] = "doubly_stochastic"   # "birkhoff": the authors' control
    extra_priors: list[str] = field(default_factory=list)   # more training priors per seed (the contrast)
    eval_priors: list[str] = field(default_factory=list)    # held-out sets besides the run's own prior
    unigram_share: Annotated[float, Range(0, 1)] = 0.5      # birkhoff_unigram: the unigram-only chains' share
    steps: PosInt = 2000
    batch_size: PosInt = 64
    lr: PosFloat = 3e-3
    beta1: Annotated[float, Range(0, 1)] = 0.9
    beta2: Annotated[float, Range(0, 1)] = 0.95
    weight_decay: NonNegFloat = 0.1
    grad_clip: NonNegFloat = 0.0        # 0: none (the authors do not clip)
    heldout_seqs: PosInt = 256
    heldout_seed_offset: NonNegInt = 10000
    eval_every: PosInt = 10             # the logged steps: held-out KLs and attention scores
    dense_rerun: bool = False           # rerun the first seed with the full tier densely around its stage boundaries
    dense_window: PosInt = 100          # ... every dense_every steps within ± this many steps
    dense_every: PosInt = 10
    dtype: Annotated[str, Pattern("float32|float64", "float32 or float64")] = "float32"
    device: Device = "cpu"
    threads: NonNegInt = 0              # torch threads (0: leave the default)
    time_limit_min: NonNegFloat = 0.0   # the study stops (checkpointed) before the first step past this wall time
                                        # (0: none); `--resume STUDY` continues it (dyntool/sims/resume.py)
    stop_at_step: NonNegInt = 0         # the same stop at a fixed step of the first unfinished run (0: none)
    checkpoint_every: NonNegInt = 0     # also checkpoint every this many steps (0: only when stopped and at the end)
    model: ICLMarkovModelConfig = field(default_factory=ICLMarkovModelConfig)
    record: RecordConfig = field(default_factory=lambda: RecordConfig(
        every=250, seqs=2, batch="train", dtype="float32", cheap_every=1))

    def validate(self, prefix: str = "") -> None:
        p = prefix
        if not self.seeds:
            raise ConfigError(p + "seeds", "give at least one seed")
        if len(set(self.seeds)) != len(self.seeds) or any(not 0 <= s < 2**32 for s in self.seeds):
            raise ConfigError(p + "seeds", f"distinct seeds in 0 .. 2**32-1, got {self.seeds}")
        for name in ("extra_priors", "eval_priors"):
            bad = [v for v in getattr(self, name) if v not in PRIORS]
            if bad:
                raise ConfigError(p + name, f"unknown prior {bad[0]!r} (one of {', '.join(PRIORS)})")
        used = [self.prior, *self.extra_priors, *self.eval_priors] + ([self.control_prior] if self.control else [])
        if self.k > BIRKHOFF_MAX_K and any(v in ("birkhoff", "birkhoff_unigram") for v in used):
            raise ConfigError(p + "k", f"the birkhoff priors' rejection sampler is for k <= {BIRKHOFF_MAX_K}, got {self.k}")
        if self.record.batch != "train":
            raise ConfigError(p + "record.batch", "icl-markov records the training batch (train); got "
                                                  f"{self.record.batch!r}")
        if self.record.seqs > self.batch_size:
            raise ConfigError(p + "record.seqs", f"at most batch_size ({self.batch_size}), got {self.record.seqs}")
        if self.record.cheap_every < 1:
            raise ConfigError(p + "record.cheap_every", "the study reads the cheap tier: must be >= 1 (1: every step)")
        if self.eval_every > self.steps:
            raise ConfigError(p + "eval_every", f"at most steps ({self.steps}), got {self.eval_every}")
