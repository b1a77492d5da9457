"""The sticky-chain study as users run it (recording ON) vs the authors-style reference loop.

Issue target: the full 5-seed, 2-arm, 1000-step, T = 2000 study with recording on takes at most
1/3 of the time of a straightforward per-seed PyTorch autograd loop of the same model on the
same machine; peak memory under 4 GB.  Both are timed in this process.  The reference runs
``--ref-steps`` steps of every (seed, arm) run and is extrapolated linearly to ``--steps``
(labelled); pass ``--ref-steps 1000`` for a full reference run (≈ 7 min here).

    python bench/bench_study.py [--T 2000] [--steps 1000] [--ref-steps 100]
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
from common import hardware  # noqa: E402

from dyntool.config import load  # noqa: E402
from dyntool.record.store import _dir_size  # noqa: E402
from dyntool.sims.sticky import StickyConfig, run_study  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--ref-steps", type=int, default=100)
    args = ap.parse_args()
    seeds = [42, 2024, 1337, 7777, 9999]
    print("hardware:", hardware())
    ref_wall, _ = time_reference(seeds, args.T, args.ref_steps)
    ref_total = ref_wall * args.steps / args.ref_steps
    tmp = Path(tempfile.mkdtemp(prefix="dyntool-study-"))
    try:
        cfg = load(StickyConfig, overrides=[f"--T={args.T}", f"--steps={args.steps}"])
        t0 = time.perf_counter()
        study = run_study(cfg, str(tmp), name="bench", quiet=True)
        study_wall = time.perf_counter() - t0
        size = _dir_size(study)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    per = 1e3 * ref_wall / (args.ref_steps * 2 * len(seeds))
    print(f"reference autograd loop: {per:.1f} ms per run-step, {ref_total:.0f} s for the study "
          f"(extrapolated from {args.ref_steps} steps per run)")
    print(f"dyntool study, recording on (every 50 steps, window + pooled): {study_wall:.0f} s, "
          f"{size / 1e6:.0f} MB recorded")
    print(f"ratio study / reference = {study_wall / ref_total:.3f} (target <= 0.333); "
          f"peak RSS {peak:.2f} GB (target < 4 GB)")


if __name__ == "__main__":
    main()
