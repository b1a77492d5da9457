"""The sticky-chain study as users run it (recording ON) vs the authors-style reference loop.

Targets (issue 10): the study WITH CONTROLS (sgd, em, readout, routing, all, sgd_tuned: 6 arms,
7 trained runs per seed with the default grid; 5 seeds, T = 2000, 1000 steps, recording and
held-out evaluation on) takes at most 0.6× the time of a straightforward per-run PyTorch
autograd loop running only the 2 original arms (sgd, em); peak memory under 4 GB.  Both are
timed in this process.  The reference runs ``--ref-steps`` steps of every (seed, arm) run and
is extrapolated linearly to ``--steps`` (labelled); ``--arms sgd,em`` times the 2-arm study.

    python bench/bench_study.py [--T 2000] [--steps 1000] [--ref-steps 100] [--arms ...]
"""
from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sticky import time_reference  # noqa: E402
from common import dir_size, hardware  # noqa: E402

from dyntool.config import load  # noqa: E402
from dyntool.sims.sticky import StickyConfig, run_study  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--ref-steps", type=int, default=100)
    ap.add_argument("--arms", default="sgd,em,readout,routing,all,sgd_tuned")
    args = ap.parse_args()
    seeds = [42, 2024, 1337, 7777, 9999]
    print("hardware:", hardware())
    ref_wall, _ = time_reference(seeds, args.T, args.ref_steps)
    ref_total = ref_wall * args.steps / args.ref_steps
    tmp = Path(tempfile.mkdtemp(prefix="dyntool-study-"))
    try:
        cfg = load(StickyConfig, overrides=[f"--T={args.T}", f"--steps={args.steps}", f"--arms={args.arms}"])
        t0 = time.perf_counter()
        study = run_study(cfg, str(tmp), name="bench", quiet=True)
        study_wall = time.perf_counter() - t0
        size = dir_size(study)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    per = 1e3 * ref_wall / (args.ref_steps * 2 * len(seeds))
    print(f"reference autograd loop: {per:.1f} ms per run-step, {ref_total:.0f} s for the study "
          f"(extrapolated from {args.ref_steps} steps per run)")
    n_runs = len(cfg.seeds) * (len([a for a in cfg.arms if a != "sgd_tuned"])
                               + (len([g for g in cfg.tuned_grid if g not in (cfg.lr, cfg.lr * cfg.control_mult)])
                                  if "sgd_tuned" in cfg.arms else 0))
    print(f"dyntool study, arms {cfg.arms} ({n_runs} trained runs), recording on (every 50 steps, window + "
          f"pooled, arms {cfg.record_arms}), held-out every {cfg.heldout_every}: {study_wall:.0f} s, "
          f"{size / 1e6:.0f} MB recorded, {1e3 * study_wall / (n_runs * args.steps):.1f} ms per run-step")
    print(f"ratio study / reference(2 arms) = {study_wall / ref_total:.3f} (target <= 0.6); "
          f"peak RSS {peak:.2f} GB (target < 4 GB); loadavg {__import__('os').getloadavg()}")


if __name__ == "__main__":
    main()
