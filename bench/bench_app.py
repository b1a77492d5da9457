"""Benchmark: how fast the app's Matrices page re-renders on a ≥ 1 GB recording.

Writes a float16 ``attn`` recording of shape (steps, L=2, H=4, 1, 1024, 1024) (80 steps ≈ 1.25 GiB
raw, ≈ 1.1 GiB on disk after zstd) in a temp dir, then times the data-path functions the Matrices page calls
when the user changes step, head or layer — cold (first touch of that slice, store handle
cached) and warm (slice cached) — and a full ``AppTest`` re-run of the page after moving the step
slider and after picking another head.  Target: < 0.5 s per change after the first load.

    python bench/bench_app.py [--steps 80] [--keep DIR] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.app import fixtures  # noqa: E402

TARGET_S = 0.5


def timed(fn, *a, **kw) -> float:
    t0 = time.perf_counter()
    fn(*a, **kw)
    return time.perf_counter() - t0


def stats(xs: list[float]) -> dict:
    return {"median_ms": round(statistics.median(xs) * 1e3, 1), "max_ms": round(max(xs) * 1e3, 1), "n": len(xs)}


def data_path(path: str, pkg) -> dict:
    """The calls matrices.panel makes for one head at one step (big window: pooled overview + zoom)."""
    data, analysis = pkg.data, pkg.analysis
    data.clear_caches()
    out: dict = {}
    t0 = time.perf_counter()
    mark = data.marker(path)
    info = data.array_info(path, mark)
    steps = data.steps(path, mark)
    n, L, H = info["arrays"]["attn"]["shape"][:3]
    block = analysis.display_block(1024, 128)

    def view(i, l, h):
        data.pooled(path, mark, "attn", i, l, h, 0, block)                  # overview (block means)
        data.matrix(path, mark, "attn", i, l, h, 0, (896, 1024), (896, 1024))   # zoom: 128×128 real entries

    view(0, 0, 0)
    out["first_load_s"] = round(time.perf_counter() - t0, 3)
    out["step_change_cold"] = stats([timed(view, i, 0, 0) for i in range(1, min(n, 17))])
    out["head_change_cold"] = stats([timed(view, n // 2, 0, h) for h in range(H)])
    out["layer_change_cold"] = stats([timed(view, n // 3, l, 1) for l in range(L)])
    out["revisit_warm"] = stats([timed(view, i, 0, 0) for i in range(1, min(n, 17))])
    out["marker_check_ms"] = round(timed(data.marker, path) * 1e3, 2)
    out["recorded_steps"], out["layers"], out["heads"] = int(len(steps)), int(L), int(H)
    return out


def apptest(root: Path) -> dict:
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=120)
    at.query_params["run"] = "big"
    t0 = time.perf_counter()
    at.run()
    at.switch_page("views/matrices.py").run()
    first = time.perf_counter() - t0
    assert not at.exception, [e.value for e in at.exception]
    step_opts = at.select_slider(key="mx_step").options
    step_t, head_t = [], []
    for s in step_opts[1:9]:
        at.select_slider(key="mx_step").set_value(int(s))
        step_t.append(timed(at.run))
        assert not at.exception
    for h in (1, 2, 3, 0):
        at.selectbox(key="mx_head").set_value(h)
        head_t.append(timed(at.run))
        assert not at.exception
    return {"first_load_s": round(first, 3), "step_change": stats(step_t), "head_change": stats(head_t)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=80, help="recorded steps (80 ≈ 1.1 GiB on disk)")
    ap.add_argument("--keep", default=None, help="write the fixture here and keep it")
    ap.add_argument("--json", default=None, help="also write the results as JSON")
    args = ap.parse_args()
    logging.getLogger("streamlit").setLevel(logging.ERROR)     # "no runtime" notices outside a server
    try:
        from streamlit.logger import set_log_level
        set_log_level("error")
    except Exception:
        pass
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dyntool-bench-app-"))
    try:
        big = root / "big"
        if not big.exists():
            t0 = time.perf_counter()
            fixtures.make_big(root, "big", steps=args.steps)
            print(f"fixture written in {time.perf_counter() - t0:.1f} s")
        from common import dir_size
        size = dir_size(big / "record.zarr")
        print(f"recording: {big} — {size / 2**30:.2f} GiB on disk, attn (steps={args.steps}, 2, 4, 1, 1024, 1024) float16")
        pkg = fixtures.load_app_package()
        os.environ["DYNTOOL_RUNS_DIR"] = str(root)            # the app reads only inside RUNS_DIR
        res = {"size_gib": round(size / 2**30, 3), "data_path": data_path(str(big), pkg), "apptest": apptest(root)}
        print(json.dumps(res, indent=2))
        worst = max(res["data_path"]["step_change_cold"]["max_ms"], res["data_path"]["head_change_cold"]["max_ms"],
                    res["data_path"]["layer_change_cold"]["max_ms"]) / 1e3
        worst_app = max(res["apptest"]["step_change"]["max_ms"], res["apptest"]["head_change"]["max_ms"]) / 1e3
        print(f"worst data-path change {worst:.3f} s, worst AppTest re-run {worst_app:.3f} s "
              f"(target < {TARGET_S} s): {'OK' if max(worst, worst_app) < TARGET_S else 'SLOW'}")
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2))
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
