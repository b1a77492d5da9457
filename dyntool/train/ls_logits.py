"""``dyntool study ls-logits``: max|logit| per head for MHSA vs LS vs QK-norm in the LS paper's regime.

The LS paper (arXiv 2505.15548) argues that when the context n is much longer than the head dim d,
a head cannot represent the dense local dependencies with a rank-d logit matrix, so training grows
the logits; LS-attention gives those dependencies to sliding-window heads.  The regime that matters
is n/d: 2048/32 = 64 in the paper.  ``sims/ls_logits.toml`` holds the paper-like configuration
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

import datetime as _dt
import re
import secrets
from pathlib import Path

from ..errors import ConfigError, NonFiniteLossError

CONFIG = "ls_logits.toml"


def config_file() -> Path:
    """``ls_logits.toml``: packaged (``dyntool/presets/``) if present, else the checkout's ``sims/``."""
    pkg = Path(__file__).resolve().parents[1]
    for p in (pkg / "presets" / CONFIG, pkg.parent / "sims" / CONFIG):
        if p.is_file():
            return p
    raise ConfigError("study", f"needs {CONFIG} (in dyntool/presets/ or a checkout's sims/)")
GPU_SWEEP = ("gpu512", "gpu1024", "gpu2048")
ARMS_GPU = {"mhsa": ["--model.attention=mhsa"],
            "mhsa-eager-fp32": ["--model.attention=mhsa", "--model.backend=manual", "--train.dtype=float32"],
            "ls": ["--model.attention=ls"],
            "qknorm": ["--model.attention=qknorm"]}
ARMS_CPU = {k: v for k, v in ARMS_GPU.items() if k != "mhsa-eager-fp32"}
_HEAD = re.compile(r"^logit_max/L(\d+)H(\d+)$")


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
    for col in metrics.columns:
        m = _HEAD.match(col)
        if not m:
            continue
        s = metrics[col].dropna()
        if not len(s):
            continue
        l, h = int(m.group(1)), int(m.group(2))
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
            "steps": int(df["step"].max()) + 1 if len(df) else 0,
            "head_dim": m.get("n_embd", 0) // max(m.get("n_head", 1), 1),
            "n_local": m.get("n_local") if is_ls else 0, "window": m.get("window") if is_ls else None,
            "last_val_loss": float(val.iloc[-1]) if len(val) else None,
            "heads": heads, "layers": layer_table(heads),
            "model_peak": max((h["peak"] for h in heads), default=None)}


def runner():
    """``(load_config, run_training)``: in dyntool.train.runner, or dyntool.train.cli before that split."""
    try:
        from .runner import load_config, run_training
    except ImportError:
        from .cli import load_config, run_training
    return load_config, run_training


def _train(study_dir: Path, name: str, preset: str, overrides: list[str], quiet: bool, tags=()):
    from ..run import open_run
    load_config, run_training = runner()
    cfg = load_config(str(config_file()), preset, overrides)
    if not quiet:
        print(f"[study-ls-logits] {name}", flush=True)
    try:
        run_training(cfg, str(study_dir), name=name, tags=["study-ls-logits", *tags], quiet=quiet)
    except NonFiniteLossError:
        pass                                          # the run is marked failed; the study goes on
    return open_run(study_dir / name), cfg.data.block_size


def print_summary(summary: dict) -> None:
    print(f"\nstudy ls-logits ({summary['dir']}): max|logit| = max |τ q·k| over allowed pairs, "
          f"per head: first → last (peak @ step)")
    for rid, r in summary["runs"].items():
        print(f"{rid:<26} {r['status']:<9} T={r['T']} d_h={r['head_dim']} steps={r['steps']} "
              f"val_loss={r['last_val_loss'] if r['last_val_loss'] is None else round(r['last_val_loss'], 3)}")
        for h in r["heads"]:
            print(f"    L{h['layer']}H{h['head']} {h['type']:<6} {h['first']:8.2f} → {h['last']:8.2f} "
                  f"(peak {h['peak']:8.2f} @ {h['peak_step']})")


def study_ls_logits(out, seeds, max_steps, preset, overrides, quiet, name=None, tags=()) -> dict:
    """``seeds``: a count (seeds 0..N-1) or a list of seeds."""
    presets, arms = presets_for(preset)
    seeds = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    d = Path(out) / (name or f"ls-logits-{stamp}-{secrets.token_hex(2)}")
    d.mkdir(parents=True)
    extra = list(overrides) + ([f"--train.max_steps={max_steps}"] if max_steps else [])
    runs = {}
    for p in presets:
        for seed in seeds:
            for arm, o in arms.items():
                run, T = _train(d, f"{arm}-{p}-s{seed}", p, extra + o + [f"--seed={seed}"], quiet, tags)
                runs[run.id] = summarise_run(run, arm, T, seed)
    summary = {"study": "ls-logits", "dir": str(d), "preset": preset, "presets": presets,
               "arms": list(arms), "overrides": extra, "runs": runs}
    print_summary(summary)
    return summary
