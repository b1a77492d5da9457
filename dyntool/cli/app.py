"""``dyntool app [RUNS_DIR] [--port N] [--headless] [--address HOST]``: start the Streamlit app.

The app lives in ``app/`` next to the ``dyntool`` package (an editable install from the repo);
this command execs ``streamlit run app/main.py`` bound to localhost unless told otherwise, and
hands RUNS_DIR over in ``$DYNTOOL_RUNS_DIR`` (and after ``--``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import DyntoolError, RunError

ENV_ROOT = "DYNTOOL_RUNS_DIR"


def load_app_package(app_dir: Path, name: str = "dyntool_app"):
    """Import the ``app/`` folder as the package ``name`` (the name its pages import from).

    The app is a folder of the repository, not part of the installed ``dyntool`` package, so
    both ``app/main.py`` (under ``streamlit run``) and the tests register it this way.
    """
    import importlib.util
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, app_dir / "__init__.py",
                                                      submodule_search_locations=[str(app_dir)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def app_entry() -> Path:
    """``<repo>/app/main.py``, resolved relative to the package's parent directory."""
    entry = Path(__file__).resolve().parents[2] / "app" / "main.py"
    if not entry.is_file():
        raise DyntoolError(f"the app is not installed: {entry} is missing. `dyntool app` needs dyntool "
                           "installed from a checkout of the repository (pip install -e .)")
    return entry


def streamlit_argv(runs_dir: Path, port: int | None, headless: bool, address: str) -> list[str]:
    argv = [sys.executable, "-m", "streamlit", "run", str(app_entry()),
            f"--server.address={address}", f"--server.headless={'true' if headless else 'false'}",
            "--browser.gatherUsageStats=false", "--server.fileWatcherType=none",
            "--client.toolbarMode=minimal"]
    if port is not None:
        argv.append(f"--server.port={port}")
    return argv + ["--", str(runs_dir)]


def cmd_app(args) -> int:
    runs_dir = Path(args.runs_dir).expanduser().resolve()
    if not runs_dir.is_dir():
        raise RunError(f"runs directory {runs_dir} does not exist (record runs first, e.g. "
                       f"`dyntool sim toy --out {args.runs_dir}`)")
    import importlib.util
    if importlib.util.find_spec("streamlit") is None:       # fail here, not inside the exec
        raise DyntoolError("streamlit is not installed (pip install 'streamlit>=1.37')")
    argv = streamlit_argv(runs_dir, args.port, args.headless, args.address)
    env = {**os.environ, ENV_ROOT: str(runs_dir)}
    print(f"dyntool app: serving {runs_dir} on http://{args.address}:{args.port or 8501}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def register(sub, simsub) -> None:
    from . import DEFAULT_RUNS
    p = sub.add_parser("app", help="browse runs in the Streamlit app (binds to localhost)",
                       description="Start the dyntool app on RUNS_DIR: runs table, overview curves, "
                                   "matrices, trajectories, comparisons.")
    p.add_argument("runs_dir", nargs="?", default=DEFAULT_RUNS, metavar="RUNS_DIR",
                   help=f"directory holding runs (default: {DEFAULT_RUNS}); the app reads nothing outside it")
    p.add_argument("--port", type=int, default=None, help="port (default: Streamlit's, 8501)")
    p.add_argument("--headless", action="store_true", help="don't open a browser")
    p.add_argument("--address", default="localhost",
                   help="address to bind (default: localhost; anything else exposes your runs on the network)")
    p.set_defaults(fn=cmd_app)
