"""Multi-run studies: ``dyntool study span`` and ``dyntool study ls-logits``.

A study writes ``<out>/<study>-<date>-<rand>/`` holding its runs (ordinary run directories, so
``dyntool ls``/the app see them) plus ``summary.json``, and prints a table.

- ``span`` (:mod:`.span_study`): baseline (``mhsa``) vs readings of the span-recon backward
  (``--arms``) for seeds 0..N-1; every arm of a seed shares the initialisation and data order (the
  span forward is bitwise the mhsa forward).  Reported: final validation loss per run and the
  relative change ``100·(L_arm − L_base)/L_base`` per seed, mean ± std (sample std) over seeds, the
  clip factor and per-head max |logit|.  The paper reports −0.56 % (setting unknown; our span is a
  reconstruction, and no arm is known to be the paper's reading).
- ``ls-logits``: ``mhsa`` vs ``ls`` vs ``qknorm`` at a longer context and a high learning rate
  (LS paper's stability figure): per layer, max|logit| (``logit_max/L{l}``, every step) at the
  first step, the last step and its peak, growth = last/first, and whether the run diverged.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config import PosInt, Seed, merge, nest, parse_overrides
from ..errors import ConfigError
from ..stats import mean_std
from . import runner
from .atlas import study_atlas            # the attention atlas: its presets, probe, events
from .ls_logits import study_ls_logits    # the LS logit study: its presets, arms, per-head table
from .span_study import run_span_study    # the span study: its arms (readings of the paper), clip and logits
from .study_runs import continue_study

# no 60 MB checkpoint per study run unless asked (--train.checkpoint=true): studies don't resume
STUDY_DEFAULTS = {"train.checkpoint": False}


@dataclass
class StudyConfig:
    """What every study takes from the command line (``--seeds``, ``--n-seeds``, ``--max-steps``, ``--arms``)."""
    seeds: list[Seed] = field(default_factory=lambda: [0, 1, 2])
    max_steps: Optional[PosInt] = None      # train.max_steps of every run (None: the preset's)
    arms: Optional[list[str]] = None        # a subset of the study's arms, in its order (None: all)

    def validate(self, prefix: str = "") -> None:
        if not self.seeds:
            raise ConfigError(prefix + "seeds", "needs at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(prefix + "seeds", f"repeats a seed: {self.seeds}")
        if self.arms is not None and (not self.arms or len(set(self.arms)) != len(self.arms)):
            raise ConfigError(prefix + "arms", f"needs distinct arms, got {self.arms}")

    def pick(self, arms: dict) -> dict:
        """The study's ``arms`` ({name: anything}) that ``--arms`` keeps, in the study's order."""
        if self.arms is None:
            return arms
        unknown = [a for a in self.arms if a not in arms]
        if unknown:
            raise ConfigError("arms", f"{', '.join(unknown)} is not an arm of this study (its arms: {', '.join(arms)})")
        return {a: v for a, v in arms.items() if a in self.arms}


def _configs(files: dict[str, str], arm_values: dict[str, dict], study: StudyConfig, preset, overrides,
             base_values: dict | None = None) -> dict[tuple[str, int], object]:
    """Every run's config, loaded once and validated before the study creates anything.

    Priority: packaged file ← preset ← the study's defaults (``base_values``) ← the user's
    ``--section.key=value`` ← the arm ← ``--seed``/``--max-steps``."""
    user = parse_overrides(overrides)
    cfgs = {}
    for seed in study.seeds:
        for arm, f in files.items():
            fixed = {"seed": seed, **({"train.max_steps": study.max_steps} if study.max_steps else {})}
            values = merge(merge(merge(nest({**STUDY_DEFAULTS, **(base_values or {})}), user),
                                 nest(arm_values.get(arm, {}))),
                           nest(fixed))
            cfgs[arm, seed] = runner.load_config(f, preset, [], values=values)
    return cfgs


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return float("nan"), float("nan")
    return mean_std(xs)


def study_span(out, study: StudyConfig, preset, overrides, quiet, name=None, tags=()) -> dict:
    return run_span_study(out, study, preset, overrides, quiet, name, tags, _configs, _mean_std)


def run_study(which: str, out: str, study: StudyConfig | None = None, preset: str | None = "small",
              overrides: list[str] | None = None, quiet: bool = False, name: str | None = None,
              tags: list[str] | None = None) -> Path:
    fn = {"span": study_span, "ls-logits": study_ls_logits, "atlas": study_atlas}[which]
    study = study or StudyConfig()
    try:
        summary = fn(out, study, preset, overrides or [], quiet, name, tuple(tags or ()))
    except KeyboardInterrupt as e:
        e.next_step = continue_study(e, which, study.seeds, study.max_steps, preset, overrides or [], out,
                                     study.arms)
        raise
    path = Path(summary["dir"]) / "summary.json"
    path.write_text(json.dumps(summary, indent=2, default=str))
    print(f"summary: {path}")
    return path
