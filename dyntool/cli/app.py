"""``dyntool app [RUNS_DIR] [--port N] [--headless] [--address HOST]``: start the Streamlit app.

The app is the package :mod:`dyntool.app` (shipped by ``pip install``); this command checks the
port and address, then runs ``streamlit run <dyntool/app/main.py>`` bound to localhost unless told
otherwise, and hands RUNS_DIR (a folder, or an ``s3://`` / ``file://`` URL, read-only) over in
``$DYNTOOL_RUNS_DIR`` (and after ``--``).

Streamlit always runs headless: a non-headless Streamlit stops at its first-run "Welcome to
Streamlit! … Email:" prompt on a fresh machine, and waits there forever when started from a script
or in the background.  Without ``--headless`` this command opens the browser itself once the port
answers (where there is a display), and writes nothing into the user's ``~/.streamlit``.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ..errors import DyntoolError, RunError
from ..location import location
from .common import DEFAULT_RUNS

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


def free_port(address: str, first: int = 8501, tries: int = 100) -> int:
    """Streamlit's default port, or the next free one (chosen here so the browser knows where)."""
    for port in range(first, first + tries):
        try:
            check_bind(address, port)
            return port
        except DyntoolError:
            continue
    raise DyntoolError(f"no free port in {first}..{first + tries - 1} on {address}; choose one with --port")


def streamlit_argv(runs_dir, port: int | None, address: str) -> list[str]:
    argv = [sys.executable, "-m", "streamlit", "run", str(app_entry()),
            f"--server.address={address}", "--server.headless=true",
            "--browser.gatherUsageStats=false", "--server.fileWatcherType=none",
            "--client.toolbarMode=minimal"]
    if port is not None:
        argv.append(f"--server.port={port}")
    return argv + ["--", str(runs_dir)]


def _runs_dir(text: str):
    from ..run import find_runs  # deferred: keeps zarr off `dyntool --help`
    from ..storage import open_backend
    runs_dir = location(text, "RUNS_DIR").resolve()
    if not open_backend(runs_dir, "RUNS_DIR").is_dir():
        if isinstance(runs_dir, Path) and runs_dir.exists():
            raise RunError(f"{text} is a file, not a folder")
        raise RunError(f"runs directory {runs_dir} does not exist (record runs first, e.g. "
                       f"`dyntool sim toy --out {text}`)")
    find_runs(runs_dir, max_depth=0)        # object storage answers a LIST: one line on a wrong bucket
    return runs_dir


def _has_display() -> bool:
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _open_when_ready(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Open the browser once the server answers its health check (never before: a browser that
    loads too early shows an error page)."""
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    import webbrowser
                    webbrowser.open(url)
                    return
        except OSError:
            time.sleep(0.3)


def cmd_app(args) -> int:
    runs_dir = _runs_dir(args.runs_dir)
    import importlib.util
    if importlib.util.find_spec("streamlit") is None:       # fail here, not inside the server
        raise DyntoolError("streamlit is not installed (pip install 'streamlit>=1.45')")
    check_bind(args.address, args.port)
    port = args.port or free_port(args.address)
    argv = streamlit_argv(runs_dir, port, args.address)
    env = {**os.environ, ENV_ROOT: str(runs_dir)}
    url = f"http://{args.address}:{port}"
    print(f"dyntool app: serving {runs_dir} on {url}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    if not args.headless and _has_display():
        threading.Thread(target=_open_when_ready, args=(url, proc), daemon=True).start()
    return _serve(proc)


def _serve(proc: subprocess.Popen) -> int:
    """Wait for the server, handing it every stop signal this process gets (before, this command
    exec'ed Streamlit, so a ``kill`` reached it directly; it must still, and never orphan it).
    Exit status as a shell reports it: 128 + the signal that ended the server."""
    import signal

    def forward(sig, _frame):
        if proc.poll() is None:
            proc.send_signal(sig)
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


def register(sub, simsub) -> None:
    p = sub.add_parser("app", help="browse runs in the Streamlit app (binds to localhost)",
                       description="Start the dyntool app on RUNS_DIR: runs table, overview curves, "
                                   "matrices, trajectories, comparisons.")
    p.add_argument("runs_dir", nargs="?", default=DEFAULT_RUNS, metavar="RUNS_DIR",
                   help=f"directory holding runs, or s3://bucket/prefix, file:///path (read-only) "
                        f"(default: {DEFAULT_RUNS}); the app reads nothing outside it")
    p.add_argument("--port", type=int, default=None, help="port (default: the first free one from 8501)")
    p.add_argument("--headless", action="store_true",
                   help="don't open a browser (the server never waits at Streamlit's first-run prompt either way)")
    p.add_argument("--address", default="localhost",
                   help="address to bind (default: localhost; anything else exposes your runs on the network)")
    p.set_defaults(fn=cmd_app)
