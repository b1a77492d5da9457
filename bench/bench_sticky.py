"""Time the batched engine against the per-run autograd reference on the sticky-chain study.

Both run in this process on this machine.  The engine trains the whole study (seeds × 2 arms) for
``--steps``; the reference is timed on ``--ref-steps`` steps per run (all runs, both arms) and its
per-step time is EXTRAPOLATED to ``--steps`` (labelled as such), so the default finishes in a few
minutes.  Also prints the study summary (final losses, EM steps to SGD's mean final loss, paired
t-test) from the engine run.

    python bench/bench_sticky.py [--T 2000] [--steps 1000] [--seeds 5] [--ref-steps 10]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sticky_reference as ref  # noqa: E402

from dyntool.sims.single_head import arm_lrs, init_weights, train  # noqa: E402
from dyntool.sims.sticky_data import generate, transition_matrix  # noqa: E402

SEEDS = [42, 2024, 1337, 7777, 9999]
ARMS = ("sgd", "em_like")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def time_reference(seeds, T, n_steps):
    """Per-run autograd loop, every run for n_steps; returns wall seconds."""
    P = transition_matrix()
    t0, c0 = time.perf_counter(), time.process_time()
    for seed in seeds:
        d = generate(seed, T=T, P=P)
        for arm in ARMS:
            model = ref.init_model(seed)
            (ref.train_sgd if arm == "sgd" else ref.train_em_like)(model, d.x, d.y, n_steps)
    return time.perf_counter() - t0, time.process_time() - c0


def run_engine(seeds, T, n_steps, tile):
    xs, ys, labels = [], [], []
    for seed in seeds:
        d = generate(seed, T=T)
        for arm in ARMS:
            xs.append(d.x), ys.append(d.y), labels.append((seed, arm))
    W = init_weights([s for s, _ in labels])
    t0, c0 = time.perf_counter(), time.process_time()
    res = train(torch.stack(xs), torch.stack(ys), W, [arm_lrs(a) for _, a in labels], n_steps, tile=tile)
    return time.perf_counter() - t0, time.process_time() - c0, res, labels


def study_summary(res, labels, n_steps):
    """Authors' metric: thr = mean SGD final loss; first k with losses_em[k] < thr (else n_steps)."""
    from scipy.stats import ttest_rel
    sgd = [r for r, (_, a) in enumerate(labels) if a == "sgd"]
    em = [r for r, (_, a) in enumerate(labels) if a == "em_like"]
    fs, fe = res.final["loss"][sgd].numpy(), res.final["loss"][em].numpy()
    thr = fs.mean()
    steps = []
    for r in em:
        hit = np.nonzero(res.losses[r].numpy() < thr)[0]
        steps.append(int(hit[0]) if len(hit) else n_steps)
    t = ttest_rel(fe, fs)
    return {
        "seeds": [labels[r][0] for r in sgd], "final_sgd": fs.tolist(), "final_em": fe.tolist(),
        "entropy_sgd": res.final["entropy"][sgd].tolist(), "entropy_em": res.final["entropy"][em].tolist(),
        "acc_sgd": res.final["accuracy"][sgd].tolist(), "acc_em": res.final["accuracy"][em].tolist(),
        "threshold": float(thr), "em_steps": steps, "em_steps_mean": float(np.mean(steps)),
        "em_steps_std": float(np.std(steps)), "t": float(t.statistic), "p": float(t.pvalue),
    }


def hardware() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=1000, help="engine steps (the full study)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--ref-steps", type=int, default=10, help="reference steps per run, extrapolated")
    ap.add_argument("--tile", type=int, default=32)
    ap.add_argument("--ref-threads", type=int, default=None,
                    help="torch threads for the reference (default: torch's default; 1 is fairer on a busy machine)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args(argv)
    seeds = SEEDS[: a.seeds] if a.seeds <= len(SEEDS) else list(range(a.seeds))
    runs = 2 * len(seeds)
    hw = hardware()
    print("hardware:", ", ".join(f"{k}={v}" for k, v in hw.items()))

    default_threads = torch.get_num_threads()
    if a.ref_threads:
        torch.set_num_threads(a.ref_threads)
    time_reference(seeds[:1], a.T, 2)                              # warm-up (allocator, MKL)
    ref_wall, ref_cpu = time_reference(seeds, a.T, a.ref_steps)
    ref_threads = torch.get_num_threads()
    torch.set_num_threads(default_threads)                         # the engine picks its own workers
    ref_step, ref_cpu_step = ref_wall / (runs * a.ref_steps), ref_cpu / (runs * a.ref_steps)
    rss_ref = peak_rss_mb()
    eng_wall, eng_cpu, res, labels = run_engine(seeds, a.T, a.steps, a.tile)
    eng_step, eng_cpu_step = eng_wall / (runs * a.steps), eng_cpu / (runs * a.steps)
    rss_eng = peak_rss_mb()

    print(f"\nT={a.T} (N={a.T - 1}), {len(seeds)} seeds x 2 arms = {runs} runs, study = {a.steps} steps; "
          f"reference torch threads {ref_threads}, engine workers {default_threads}")
    print(f"{'method':<26}{'measured':>16}{'s/run-step':>12}{'CPU s/run-step':>16}{'s/study-step':>14}"
          f"{'study total s':>15}{'peak RSS MB':>13}")
    print(f"{'reference (autograd loop)':<26}{f'{a.ref_steps} steps/run':>16}{ref_step:>12.4f}{ref_cpu_step:>16.4f}"
          f"{ref_step * runs:>14.3f}{ref_step * runs * a.steps:>11.1f} (x){rss_ref:>13.0f}")
    print(f"{'batched engine':<26}{f'{a.steps} steps':>16}{eng_step:>12.4f}{eng_cpu_step:>16.4f}"
          f"{eng_step * runs:>14.3f}{eng_wall:>15.1f}{rss_eng:>13.0f}")
    print(f"ratio engine/reference: wall {eng_step / ref_step:.3f} (speed-up {ref_step / eng_step:.1f}x), "
          f"CPU {eng_cpu_step / ref_cpu_step:.3f}; (x) = extrapolated from the measured per-step time; "
          "peak RSS is process-wide and cumulative; loadavg_1m at end "
          f"{os.getloadavg()[0]:.1f} (other processes on the machine inflate wall times)")

    summary = study_summary(res, labels, a.steps)
    fs, fe = np.array(summary["final_sgd"]), np.array(summary["final_em"])
    print(f"\nfinal loss SGD {fs.mean():.4f} ± {fs.std():.4f}, EM-like {fe.mean():.4f} ± {fe.std():.4f}")
    print(f"EM steps to SGD mean final loss {summary['threshold']:.4f}: {summary['em_steps']} -> "
          f"{summary['em_steps_mean']:.0f} ± {summary['em_steps_std']:.0f}; paired t = {summary['t']:.3f}, "
          f"p = {summary['p']:.4f}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"hardware": hw, "args": vars(a) | {"json": str(a.json)},
                                      "reference_s_per_run_step": ref_step, "engine_s_per_run_step": eng_step,
                                      "reference_cpu_s_per_run_step": ref_cpu_step,
                                      "engine_cpu_s_per_run_step": eng_cpu_step,
                                      "engine_wall_s": eng_wall, "ratio": eng_step / ref_step,
                                      "peak_rss_mb": rss_eng, "study": summary}, indent=2))


if __name__ == "__main__":
    main()
