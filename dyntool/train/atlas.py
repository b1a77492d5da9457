"""``dyntool study atlas``: every head of a WikiText-2 GPT, every step — sinks, previous-token and
induction heads, logit growth — with the gradient terms that drive each (docs/atlas.md).

Arms ``mhsa`` and ``qknorm`` (QK-norm: what it changes in logit growth and sinks) for each seed;
both arms of a seed share the initialisation seed and data order.  Each run records the cheap
tier every step (max|logit|, entropy, ‖∂L/∂S‖, ...), the full tier on a log-spaced schedule, and
the atlas probe (:mod:`.atlas_probe`) every ``atlas.every`` steps.  Presets of ``atlas.toml``:
``ci`` (the tests), ``cpu`` (alias ``small``, 2 cores), ``cpu_small`` (the cpu shape at B = 8 and
lr 8e-3, stopped at step 1400: one head crosses the sink rule, transiently; docs/results.md),
``cpu_long`` (T = 128, lr 4e-3, 8000 steps: chosen after ``cpu_small``), ``gpu``.  ``--atlas.KEY=VALUE`` sets the
probe (:class:`.atlas_probe.AtlasSettings`); every other ``--section.key=value`` goes to the runs.

``summary.json`` holds per run the chance levels, the per-head start/peak/last of every score, and
the events of :mod:`.atlas_events` (rules fixed before the runs); the table printed says, per
phenomenon, how many heads crossed, when, and the backward-before-forward lag against its null.
"""
from __future__ import annotations

import dataclasses

from ..config import merge, nest, parse_overrides
from ..errors import ConfigError
from ..record import metric_names as mn
from ..steps import steps_taken
from . import atlas_events as E
from .atlas_probe import HEAD_BASES, AtlasProbe, AtlasSettings
from .runner import load_config
from .study_runs import new_study_dir, train_arm

CONFIG = "atlas.toml"
PRESETS = {None: "cpu", "ci": "ci", "small": "cpu", "cpu": "cpu", "cpu_small": "cpu_small",
           "cpu_long": "cpu_long", "gpu": "gpu"}      # name -> table of atlas.toml (None: no --preset)
ARMS = {"mhsa": {"model.attention": "mhsa"}, "qknorm": {"model.attention": "qknorm"}}


def preset_names() -> str:
    """"ci, cpu (small), ...": each table once, in PRESETS' order, with its aliases."""
    tables = dict.fromkeys(PRESETS[k] for k in PRESETS if k is not None)
    alias = {t: [k for k in PRESETS if k not in (None, t) and PRESETS[k] == t] for t in tables}
    return ", ".join(t + (f" ({', '.join(alias[t])})" if alias[t] else "") for t in tables)


def split_overrides(overrides: list[str]) -> tuple[AtlasSettings, list[str]]:
    """``--atlas.KEY=VALUE`` → the probe's settings; the rest is the runs'."""
    mine, rest = [], []
    for o in overrides:
        (mine if o.lstrip("-").startswith("atlas.") else rest).append(o)
    fields = {f.name: f.type for f in dataclasses.fields(AtlasSettings)}
    vals = {}
    for o in mine:
        key, sep, value = o.lstrip("-").removeprefix("atlas.").partition("=")
        if not sep or key not in fields:
            raise ConfigError(f"atlas.{key}", f"not a setting of the atlas probe (its settings: {', '.join(fields)})")
        try:
            vals[key] = (value.lower() in ("1", "true", "yes")) if fields[key] in (bool, "bool") else int(value)
        except ValueError:
            raise ConfigError(f"atlas.{key}", f"needs an integer, got {value!r}") from None
    s = AtlasSettings(**vals)
    s.validate()
    return s, rest


def configs(study, preset, overrides) -> dict:
    """Every (seed, arm) run's config, validated before anything is made: ``atlas.toml`` ← its
    preset ← the user's overrides ← the arm ← ``--seeds``/``--max-steps``."""
    if preset not in PRESETS:
        raise ConfigError("--preset", f"atlas presets: {preset_names()}; got {preset!r}")
    arms = study.pick(ARMS)
    user = parse_overrides(overrides)
    fixed = {"train.max_steps": study.max_steps} if study.max_steps else {}
    return {(seed, arm): load_config(CONFIG, PRESETS[preset], [], values=merge(merge(user, nest(vals)),
                                                                              nest({"seed": seed, **fixed})))
            for seed in study.seeds for arm, vals in arms.items()}


def head_ranges(df, bases=HEAD_BASES + (mn.LOGIT_MAX, mn.ATTN_ENTROPY)) -> dict:
    """Per score and head: its value at the first and last probed step and its peak."""
    out = {}
    for base in bases:
        for (l, h), col in sorted(mn.per_head(df.columns, base).items()):
            s = df[col].dropna()
            if len(s):
                out.setdefault(base, {})[f"L{l}H{h}"] = {"first": float(s.iloc[0]), "last": float(s.iloc[-1]),
                                                         "peak": float(s.max()), "min": float(s.min())}
    return out


def summarise_run(run, arm: str, seed: int) -> dict:
    df = run.metrics
    T = run.config["data"]["block_size"]
    chance = E.chance_levels(T)
    heads = sorted(mn.per_head(df.columns, "atlas_first_mass"))
    scal = {k: [float(df[k].dropna().iloc[0]), float(df[k].dropna().iloc[-1])]
            for k in ("atlas_sink_gu", "atlas_sink_ours", "atlas_icl_gap", "atlas_rep_gap", "atlas_probe_loss")
            if k in df and df[k].notna().any()}
    return {"arm": arm, "seed": seed, "status": run.status, "steps": steps_taken(run.meta, df), "T": T,
            "chance": chance, "first_last": scal, "heads": head_ranges(df),
            "events": E.run_events(df, chance, heads) if heads else None}


def print_summary(summary: dict) -> None:
    print(f"\nstudy atlas ({summary['dir']}): forward events = sustained crossings of "
          f"max(0.3, 3×chance, start+0.1); lag = forward − backward step (> 0: backward first), "
          f"p = P(shuffled-head mean |lag| ≤ observed)")
    for rid, r in summary["runs"].items():
        ev, c = r["events"], r["chance"]
        fl = r["first_last"]
        print(f"{rid:<14} {r['status']:<9} steps={r['steps']} T={r['T']}  chance: first {c['first_mass']:.3f} "
              f"prev {c['prev_token']:.3f} ind {c['induction']:.3f}")
        for k, (a, b) in fl.items():
            print(f"    {k:<18} {a:9.4f} → {b:9.4f}")
        if ev is None:
            continue
        for name in E.PHENOMENA:
            lag = ev[name]["lag"]
            steps = sorted(e["forward_step"] for e in ev[name]["heads"].values() if e["forward_step"] is not None)
            p = "-" if lag["p"] is None else f"{lag['p']:.3f}"
            ml = "-" if lag["mean_lag"] is None else f"{lag['mean_lag']:.1f}"
            ma = "-" if lag["mean_abs_lag"] is None else f"{lag['mean_abs_lag']:.1f}"
            nm = "-" if lag["null_mean_abs"] is None else f"{lag['null_mean_abs']:.1f}"
            print(f"    {name:<11} heads crossing {lag['n_forward']}/{len(ev[name]['heads'])} at {steps or '-'}; "
                  f"lag {ml}, |lag| {ma} vs shuffled-head {nm} (p {p}, n={lag['n_paired']})")
        b, ph = ev["loss_bump"], ev["repeat_phase"]
        fall = "-" if ph["fall"] is None else f"{ph['fall']:.3f} @ {ph['step']} (noise {ph['noise']:.3f})"
        print(f"    loss bump: {'yes' if b['bump'] else 'none'} (largest rise {b['size']:.3f} nats @ {b['step']}, "
              f"noise {b['noise']:.3f}); repeat gap steepest fall {fall}")


def study_atlas(out, study, preset, overrides, quiet, name=None, tags=()) -> dict:
    settings, overrides = split_overrides(list(overrides))
    cfgs = configs(study, preset, overrides)
    d = new_study_dir(out, "atlas", name)
    runs = {}
    for (seed, arm), cfg in cfgs.items():
        run = train_arm(d, f"{arm}-s{seed}", cfg, quiet, ["study-atlas", *tags], callbacks=[AtlasProbe(settings)])
        runs[run.id] = summarise_run(run, arm, seed)
    summary = {"study": "atlas", "dir": str(d), "preset": preset, "arms": list(dict.fromkeys(a for _, a in cfgs)),
               "overrides": list(overrides), "atlas": dataclasses.asdict(settings), "max_steps": study.max_steps,
               "runs": runs}
    print_summary(summary)
    return summary
