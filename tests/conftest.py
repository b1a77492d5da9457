"""Fixtures shared by test modules."""
import os

import pytest
import torch

# Triton's interpreter (the fused kernels' tests on the CPU, tests/kernels) must be chosen before
# anything imports triton: triton defines its own library functions (tl.max, tl.sum, ...) when
# imported, interpreted or not, and some test modules import it indirectly at collection.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def float64_default():
    """float64 as torch's default dtype for one test, restored afterwards (a global default would
    leak into other files).  A module opts in with ``pytestmark = pytest.mark.usefixtures("float64_default")``."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# -- progress by tier ---------------------------------------------------------------------------
# The default run takes minutes on 2 cores; pytest's own line shows only dots and a count.  These
# hooks say which tier (tests/unit, tests/integration, ...) is running, how far the run is
# (tests done of all, elapsed time) when a tier starts, and each tier's time at the end.
import time as _time

_TIERS: dict = {"order": [], "count": {}, "seconds": {}, "current": None, "done": 0, "t0": None, "since": None}


def _tier(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0].rsplit(".", 1)[0]


def _clock(s: float) -> str:
    m, s = divmod(int(s), 60)
    return f"{m}:{s:02d}"


def pytest_collection_finish(session):
    for item in session.items:
        t = _tier(item.nodeid)
        if t not in _TIERS["count"]:
            _TIERS["order"].append(t)
            _TIERS["count"][t] = 0
        _TIERS["count"][t] += 1
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    if rep is not None and len(_TIERS["order"]) > 1:
        tiers = ", ".join(f"{t} {_TIERS['count'][t]}" for t in _TIERS["order"])
        rep.write_line(f"tiers: {tiers} ({len(session.items)} tests; marks: "
                       f"{session.config.getoption('markexpr') or 'all'})")


def pytest_runtest_logstart(nodeid, location):
    now = _time.monotonic()
    t = _tier(nodeid)
    if _TIERS["t0"] is None:
        _TIERS["t0"] = now
    if t != _TIERS["current"]:
        _close_tier(now)
        _TIERS["current"], _TIERS["since"] = t, now
        total = sum(_TIERS["count"].values())
        cfg = _REPORTER.get("config")
        rep = cfg.pluginmanager.get_plugin("terminalreporter") if cfg is not None else None
        if rep is not None and len(_TIERS["order"]) > 1:
            if getattr(rep._tw, "width_of_current_line", 0):      # after a row of dots
                rep.write("\n")
            rep.write_line(f"== tier {t}: {_TIERS['count'].get(t, 0)} tests, starting at test "
                           f"{_TIERS['done'] + 1} of {total}, elapsed {_clock(now - _TIERS['t0'])} ==")


def pytest_runtest_logfinish(nodeid, location):
    _TIERS["done"] += 1


def _close_tier(now: float) -> None:
    cur = _TIERS["current"]
    if cur is not None:
        _TIERS["seconds"][cur] = _TIERS["seconds"].get(cur, 0.0) + now - _TIERS["since"]


_REPORTER: dict = {}


def pytest_configure(config):
    _REPORTER["config"] = config


def pytest_terminal_summary(terminalreporter):
    _close_tier(_time.monotonic())
    _TIERS["current"] = None
    if len(_TIERS["seconds"]) > 1:
        terminalreporter.write_line("time per tier: " + ", ".join(
            f"{t} {_clock(s)}" for t, s in _TIERS["seconds"].items()))
        # CPU time beside the wall clock (the README quotes both): this process and the
        # subprocesses it waited for (the CLI, torchrun, the app's server), user + system
        import resource
        cpu = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                    resource.getrusage(resource.RUSAGE_CHILDREN)))
        wall = _time.monotonic() - _TIERS["t0"] if _TIERS["t0"] is not None else 0.0
        terminalreporter.write_line(f"wall clock {_clock(wall)}, CPU time {_clock(cpu)} (user + system, "
                                    "with the subprocesses the tests waited for)")
