"""Multi-run studies: ``dyntool study span`` and ``dyntool study ls-logits``.

A study writes ``<out>/<study>-<date>-<rand>/`` holding its runs (ordinary run directories, so
``dyntool ls``/the app see them) plus ``summary.json``, and prints a table.

- ``span``: baseline (``mhsa``) vs the span-recon backward (``sims/wikitext_span.toml``'s [span]
  section) for seeds 0..N-1; both arms of a seed share the initialisation and data order (the
  span forward is bitwise the mhsa forward).  Reported: final validation loss per run and the
  relative change ``100·(L_span − L_base)/L_base`` per seed, mean ± std (sample std) over seeds.
  The paper reports −0.56 % (setting unknown; our span is a reconstruction).
- ``ls-logits``: ``mhsa`` vs ``ls`` vs ``qknorm`` (and MHSA eager fp32 on GPU) in the LS paper's
  regime, max|logit| per head with local/global marked: see :mod:`dyntool.train.ls_logits`.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import secrets
import statistics
from pathlib import Path

from ..errors import NonFiniteLossError

SIMS = Path(__file__).resolve().parents[2] / "sims"


def _sims_file(name: str) -> Path:
    p = SIMS / name
    if not p.is_file():                               # installed without the repo's sims/
        from ..errors import ConfigError
        raise ConfigError("study", f"needs {p} (run from a dyntool checkout)")
    return p


def _train(study_dir: Path, name: str, config: Path, preset, overrides, quiet, tag):
    from ..run import open_run
    from .cli import load_config, run_training
    cfg = load_config(str(config), preset, overrides)
    if not quiet:
        print(f"[{tag}] {name}", flush=True)
    try:
        run_training(cfg, str(study_dir), name=name, tags=[tag], quiet=quiet)
    except NonFiniteLossError:
        pass                                          # the run is marked failed; the study goes on
    return open_run(study_dir / name)


def _study_dir(out: str, which: str) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    d = Path(out) / f"{which}-{stamp}-{secrets.token_hex(2)}"
    d.mkdir(parents=True)
    return d


def _mean_std(xs: list[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def study_span(out, seeds, max_steps, preset, overrides, quiet) -> dict:
    d = _study_dir(out, "span")
    cfg_file = _sims_file("wikitext_span.toml")
    extra = list(overrides) + ([f"--train.max_steps={max_steps}"] if max_steps else [])
    arms = {"baseline": ["--model.attention=mhsa"], "span": []}
    rows = []
    for seed in range(seeds):
        res = {"seed": seed}
        for arm, o in arms.items():
            r = _train(d, f"{arm}-s{seed}", cfg_file, preset, extra + o + [f"--seed={seed}"], quiet, "study-span")
            final = r.meta.get("final", {})
            vals = r.metrics["val_loss"].dropna() if "val_loss" in r.metrics else []
            last = float(vals.iloc[-1]) if len(vals) else None     # when final_eval is off
            res[arm] = {"run": r.id, "status": r.status, "final_val_loss": final.get("valid_loss", last),
                        "best_val_loss": float(min(vals)) if len(vals) else None,
                        "valid_ppl": final.get("valid_ppl"), "test_ppl": final.get("test_ppl")}
        b, s = res["baseline"]["final_val_loss"], res["span"]["final_val_loss"]
        res["rel_change_pct"] = 100 * (s - b) / b if b and s else None
        bb, sb = res["baseline"]["best_val_loss"], res["span"]["best_val_loss"]
        res["rel_change_best_pct"] = 100 * (sb - bb) / bb if bb and sb else None
        rows.append(res)
    m, sd = _mean_std([r["rel_change_pct"] for r in rows])
    mb, sdb = _mean_std([r["rel_change_best_pct"] for r in rows])
    import dataclasses
    from .cli import load_config
    span_cfg = dataclasses.asdict(load_config(str(cfg_file), preset, extra).span)
    summary = {"study": "span", "dir": str(d), "preset": preset, "overrides": extra, "span": span_cfg,
               "seeds": rows, "rel_change_pct_mean": m, "rel_change_pct_std": sd,
               "rel_change_best_pct_mean": mb, "rel_change_best_pct_std": sdb, "paper_rel_change_pct": -0.56}
    print(f"\nstudy span ({d})  span-recon {span_cfg['candidate']} "
          f"αq={span_cfg['alpha_q']} βq={span_cfg['beta_q']} αk={span_cfg['alpha_k']} βk={span_cfg['beta_k']}")
    print(f"{'seed':>4}  {'baseline val':>12}  {'span val':>10}  {'Δ% final':>9}  {'Δ% best':>8}")
    for r in rows:
        f = lambda x, w, p=4: f"{x:{w}.{p}f}" if x is not None else " " * (w - 1) + "-"   # noqa: E731
        print(f"{r['seed']:>4}  {f(r['baseline']['final_val_loss'], 12)}  {f(r['span']['final_val_loss'], 10)}  "
              f"{f(r['rel_change_pct'], 9, 3)}  {f(r['rel_change_best_pct'], 8, 3)}")
    print(f"relative validation-loss change: {m:+.3f} ± {sd:.3f} % (final), {mb:+.3f} ± {sdb:.3f} % (best); "
          f"paper: -0.56 %")
    return summary


def study_ls_logits(out, seeds, max_steps, preset, overrides, quiet) -> dict:
    """The LS logit study lives in :mod:`dyntool.train.ls_logits` (its presets, arms, per-head table)."""
    from .ls_logits import study_ls_logits as run
    return run(out, seeds, max_steps, preset, overrides, quiet)


def run_study(which: str, out: str, seeds: int = 3, max_steps: int | None = None,
              preset: str | None = "small", overrides: list[str] | None = None, quiet: bool = False) -> Path:
    fn = {"span": study_span, "ls-logits": study_ls_logits}[which]
    summary = fn(out, seeds, max_steps, preset, overrides or [], quiet)
    path = Path(summary["dir"]) / "summary.json"
    path.write_text(json.dumps(summary, indent=2, default=str))
    print(f"summary: {path}")
    return path
