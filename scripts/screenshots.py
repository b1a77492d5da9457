"""Retake the README's app screenshots from real runs (needs Chromium), at 1400 px wide:

    python scripts/screenshots.py [RUNS_DIR] [--out DIR]

RUNS_DIR (default ``runs``) must hold a sticky-chain study (``dyntool sim sticky-markov``, e.g.
``--config sticky_markov --preset ci``) and a toy run (``dyntool sim toy --out RUNS_DIR/toy``).
Look at every image before committing it.
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.app.test_app_browser import Browser, Server  # noqa: E402


def first(runs: Path, pattern: str) -> str:
    hits = sorted(p.parent for p in runs.glob(f"{pattern}/meta.json"))
    if not hits:
        sys.exit(f"no run matching {pattern} under {runs}")
    return str(hits[0].relative_to(runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="?", default="runs")
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = ap.parse_args()
    runs, out = Path(args.runs).resolve(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sticky = first(runs, "sticky-markov/*/seed*-em")
    toy = first(runs, "toy/*")
    # page -> (url, plots that must be drawn before the picture is taken)
    pages = {"matrices-sticky": (f"matrices?run={sticky}", 4), "trajectories-sticky": (f"trajectories?run={sticky}", 1),
             "matrices-toy": (f"matrices?run={toy}", 4), "trajectories-toy": (f"trajectories?run={toy}", 1),
             "overview-sticky": (f"overview?run={sticky}", 3), "runs": ("", 0), "compare-sticky": ("compare", 1)}
    server, browser = Server(runs), None
    try:
        browser = Browser(width=1400)
        for name, (page, charts) in pages.items():
            browser.open(f"{server.url}/{page}", timeout=180, settle=2.0, charts=charts)
            browser.screenshot(out / f"{name}.png")
            print("wrote", out / f"{name}.png")
    finally:
        if browser is not None:
            browser.close()
        server.stop()


if __name__ == "__main__":
    main()
