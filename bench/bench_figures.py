"""Time the figure gallery: every figure of a sticky-chain study at realistic size plus the toy run.

By default it builds (once, cached under ``--cache``) a synthetic sticky-markov study with the
layout and sizes of the default ``dyntool sim sticky-markov`` (5 seeds × 2 arms × 1000 steps,
T = 2000, recorded every 50 steps: α/B/A/dS on the last 200 × 200 window, 50-block pooled
overviews, values/upstream/attention entropy at all 1999 positions, diag_* scalars) and a real
``dyntool sim toy`` run (500 steps, every step recorded).  ``--study DIR`` times a real study
instead.  The fixture build is not timed.

Reported: the gallery as ``scripts/gallery.sh`` makes it (PNG at the gallery dpi) in-process and
through the CLI (``python -m dyntool figures``, interpreter start and imports included), per-figure
seconds, and the same figures as PDF + PNG at 300 dpi.

    python bench/bench_figures.py [--cache bench/results/figures-cache] [--study DIR] [--dpi 110]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import hardware  # noqa: E402


def build(cache: Path, log=print) -> tuple[Path, Path]:
    """The cached toy run and synthetic realistic-size study (built on first use)."""
    from tests import figures_fixtures as fx
    toy, study = cache / "toy", cache / "sticky-markov"
    if not (toy / "toy" / "meta.json").exists():
        log("building the toy run (500 steps) ...")
        toy.mkdir(parents=True, exist_ok=True)
        fx.make_toy(toy, name="toy", steps=500)
    if not (study / "default" / "summary.json").exists():
        log("building a synthetic sticky study: 5 seeds × 2 arms × 1000 steps, T = 2000 (takes ~1 min) ...")
        study.mkdir(parents=True, exist_ok=True)
        if (study / "default").exists():
            import shutil
            shutil.rmtree(study / "default")
        t0 = time.perf_counter()
        fx.make_sticky_study(study, name="default", seeds=(42, 2024, 1337, 7777, 9999), T=2000, steps=1000,
                             every=50, window=200, pool=50, d_v=15, sweep=False, dtype="float32")
        log(f"  built in {time.perf_counter() - t0:.0f} s")
    return toy / "toy", study / "default"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=str(ROOT / "bench" / "results" / "figures-cache"))
    ap.add_argument("--study", default=None, help="time this sticky-markov study instead of the synthetic one")
    ap.add_argument("--toy", default=None, help="time this toy run instead of the cached one")
    ap.add_argument("--dpi", type=int, default=110, help="gallery dpi (scripts/gallery.sh uses 110)")
    args = ap.parse_args(argv)
    toy, study = build(Path(args.cache))
    toy = Path(args.toy) if args.toy else toy
    study = Path(args.study) if args.study else study

    from dyntool.figures import export_all
    from dyntool.cli.figures import collect_runs
    print(f"hardware: {hardware()}")
    print(f"inputs:   {toy}  +  {study}")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        runs = collect_runs([str(toy), str(study)])
        t_open = time.perf_counter() - t0
        t0 = time.perf_counter()
        rep = export_all(runs, Path(tmp) / "png", ["png"], dpi=args.dpi)
        t_png = time.perf_counter() - t0
        print(f"\ngallery in-process (PNG, {args.dpi} dpi): {t_png:.1f} s for {len(rep.written)} figures "
              f"(+ {t_open:.2f} s opening {len(runs)} runs)")
        for name, s in rep.seconds.items():
            size = sum(p.stat().st_size for p in rep.written.get(name, []) if p.suffix == ".png")
            print(f"  {name:<20} {s:6.2f} s   {size / 1024:6.0f} KB")
        for name, why in rep.skipped.items():
            print(f"  skipped {name}: {why}")

        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dyntool", "figures", str(toy), str(study), "--out",
                        str(Path(tmp) / "cli"), "--format", "png", "--dpi", str(args.dpi)],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        t_cli = time.perf_counter() - t0
        print(f"\ngallery through the CLI (what scripts/gallery.sh runs once the runs exist): {t_cli:.1f} s")

        t0 = time.perf_counter()
        rep2 = export_all(runs, Path(tmp) / "pub", ["pdf", "png"], dpi=300)
        t_pub = time.perf_counter() - t0
        print(f"publication set (PDF + PNG at 300 dpi): {t_pub:.1f} s for {len(rep2.written)} figures")
    ok = t_cli < 60
    print(f"\ntarget: gallery < 60 s on the 2-core CPU -> {'met' if ok else 'NOT met'} ({t_cli:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
