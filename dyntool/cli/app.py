"""``dyntool app [RUNS_DIR] [--port N] [--headless] [--address HOST]``: start the Streamlit app.

The app is the package :mod:`dyntool.app` (shipped by ``pip install``); this command checks the
port and address, then execs ``streamlit run <dyntool/app/main.py>`` bound to localhost unless told
otherwise, and hands RUNS_DIR over in ``$DYNTOOL_RUNS_DIR`` (and after ``--``).
"""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from ..errors import DyntoolError, RunError

ENV_ROOT = "DYNTOOL_RUNS_DIR"


def app_entry() -> Path:
    """``main.py`` of the installed :mod:`dyntool.app` package."""
    import importlib.util
    spec = importlib.util.find_spec("dyntool.app")
    entry = Path(spec.origin).parent / "main.py" if spec and spec.origin else None
    if entry is None or not entry.is_file():
        raise DyntoolError(f"the app is missing from this installation of dyntool ({entry}); reinstall it")
    return entry


def check_bind(address: str, port: int | None) -> None:
    """Fail with one line (exit 2) on a port out of range, an address that doesn't resolve, or a
    port already taken, before Streamlit starts (which would print a long traceback).  Without
    ``port`` only the address is checked: Streamlit then picks the next free port after 8501."""
    if port is not None and not 1 <= port <= 65535:
        raise DyntoolError(f"--port {port} is not a TCP port (1-65535)")
    if not address or "\x00" in address:
        raise DyntoolError(f"--address {address!r} is not a host name or IP address")
    try:
        infos = socket.getaddrinfo(address, port or 0, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as e:
        raise DyntoolError(f"--address {address!r} does not resolve to a local address ({e})") from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as e:
            what = f"port {port} on {address}" if port else address
            raise DyntoolError(f"can't listen on {what}: {e.strerror or e}"
                               + (" (choose another with --port)" if e.errno == 98 else "")) from None


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
        raise DyntoolError("streamlit is not installed (pip install 'streamlit>=1.45')")
    check_bind(args.address, args.port)
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
