"""Retake the README's app screenshots from real runs (needs Chromium):

    python scripts/screenshots.py [RUNS_DIR]     # default: runs (after ./scripts/main.sh and `dyntool sim toy`)
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.app.test_app_browser import Browser, Server  # noqa: E402


def main() -> None:
    runs = Path(sys.argv[1] if len(sys.argv) > 1 else "runs").resolve()
    out = ROOT / "docs" / "screenshots"
    sticky = "sticky-markov/default/seed42-em"
    toy = next((p.relative_to(runs) for p in sorted((runs / "toy").iterdir()) if (p / "meta.json").exists()), None)
    pages = {"matrices-sticky": f"matrices?run={sticky}", "trajectories-sticky": f"trajectories?run={sticky}",
             "matrices-toy": f"matrices?run={toy}", "trajectories-toy": f"trajectories?run={toy}",
             "overview-sticky": f"overview?run={sticky}", "runs": "", "compare-sticky": "compare"}
    server, browser = Server(runs), None
    try:
        browser = Browser()
        for name, page in pages.items():
            browser.open(f"{server.url}/{page}", settle=2.0)
            browser.screenshot(out / f"{name}.png")
            print("wrote", out / f"{name}.png")
    finally:
        if browser is not None:
            browser.close()
        server.stop()


if __name__ == "__main__":
    main()
