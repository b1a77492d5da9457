"""``dyntool study ls-logits``: max|logit| per head for MHSA vs LS vs QK-norm in the LS paper's configuration
(its regime only at the ``gpu`` preset; ``cpu`` keeps n/d = 64 at a small model).

The LS paper (arXiv 2505.15548) argues that when the context n is much longer than the head dim d,
a head cannot represent the dense local dependencies with a rank-d logit matrix, so training grows
the logits; LS-attention gives those dependencies to sliding-window heads.  The regime that matters
is n/d: 2048/32 = 64 in the paper.  The packaged preset file ``ls_logits.toml`` holds the paper-like configuration
(head dim 32, 5 local + 1 global heads, window 50, AdamW 6e-4, bf16) and its presets:

- ``gpu`` = the sweep ``gpu512``, ``gpu1024``, ``gpu2048`` (T ∈ {512, 1024, 2048}, 32,768 tokens per
  step each); arms ``mhsa`` (SDPA, bf16: the flash kernel), ``mhsa-eager-fp32`` (materialised
  attention, float32: the paper's probable second baseline), ``ls`` (flex, bf16), ``qknorm`` (bf16);
- ``cpu`` (alias ``small``): T = 512 with head dim 8, so n/d = 64 as in the paper, in a 2-layer model
  small enough for ~15 minutes on 2 CPU cores; arms mhsa, ls, qknorm (every arm is float32 on CPU,
  so a separate eager-fp32 MHSA arm would differ from ``mhsa`` only by the SDPA math kernel).

Reported per run and per (layer, head): max|logit| = max over allowed (i, j) of |τ q_i·k_j| on the
step's training batch (``logit_max/L{l}H{h}``, every step), at the first step, its peak and the
last step, growth = last/first, and the head's type (``local``: heads < n_local of an LS model, else
``global``: causal).  Per layer the local and global maxima are listed separately.
"""
from __future__ import annotations

from ..config import merge, nest, parse_overrides
from ..errors import ConfigError
from ..steps import steps_taken
from ..record import metric_names as mn
from .study_runs import new_study_dir, train_arm

CONFIG = "ls_logits.toml"          # packaged preset file (dyntool/presets/)
GPU_SWEEP = ("gpu512", "gpu1024", "gpu2048")
ARMS_GPU = {"mhsa": {"model.attention": "mhsa"},
            "mhsa-eager-fp32": {"model.attention": "mhsa", "model.backend": "manual", "train.dtype": "float32"},
            "ls": {"model.attention": "ls"},
            "qknorm": {"model.attention": "qknorm"}}
ARMS_CPU = {k: v for k, v in ARMS_GPU.items() if k != "mhsa-eager-fp32"}


def presets_for(preset: str | None) -> tuple[list[str], dict]:
    """The TOML presets a study ``--preset`` runs, and its arms."""
    if preset in (None, "cpu", "small"):
        return ["cpu"], ARMS_CPU
    if preset == "gpu":
        return list(GPU_SWEEP), ARMS_GPU
    if preset in GPU_SWEEP:
        return [preset], ARMS_GPU
    raise ConfigError("--preset", f"ls-logits presets: cpu (small), gpu (= {', '.join(GPU_SWEEP)}), or one "
                                  f"of those; got {preset!r}")


def head_table(metrics, n_local: int, is_ls: bool) -> list[dict]:
    """Per (layer, head): first / peak / last max|logit| and the head's type, from a metrics frame."""
    rows = []
    for (l, h), col in mn.per_head(metrics.columns, mn.LOGIT_MAX).items():
        s = metrics[col].dropna()
        if not len(s):
            continue
        first, last, peak = float(s.iloc[0]), float(s.iloc[-1]), float(s.max())
        rows.append({"layer": l, "head": h, "type": "local" if is_ls and h < n_local else "global",
                     "first": first, "peak": peak, "last": last,
                     "peak_step": int(metrics.loc[s.idxmax(), "step"]),
                     "growth": last / first if first else None})
    return sorted(rows, key=lambda r: (r["layer"], r["head"]))


def layer_table(heads: list[dict]) -> list[dict]:
    """Per layer: the peak (over steps) of the local-head and of the global-head max|logit|."""
    out: dict[int, dict] = {}
    for r in heads:
        d = out.setdefault(r["layer"], {"layer": r["layer"], "local_peak": None, "global_peak": None})
        k = f"{r['type']}_peak"
        d[k] = r["peak"] if d[k] is None else max(d[k], r["peak"])
    return [out[l] for l in sorted(out)]


def summarise_run(run, arm: str, T: int, seed: int) -> dict:
    cfg = run.config
    m = cfg.get("model", {})
    is_ls = m.get("attention") == "ls"
    df = run.metrics
    heads = head_table(df, int(m.get("n_local", 0)), is_ls)
    val = df["val_loss"].dropna() if "val_loss" in df else []
    return {"arm": arm, "T": T, "seed": seed, "status": run.status, "diverged": run.status == "failed",
            "steps": steps_taken(run.meta, df),
            "head_dim": m.get("n_embd", 0) // max(m.get("n_head", 1), 1),
            "n_local": m.get("n_local") if is_ls else 0, "window": m.get("window") if is_ls else None,
            "last_val_loss": float(val.iloc[-1]) if len(val) else None,
            "heads": heads, "layers": layer_table(heads),
            "model_peak": max((h["peak"] for h in heads), default=None)}


def print_summary(summary: dict) -> None:
    print(f"\nstudy ls-logits ({summary['dir']}): max|logit| = max |τ q·k| over allowed pairs, "
          f"per head: first → last (peak @ step)")
    for rid, r in summary["runs"].items():
        print(f"{rid:<26} {r['status']:<9} T={r['T']} d_h={r['head_dim']} steps={r['steps']} "
              f"val_loss={'-' if r['last_val_loss'] is None else round(r['last_val_loss'], 3)}")
        for h in r["heads"]:
            print(f"    L{h['layer']}H{h['head']} {h['type']:<6} {h['first']:8.2f} → {h['last']:8.2f} "
                  f"(peak {h['peak']:8.2f} @ {h['peak_step']})")


def configs(study, preset, overrides) -> dict:
    """Every (T preset, seed, arm) run's config, loaded and validated before anything is made.

    Priority: ``ls_logits.toml`` ← its preset ← the user's ``--section.key=value`` ← the arm ←
    ``--seeds``/``--max-steps``."""
    from .runner import load_config  # deferred: keeps torch off `dyntool info STUDY` (its table, print_summary)
    presets, arms = presets_for(preset)
    arms = study.pick(arms)
    user = parse_overrides(overrides)
    fixed = {"train.max_steps": study.max_steps} if study.max_steps else {}
    return {(p, seed, arm): load_config(CONFIG, p, [], values=merge(merge(user, nest(vals)),
                                                                    nest({"seed": seed, **fixed})))
            for p in presets for seed in study.seeds for arm, vals in arms.items()}


def study_ls_logits(out, study, preset, overrides, quiet, name=None, tags=()) -> dict:
    cfgs = configs(study, preset, overrides)
    presets = list(dict.fromkeys(p for p, _, _ in cfgs))
    arms = list(dict.fromkeys(a for _, _, a in cfgs))          # those --arms kept, in the study's order
    d = new_study_dir(out, "ls-logits", name)
    runs = {}
    for (p, seed, arm), cfg in cfgs.items():
        run = train_arm(d, f"{arm}-{p}-s{seed}", cfg, quiet, ["study-ls-logits", *tags])
        runs[run.id] = summarise_run(run, arm, cfg.data.block_size, seed)
    summary = {"study": "ls-logits", "dir": str(d), "preset": preset, "presets": presets,
               "arms": arms, "overrides": list(overrides), "max_steps": study.max_steps, "runs": runs}
    print_summary(summary)
    return summary
