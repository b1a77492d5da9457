"""``critical_section``: a signal held over a training step, and a step of a multi-process run that
fails while a stop is held or arriving (a peer rank that stopped first broke its collective) ends
the run as interrupted, not failed, unless another rank failed first (torchrun then signals every
rank too).  torch.distributed is faked as a 2-process group of rank 0 with a dict for its store."""
from __future__ import annotations

import os
import signal
import threading

import pytest
import torch.distributed as dist

from dyntool import run_writer
from dyntool.run_writer import Interrupted, critical_section


@pytest.fixture
def handler():
    old = signal.signal(signal.SIGTERM, run_writer._on_signal)
    old_int = signal.getsignal(signal.SIGINT)         # a 2-rank world installs its own on SIGINT
    yield
    signal.signal(signal.SIGTERM, old)
    signal.signal(signal.SIGINT, old_int)
    run_writer._Signals.pending = None
    run_writer._Signals.said = run_writer._Signals.watching = False


class Store:
    def __init__(self):
        self.keys = {}

    def set(self, key, value):
        self.keys[key] = value

    def check(self, keys):
        return all(k in self.keys for k in keys)


def world(monkeypatch, n: int, store=None) -> Store:
    store = Store() if store is None else store
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: n > 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: n)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(run_writer, "_group_store", lambda: store)
    return store


def test_a_signal_in_a_step_is_held_to_its_end(handler):
    done = []
    with pytest.raises(Interrupted, match="signal 15"):
        with critical_section():
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("the rest of the step")
    assert done == ["the rest of the step"]


def test_a_collective_broken_by_a_peer_that_stopped_is_an_interruption(handler, monkeypatch):
    store = world(monkeypatch, 2)
    store.set(run_writer.ASKED_KEY + "1", "1")                   # the peer got the stop signal too
    # this rank's own SIGTERM lands 0.1 s after its all-reduce failed
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(Interrupted, match=r"signal 15 \(this rank's step ended in RuntimeError\)"):
        with critical_section():
            raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    assert run_writer._Signals.pending is None and run_writer._Signals.depth == 0
    assert store.keys == {run_writer.FAILED_KEY + "0": "1", run_writer.ASKED_KEY + "0": "1",
                          run_writer.ASKED_KEY + "1": "1"}      # failed before its signal came


def test_a_peer_killed_outright_makes_the_run_failed_not_interrupted(handler, monkeypatch):
    """Issue 50 item 11: rank 1 killed by SIGKILL breaks rank 0's all-reduce, and torchrun then
    sends rank 0 a SIGTERM: the run read 'interrupted by signal 15'.  Rank 1 was never asked to
    stop (it said nothing in the store), so this is a failure that names it."""
    store = world(monkeypatch, 2)
    monkeypatch.setattr(run_writer, "STOP_WAIT_S", 0.3)
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()      # torchrun's, after the kill
    with pytest.raises(RuntimeError, match=r"^rank 1 ended without being asked to stop \(killed: SIGKILL.*"
                                           r"step then failed: RuntimeError: Connection reset by peer$"):
        with critical_section():
            raise RuntimeError("Connection reset by peer")
    assert run_writer._Signals.pending is None and run_writer._Signals.depth == 0
    assert store.keys == {run_writer.FAILED_KEY + "0": "1", run_writer.ASKED_KEY + "0": "1"}


def test_a_peer_that_failed_first_keeps_the_run_failed(handler, monkeypatch):
    """torchrun signals every rank when one fails: that signal is no stop request."""
    store = world(monkeypatch, 2)
    store.set(run_writer.FAILED_KEY + "1", "1")                  # rank 1's own step raised first
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        with critical_section():
            raise RuntimeError("Connection closed by peer")
    assert run_writer._Signals.depth == 0


def test_a_failure_without_a_stop_stays_a_failure(handler, monkeypatch):
    world(monkeypatch, 2)
    monkeypatch.setattr(run_writer, "STOP_WAIT_S", 0.05)
    with pytest.raises(RuntimeError, match="Connection reset"):
        with critical_section():
            raise RuntimeError("Connection reset by peer")
    world(monkeypatch, 1)                   # one process never waits: its failure is its own
    run_writer._Signals.pending = signal.SIGTERM
    with pytest.raises(ValueError):
        with critical_section():
            raise ValueError("non-finite loss")
    assert run_writer._Signals.depth == 0
