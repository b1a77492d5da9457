"""Multi-run studies: ``dyntool study span`` and ``dyntool study ls-logits``.

A study writes ``<out>/<study>-<date>-<rand>/`` holding its runs (ordinary run directories, so
``dyntool ls``/the app see them) plus ``summary.json``, and prints a table.

- ``span``: baseline (``mhsa``) vs the span-recon backward (``wikitext_span.toml``'s [span]
  section) for seeds 0..N-1; both arms of a seed share the initialisation and data order (the
  span forward is bitwise the mhsa forward).  Reported: final validation loss per run and the
  relative change ``100·(L_span − L_base)/L_base`` per seed, mean ± std (sample std) over seeds.
  The paper reports −0.56 % (setting unknown; our span is a reconstruction).
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

from ..config import PosInt, Seed, merge, nest
from ..stats import mean_std
from .atlas import study_atlas            # the attention atlas: its presets, probe, events
from .ls_logits import study_ls_logits    # the LS logit study: its presets, arms, per-head table
from .study_runs import new_study_dir, train_arm

# no 60 MB checkpoint per study run unless asked (--train.checkpoint=true): studies don't resume
STUDY_DEFAULTS = {"train.checkpoint": False}


@dataclass
class StudyConfig:
    """What every study takes from the command line (``--seeds``, ``--n-seeds``, ``--max-steps``, ``--arms``)."""
    seeds: list[Seed] = field(default_factory=lambda: [0, 1, 2])
    max_steps: Optional[PosInt] = None      # train.max_steps of every run (None: the preset's)
    arms: Optional[list[str]] = None        # a subset of the study's arms, in its order (None: all)

    def validate(self, prefix: str = "") -> None:
        from ..errors import ConfigError
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
            from ..errors import ConfigError
            raise ConfigError("arms", f"{', '.join(unknown)} is not an arm of this study (its arms: {', '.join(arms)})")
        return {a: v for a, v in arms.items() if a in self.arms}


def _configs(files: dict[str, str], arm_values: dict[str, dict], study: StudyConfig, preset, overrides,
             base_values: dict | None = None) -> dict[tuple[str, int], object]:
    """Every run's config, loaded once and validated before the study creates anything.

    Priority: packaged file ← preset ← the study's defaults (``base_values``) ← the user's
    ``--section.key=value`` ← the arm ← ``--seed``/``--max-steps``."""
    from ..config import parse_overrides
    from .runner import load_config
    user = parse_overrides(overrides)
    cfgs = {}
    for seed in study.seeds:
        for arm, f in files.items():
            fixed = {"seed": seed, **({"train.max_steps": study.max_steps} if study.max_steps else {})}
            values = merge(merge(merge(nest({**STUDY_DEFAULTS, **(base_values or {})}), user),
                                 nest(arm_values.get(arm, {}))),
                           nest(fixed))
            cfgs[arm, seed] = load_config(f, preset, [], values=values)
    return cfgs


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return float("nan"), float("nan")
    return mean_std(xs)


def study_span(out, study: StudyConfig, preset, overrides, quiet, name=None, tags=()) -> dict:
    if study.arms is not None:
        from ..errors import ConfigError
        raise ConfigError("arms", "the span study's Δ needs both of its arms (baseline, span); --arms is for ls-logits")
    arms = {"baseline": "wikitext_span.toml", "span": "wikitext_span.toml"}
    cfgs = _configs(arms, {"baseline": {"model.attention": "mhsa"}}, study, preset, overrides)
    d = new_study_dir(out, "span", name)
    rows = []
    for seed in study.seeds:
        res = {"seed": seed}
        for arm in arms:
            r = train_arm(d, f"{arm}-s{seed}", cfgs[arm, seed], quiet, ["study-span", *tags])
            final = r.meta.get("final", {})
            vals = r.metrics["val_loss"].dropna() if "val_loss" in r.metrics else []
            last = float(vals.iloc[-1]) if len(vals) else None     # when final_eval is off
            res[arm] = {"run": r.id, "status": r.status, "final_val_loss": final.get("valid_loss", last),
                        "best_val_loss": float(min(vals)) if len(vals) else None,
                        "valid_ppl": final.get("valid_ppl"), "test_ppl": final.get("test_ppl"),
                        "final_eval": final.get("final_eval"), "final_eval_tokens": final.get("final_eval_tokens")}
        b, s = res["baseline"]["final_val_loss"], res["span"]["final_val_loss"]
        res["rel_change_pct"] = 100 * (s - b) / b if b and s else None
        bb, sb = res["baseline"]["best_val_loss"], res["span"]["best_val_loss"]
        res["rel_change_best_pct"] = 100 * (sb - bb) / bb if bb and sb else None
        rows.append(res)
    m, sd = _mean_std([r["rel_change_pct"] for r in rows])
    mb, sdb = _mean_std([r["rel_change_best_pct"] for r in rows])
    import dataclasses
    span_cfg = dataclasses.asdict(cfgs["span", study.seeds[0]].span)
    summary = {"study": "span", "dir": str(d), "preset": preset, "overrides": list(overrides),
               "seeds_requested": list(study.seeds), "max_steps": study.max_steps, "span": span_cfg,
               "seeds": rows, "rel_change_pct_mean": m, "rel_change_pct_std": sd,
               "rel_change_best_pct_mean": mb, "rel_change_best_pct_std": sdb, "paper_rel_change_pct": -0.56}
    print(f"\nstudy span ({d})  span-recon {span_cfg['candidate']} "
          f"αq={span_cfg['alpha_q']} βq={span_cfg['beta_q']} αk={span_cfg['alpha_k']} βk={span_cfg['beta_k']}")
    print(f"{'seed':>4}  {'baseline val':>12}  {'span val':>10}  {'Δ% final':>9}  {'Δ% best':>8}")
    for r in rows:
        f = lambda x, w, p=4: f"{x:{w}.{p}f}" if x is not None else " " * (w - 1) + "-"   # noqa: E731
        print(f"{r['seed']:>4}  {f(r['baseline']['final_val_loss'], 12)}  {f(r['span']['final_val_loss'], 10)}  "
              f"{f(r['rel_change_pct'], 9, 3)}  {f(r['rel_change_best_pct'], 8, 3)}")
    pct = lambda x, e: f"{x:+.3f} ± {e:.3f} %" if math.isfinite(x) else "-"     # noqa: E731  (NaN: no seed has it)
    if all(r[a]["final_val_loss"] is None for r in rows for a in arms):   # e.g. final_eval=off, eval_every=0
        print("relative validation-loss change: - (no run evaluated on the validation split; "
              "train.final_eval or train.eval_every turns it on); paper: -0.56 %")
    else:
        print(f"relative validation-loss change: {pct(m, sd)} (final), {pct(mb, sdb)} (best); paper: -0.56 %")
    bounded = [r[a]["final_eval_tokens"]["valid"] for r in rows for a in arms if r[a]["final_eval"] == "bounded"]
    if bounded:                        # short runs: say that "final" is an estimate on part of the split
        print(f"final = bounded final evaluation (first {max(bounded):,} validation tokens; these runs trained "
              f"on fewer tokens than the splits hold); --train.final_eval=full reads the whole splits")
    return summary


def run_study(which: str, out: str, study: StudyConfig | None = None, preset: str | None = "small",
              overrides: list[str] | None = None, quiet: bool = False, name: str | None = None,
              tags: list[str] | None = None) -> Path:
    fn = {"span": study_span, "ls-logits": study_ls_logits, "atlas": study_atlas}[which]
    study = study or StudyConfig()
    try:
        summary = fn(out, study, preset, overrides or [], quiet, name, tuple(tags or ()))
    except KeyboardInterrupt as e:
        from .study_runs import continue_study
        e.next_step = continue_study(e, which, study.seeds, study.max_steps, preset, overrides or [], out,
                                     study.arms)
        raise
    path = Path(summary["dir"]) / "summary.json"
    path.write_text(json.dumps(summary, indent=2, default=str))
    print(f"summary: {path}")
    return path
