"""The sticky-chain study's configuration (:class:`StickyConfig`, its validation) and the arms it
expands into: per seed, the trained runs and their learning rates (:func:`expand_arms`).

Arms: ``sgd`` (all learning rates ``lr``), ``em`` (the paper's EM-like schedule: W_V at
``lr × value_lr_mult``), ``em_closed_form`` (our extension: an explicit least-squares M-step on
W_V given fixed responsibilities; not the paper's method), and the learning-rate CONTROLS that
ask whether EM's gain is specific to the values: ``readout`` (W_O at ``lr × control_mult``),
``routing`` (W_Q and W_K at ``lr × control_mult``), ``all`` (every learning rate × control_mult),
``sgd_tuned`` (one uniform learning rate, picked from ``tuned_grid`` by the mean final VALIDATION
loss over seeds, on a third sequence ``generate(seed + validation_offset)``; the held-out sequence
only reports; the grid runs are written as ``seed{S}-lr{g}`` and the pick is in summary.json).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from ..config import NonNegFloat, NonNegInt, PosInt, Range, Seed
from ..errors import ConfigError
from ..record.policy import RecordConfig
from ..safeio import memory_problem
from . import single_head as engine
from .sticky_data import HELDOUT_OFFSET, VALIDATION_OFFSET


ARMS = ("sgd", "em", "readout", "routing", "all", "sgd_tuned", "em_closed_form")
CONTROLS = ("readout", "routing", "all", "sgd_tuned")
_ENGINE_ARM = {"sgd": "sgd", "em": "em_like", "em_closed_form": "em_closed_form", "readout": "readout",
               "routing": "routing", "all": "all"}


def _default_record() -> RecordConfig:
    # everything on a 200 × 200 crop of the last positions + a 50-block pooled overview
    # float32: U ~ W_Oᵀ(p − e)/N is ~1e-4 at N = 1999, where float16 is subnormal and loses digits
    return RecordConfig(every=50, pool=50, dtype="float32", disk_budget_gb=4.0, batch="train")


@dataclass
class StickyConfig:
    seeds: list[Seed] = field(default_factory=lambda: [42, 2024, 1337, 7777, 9999])
    arms: list[str] = field(default_factory=lambda: ["sgd", "em"])
    steps: PosInt = 1000
    T: int = 2000                       # sequence length; N = T − 1 (input, target) pairs
    n_symbols: Annotated[int, Range(2)] = 8
    rho: float = 0.3                    # nominal self-transition
    construction: str = "script"        # "script" (authors' normalisation, ≈0.3498) | "nominal" | "graded"
    rho_range: list[float] = field(default_factory=lambda: [0.05, 0.9])   # "graded": self-transitions
    noise_std: NonNegFloat = 1.0           # observation noise x_t = μ[y_{t−1}] + noise_std·ε (1 = authors)
    embed_seed: Seed = 0                # μ is drawn under this seed, the same for every run
    d_x: PosInt = 20
    d_k: PosInt = 10
    d_v: PosInt = 15
    init_std: float = 0.1
    lr: float = 0.01
    value_lr_mult: float = 10.0         # EM-like: W_V learning rate = lr × this
    kappa: float = 0.1                  # em_closed_form step size (extension)
    ridge: float = 1e-3                 # em_closed_form ridge (extension)
    sweep: list[float] = field(default_factory=list)   # value-LR multipliers to sweep (EM-like arm)
    control_mult: float = 10.0          # readout / routing / all arms: their learning rates × this
    tuned_grid: list[float] = field(default_factory=lambda: [0.01, 0.03, 0.1, 0.3])  # sgd_tuned LRs
    heldout: bool = True                # evaluate on a second sequence of the same chain
    heldout_offset: int = HELDOUT_OFFSET
    heldout_every: int = 10             # held-out metrics every this many steps (and at the end)
    validation_offset: int = VALIDATION_OFFSET   # sgd_tuned picks on generate(seed + this), final weights
    target_fracs: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])  # of SGD's loss drop
    record_arms: list[str] = field(default_factory=lambda: ["sgd", "em"])  # arrays on disk for these
    record_seeds: int = 0               # arrays on disk only for the first this many seeds (0 = all)
    crop: int = 200                     # recorded query/key crop: the last `crop` positions
    RENAMED: ClassVar[dict[str, str]] = {"window": "crop"}   # "window" is the attention's own
    dtype: str = "float32"
    time_limit_min: NonNegFloat = 0.0   # stop (checkpointed) before the first step begun past this wall time (0: none)
    stop_at_step: NonNegInt = 0         # the same stop at a fixed step (0: none); --resume STUDY continues it
    record: RecordConfig = field(default_factory=_default_record)

    def validate(self, prefix: str = "") -> None:
        p = prefix
        if self.T < 2:
            raise ConfigError(p + "T", f"must be >= 2 (one (input, target) pair needs 2 symbols), got {self.T}")
        if not self.seeds:
            raise ConfigError(p + "seeds", "needs at least one seed")
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ConfigError(p + "arms", f"unknown arm(s) {bad} (known: {', '.join(ARMS)})")
        if self.steps < 1:
            raise ConfigError(p + "steps", f"must be >= 1, got {self.steps}")
        if not 0 <= self.rho <= 1:
            raise ConfigError(p + "rho", f"a self-transition probability in [0, 1], got {self.rho}")
        if self.heldout_offset < 1:
            raise ConfigError(p + "heldout_offset", f"must be >= 1 (the held-out chain is seed + offset), "
                                                    f"got {self.heldout_offset}")
        bad = [a for a in self.record_arms if a not in ARMS]
        if bad:
            raise ConfigError(p + "record_arms", f"unknown arm(s) {bad} (known: {', '.join(ARMS)})")
        if self.construction not in ("script", "nominal", "graded"):
            raise ConfigError(p + "construction", "must be 'script', 'nominal' or 'graded'")
        if len(self.rho_range) != 2 or not all(0 <= r < 1 for r in self.rho_range):
            raise ConfigError(p + "rho_range", "two self-transition probabilities in [0, 1)")
        if "sgd_tuned" in self.arms and (not self.tuned_grid or any(not g > 0 for g in self.tuned_grid)):
            raise ConfigError(p + "tuned_grid", "sgd_tuned needs a non-empty grid of learning rates > 0")
        if "sgd_tuned" in self.arms and not self.heldout:
            raise ConfigError(p + "heldout", "sgd_tuned picks its learning rate on held-out loss; keep heldout on")
        if not self.target_fracs or any(not 0 < f <= 1 for f in self.target_fracs):
            raise ConfigError(p + "target_fracs", "fractions of SGD's loss drop in (0, 1]")
        if self.record_seeds < 0:
            raise ConfigError(p + "record_seeds", f"must be >= 0 (0 = all seeds), got {self.record_seeds}")
        if self.validation_offset in (0, self.heldout_offset):
            raise ConfigError(p + "validation_offset", "must differ from 0 and from heldout_offset")
        if self.heldout_every < 1:
            raise ConfigError(p + "heldout_every", f"must be >= 1, got {self.heldout_every}")
        for key in ("lr", "value_lr_mult", "init_std", "noise_std", "control_mult"):
            if not getattr(self, key) > 0:
                raise ConfigError(p + key, f"must be > 0, got {getattr(self, key)}")
        if any(not m > 0 for m in self.sweep):
            raise ConfigError(p + "sweep", "multipliers must be > 0")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(p + "dtype", "float32 or float64")
        if self.crop < 1:
            raise ConfigError(p + "crop", "must be >= 1")

    def check_memory(self) -> None:
        """Refuse, before anything is allocated or created, a chain too big for this machine: the
        Bayes filter holds (N, n, d_x) squared distances and a few (n, n) float64 matrices."""
        n, N = self.n_symbols, self.T - 1
        why = memory_problem(8 * (N * n * self.d_x + 4 * n * n), "the chain and its Bayes filter")
        if why:
            raise ConfigError("n_symbols", f"{why} (n_symbols {n}, T {self.T}, d_x {self.d_x}); "
                                           "lower n_symbols or T")


@dataclass
class Arm:
    name: str          # run-directory suffix: sgd, em, routing, em-x5, lr0.03
    arm: str           # sgd | em | em_closed_form | readout | routing | all | sgd_grid
    lrs: tuple         # (lr_q, lr_k, lr_v, lr_o)
    mult: float = 1.0


def expand_arms(cfg: StickyConfig) -> tuple[list[Arm], dict[float, str]]:
    """The trained runs per seed, and for sgd_tuned: grid LR -> the run name that trains it.

    A grid point whose uniform LRs equal another run's (0.01 = ``sgd``, 0.1 = ``all`` with the
    defaults) reuses that run instead of training it twice.
    """
    out = []
    for a in cfg.arms:
        if a == "sgd_tuned":
            continue
        mult = {"sgd": 1.0, "em": cfg.value_lr_mult, "em_closed_form": cfg.value_lr_mult}.get(a, cfg.control_mult)
        out.append(Arm(a, a, engine.arm_lrs(_ENGINE_ARM[a], cfg.lr, mult), mult))
    out += [Arm(f"em-x{m:g}", "em", engine.arm_lrs("em_like", cfg.lr, m), m) for m in cfg.sweep]
    grid = {}
    if "sgd_tuned" in cfg.arms:
        for g in cfg.tuned_grid:
            same = next((a for a in out if a.arm != "em_closed_form" and a.lrs == (g,) * 4), None)
            if same is None:
                same = Arm(f"lr{g:g}", "sgd_grid", (g,) * 4)
                out.append(same)
            grid[g] = same.name
    return out, grid
