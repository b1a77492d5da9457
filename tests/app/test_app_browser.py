"""End to end: ``dyntool app`` serves the app, headless Chromium loads every page, screenshots.

Chromium is driven over the DevTools protocol (``websockets``, a Streamlit dependency) so the
test waits for Streamlit to *finish* rendering instead of guessing a time budget.  Skips only
when no Chromium binary exists (Debian: ``apt-get install -y chromium``).
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from . import fixtures

try:                                  # the local S3 server fixture of the s3:// run tests
    from tests.integration.test_s3 import s3  # noqa: F401
except pytest.skip.Exception:         # obstore / moto missing: that test skips
    s3 = None

CHROMIUM = next((b for b in ("chromium", "chromium-browser", "google-chrome", "chrome") if shutil.which(b)), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-port=0"]

# Streamlit has rendered: a page title exists, nothing is running, no skeletons, visible plots drawn
READY_JS = """(() => {
  const h1 = document.querySelector('h1');
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  const skel = document.querySelector('[data-testid="stSkeleton"]');
  const pending = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
      .filter(e => e.getBoundingClientRect().top < window.innerHeight && !e.querySelector('.main-svg')).length;
  return !!h1 && !running && !skel && pending === 0;
})()"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {timeout:.0f} s")


class Browser:
    """Minimal DevTools client: open a URL, wait until Streamlit is idle, capture PNG."""

    def __init__(self, width: int = 1400, height: int = 1000):
        from websockets.sync.client import connect
        self.profile = tempfile.mkdtemp(prefix="dt-chromium-")
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}",
                                      f"--window-size={width},{height}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        t0 = time.monotonic()
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() - t0 > 20 or self.proc.poll() is not None:
                raise RuntimeError("chromium did not start")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=64 << 20,
                                                    open_timeout=10))
        self._id = 0
        self.width, self.height = width, height
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, js: str):
        return self.call("Runtime.evaluate", expression=js, returnByValue=True).get("result", {}).get("value")

    def open(self, url: str, timeout: float = 40.0, settle: float = 0.5, charts: int = 0) -> float:
        """Navigate; wait until Streamlit is idle and the DOM has stopped changing (the status
        widget only appears after a delay, so "not running" alone is not enough); returns seconds."""
        t0 = time.monotonic()
        self.call("Page.navigate", url=url)
        time.sleep(0.5)
        stable, last = 0, None
        while time.monotonic() - t0 < timeout:
            size = self.eval("document.body.innerHTML.length")
            drawn = self.eval("document.querySelectorAll('.main-svg').length") if charts else 0
            stable = stable + 1 if (self.eval(READY_JS) and size == last and drawn >= charts) else 0
            last = size
            if stable >= 4:
                time.sleep(settle)
                return time.monotonic() - t0
            time.sleep(0.3)
        raise TimeoutError(f"{url} did not finish rendering in {timeout:.0f} s")

    def text(self) -> str:
        return self.eval("document.body.innerText") or ""

    def screenshot(self, out: str | Path, full: bool = True, max_height: int = 3000) -> None:
        """PNG of the page; ``full``: grow the viewport to the content's height first (Streamlit
        scrolls inside its own container, so a plain full-page capture would cut it off)."""
        if full:
            h = self.eval("(() => { const m = document.querySelector('[data-testid=\"stMainBlockContainer\"]');"
                          " return m ? Math.ceil(m.getBoundingClientRect().top + m.scrollHeight + 24) : 1000; })()")
            self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=min(max(int(h or 0), 600), max_height),
                      deviceScaleFactor=1, mobile=False)
            time.sleep(0.5)
            t0 = time.monotonic()
            while not self.eval(READY_JS) and time.monotonic() - t0 < 10:
                time.sleep(0.2)
            time.sleep(0.6)                        # plotly re-lays out on resize
        res = self.call("Page.captureScreenshot", format="png")
        Path(out).write_bytes(base64.b64decode(res["data"]))
        if full:
            self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


class Server:
    """``dyntool app RUNS_DIR --headless --port N`` in its own process group."""

    def __init__(self, runs_dir: Path, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://localhost:{self.port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "dyntool", "app", str(runs_dir), "--headless",
                                      "--port", str(self.port)], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(f"{self.url}/_stcore/health")
        except Exception:
            self.stop()
            raise

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (Debian: apt-get install -y chromium)")
def test_app_serves_and_renders_every_page(tmp_path):
    runs = tmp_path / "runs"
    fixtures.make_toy(runs, "toy-a", steps=20)
    fixtures.make_sticky_study(runs)
    fixtures.make_corrupted(runs)
    server = Server(runs)
    browser = None
    try:
        browser = Browser()
        shots = Path(os.environ.get("DYNTOOL_SCREENSHOTS", tmp_path))
        shots.mkdir(parents=True, exist_ok=True)
        expect = {"": ("Runs", "run(s) under"), "overview": ("Overview", "Training loss"),
                  "matrices?run=toy-a": ("Matrices", "α (attention)"),
                  "trajectories?run=toy-a": ("Trajectories", "Projection"),
                  "compare": ("Compare", "Group runs by")}
        for page, words in expect.items():
            browser.open(f"{server.url}/{page}")
            text = browser.text()
            name = page.split("?")[0] or "runs"
            browser.screenshot(shots / f"browser-{name}.png")
            for w in words:
                assert w in text, f"{name}: {w!r} not on the page"
            assert "Traceback" not in text and "could not be drawn" not in text, text[:2000]
        assert (shots / "browser-matrices.png").stat().st_size > 20_000
    finally:
        if browser is not None:
            browser.close()
        server.stop()
    assert "localhost" in server.output()


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (Debian: apt-get install -y chromium)")
def test_run_strings_are_plain_text_and_fetch_nothing(tmp_path):
    """A meta.json whose kind, tags, error and status carry Markdown images and links: the Runs
    and Overview pages show them as text, and the browser never requests the crafted host (a
    local listener records every request)."""
    import http.server
    import threading
    hits: list[str] = []

    class Trap(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *a):
            pass
    trap = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Trap)
    threading.Thread(target=trap.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{trap.server_address[1]}"
    runs = tmp_path / "runs"
    run = fixtures.make_toy(runs, "evil", steps=5)
    meta = json.loads((run / "meta.json").read_text())
    meta.update(kind=f"![k]({host}/kind.png)", tags=[f"![t]({host}/tag.png)", f"[l]({host}/link)"],
                status="failed", error=f"<img src='{host}/html.png'> ![e]({host}/error.png)")
    (run / "meta.json").write_text(json.dumps(meta))
    server = Server(runs)
    browser = None
    try:
        browser = Browser()
        for page in ("", "overview?run=evil"):
            browser.open(f"{server.url}/{page}")
            text = browser.text()
            if page:    # the Runs page draws its table on a canvas; the Overview writes the strings
                assert all(f"{host}/{f}" in text for f in ("kind.png", "tag.png", "html.png", "link")), text[:2000]
            html = browser.eval("document.body.innerHTML") or ""
            assert f'src="{host}' not in html and f"href=\"{host}" not in html
        time.sleep(1.0)
    finally:
        if browser is not None:
            browser.close()
        server.stop()
        trap.shutdown()
    assert hits == [], hits


def test_app_without_headless_and_without_a_terminal_serves_and_writes_no_streamlit_config(tmp_path):
    """``dyntool app RUNS`` as the README shows it (no --headless), started with no terminal and a
    fresh HOME: Streamlit's first-run "Email:" prompt would block it forever; it must serve the
    page and leave ``~/.streamlit`` alone."""
    runs = tmp_path / "runs"
    fixtures.make_toy(runs, "toy-a", steps=5)
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.pop("DISPLAY", None)
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "dyntool", "app", str(runs), "--port", str(port)], env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://localhost:{port}/_stcore/health", timeout=60)
        with urllib.request.urlopen(f"http://localhost:{port}/", timeout=10) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
        proc.send_signal(signal.SIGTERM)                  # dyntool's process only: the server must stop too
        assert proc.wait(timeout=20) in (0, 128 + signal.SIGTERM)   # Streamlit stops cleanly on SIGTERM
        with pytest.raises(OSError):                      # nothing left listening (no orphaned server)
            urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=3)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
    log.seek(0)
    out = log.read().decode(errors="replace")
    assert "Email" not in out and "Welcome to Streamlit" not in out, out
    assert not (home / ".streamlit").exists(), list((home / ".streamlit").iterdir())


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (Debian: apt-get install -y chromium)")
@pytest.mark.skipif(s3 is None, reason="obstore or moto[server] not installed")
def test_app_lists_and_shows_runs_in_object_storage(tmp_path, s3):
    """``dyntool app s3://bucket/runs`` against the local S3 server: the Runs page lists the run,
    and Overview and Matrices draw it, read-only (not one object changes)."""
    import boto3
    server = browser = None
    try:
        c = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
        c.create_bucket(Bucket="app-runs")
        local = tmp_path / "runs"
        fixtures.make_toy(local, "toy-remote", steps=20)
        for f in sorted(local.rglob("*")):
            if f.is_file():
                c.upload_file(str(f), "app-runs", f"runs/{f.relative_to(local).as_posix()}")
        before = {o["Key"]: o["ETag"] for o in c.list_objects_v2(Bucket="app-runs")["Contents"]}
        server = Server("s3://app-runs/runs")
        browser = Browser()
        shots = Path(os.environ.get("DYNTOOL_SCREENSHOTS", tmp_path))
        shots.mkdir(parents=True, exist_ok=True)
        for page, words in {"": ("Runs", "1 run(s) under"), "overview?run=toy-remote": ("Overview", "Training loss"),
                            "matrices?run=toy-remote": ("Matrices", "α (attention)")}.items():
            browser.open(f"{server.url}/{page}")
            text = browser.text()
            browser.screenshot(shots / f"browser-s3-{page.split('?')[0] or 'runs'}.png")
            for w in words:
                assert w in text, f"{page}: {w!r} not on the page: {text[:1500]}"
            assert "Traceback" not in text and "could not be drawn" not in text and "can't be read" not in text, text[:2000]
        after = {o["Key"]: o["ETag"] for o in c.list_objects_v2(Bucket="app-runs")["Contents"]}
        assert after == before                               # the app never writes a remote run
    finally:
        if browser is not None:
            browser.close()
        if server is not None:
            server.stop()


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (Debian: apt-get install -y chromium)")
def test_compare_does_not_pool_unrelated_runs_by_default(tmp_path):
    """Issue 50 item 1: nothing selected, Compare opened on two unrelated models that happen to
    share ``model.attention=sdpa`` (different depths) and two seeds of one ``eager`` config, one
    seed stopped early.  The default draws each unrelated run on its own, pools only the two seeds
    (n=2), and says where that band's n falls (its mean jumps there)."""
    runs = tmp_path / "runs"
    fixtures.make_multihead(runs, "gpt-like", L=2, H=4, attention="sdpa", steps=12)
    fixtures.make_multihead(runs, "llama-like", L=1, H=2, attention="sdpa", steps=6)
    fixtures.make_multihead(runs, "eager-s0", L=3, seed=0, attention="eager", steps=12)
    fixtures.make_multihead(runs, "eager-s1", L=3, seed=1, attention="eager", steps=8)
    server = Server(runs)
    browser = None
    try:
        browser = Browser()
        browser.open(f"{server.url}/compare", charts=1)
        text = browser.text()
        legend = browser.eval("[...document.querySelectorAll('.legendtext')].map(e => e.textContent)") or []
        browser.screenshot(Path(os.environ.get("DYNTOOL_SCREENSHOTS", tmp_path)) / "browser-compare-default.png")
    finally:
        if browser is not None:
            browser.close()
        server.stop()
    assert "Traceback" not in text and "could not be drawn" not in text, text[:2000]
    assert "(same config, seeds pooled)" in text, text[:2000]
    assert sorted(legend) == ["eager-s0 + seeds (n=2)", "gpt-like (n=1)", "llama-like (n=1)"], legend
    assert "eager-s0 + seeds: n falls from 2 to 1 at step 80" in text, text[:3000]
