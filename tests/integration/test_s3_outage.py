"""A whole command through an object-store outage (issue 50 item 7), against the local S3 server of
``test_s3.py`` behind a proxy that goes down on the run's first record chunk: a few seconds' outage
and the run completes as if nothing happened; a longer one (the ride-out shortened by
``DYNTOOL_S3_RIDE_OUT``) is one line, exit 1, naming what continues the run, and what was committed
before stays readable."""
from __future__ import annotations

import threading

import pytest

from tests.integration.test_s3 import BUCKET, s3  # noqa: F401  (the module's local S3 server)
from tests.integration.test_s3_hardening import FlakyProxy

from dyntool.cli import main  # noqa: E402
from dyntool.run import open_run  # noqa: E402

CHUNK = b"/record.zarr/step/c/"        # in a PUT's request line: a record chunk (every record has step)


class OutageProxy(FlakyProxy):
    """Goes down when the ``nth`` PUT naming ``trigger`` passes, for ``seconds`` (None: until
    :meth:`up` is called), so the outage falls in the middle of a run, wherever its timing lands."""

    def __init__(self, target: str, trigger: bytes, seconds: float | None, nth: int = 1):
        self.trigger, self.seconds, self.fired, self.left = trigger, seconds, threading.Event(), nth
        super().__init__(target)

    def cut(self, data: bytes) -> bool:
        line = data.split(b"\r\n", 1)[0]          # a request line (responses never start "PUT ")
        if line.startswith(b"PUT ") and self.trigger in line and not self.fired.is_set():
            self.left -= 1
        if self.left != 0 or self.fired.is_set():
            return False
        self.fired.set()
        self.down()                               # this request is cut too: it must be retried
        if self.seconds is not None:
            threading.Timer(self.seconds, self.up).start()
        return True


@pytest.fixture
def proxied(s3, monkeypatch):   # noqa: F811
    from dyntool.storage import remote
    monkeypatch.setattr(remote, "_DOWN", set())
    made = []

    def make(seconds, trigger=CHUNK, nth=1):
        p = OutageProxy(s3["AWS_ENDPOINT_URL"], trigger, seconds, nth)
        p.target_url = s3["AWS_ENDPOINT_URL"]
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.url)
        made.append(p)
        return p
    yield make
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["AWS_ENDPOINT_URL"])
    for p in made:
        if p.fired.is_set():
            try:
                p.up()
            except OSError:                       # already back up
                pass


def _gave_up(line: str) -> bool:
    """The record's chunk or a checkpoint could not be written past the 2 s ride-out (the first
    request to give up says "retried"; one made after it tried once, quickly)."""
    return "can't be written" in line and ("(retried for 2 s)" in line or "ride-out of 2 s" in line)


TOY = ["sim", "toy", "--steps", "12", "--record.chunk_steps=2", "--quiet"]


def test_sim_toy_rides_out_a_four_second_outage(proxied, capsys):
    """``sim toy`` was killed by a 4-second blip; now it waits the outage out and finishes, every
    step recorded and the run checks ok."""
    proxy = proxied(4.0)
    assert main([*TOY, "--out", f"s3://{BUCKET}/outage", "--name", "blip"]) == 0
    assert proxy.fired.is_set()                   # the outage did happen, mid-run
    url = f"s3://{BUCKET}/outage/blip"
    run = open_run(url)
    assert run.status == "finished" and run.steps_written == 12 and not run.problems, (run, run.problems)
    assert main(["check", url]) == 0


def test_sim_toy_past_the_ride_out_is_one_line(proxied, monkeypatch, capsys):
    """Past the ride-out a simulation's writer died with ``internal error: RuntimeError: recording
    writer failed`` and a 37-line Rust debug dump; now one line, exit 1, saying how the run goes on;
    what was committed before the outage stays readable once the store is back."""
    monkeypatch.setenv("DYNTOOL_S3_RIDE_OUT", "2")
    proxy = proxied(None)
    capsys.readouterr()
    assert main([*TOY, "--out", f"s3://{BUCKET}/outage", "--name", "down"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dyntool: error: "), err
    # the record's chunk, or a checkpoint written on the way out (then after one quick try)
    assert _gave_up(err[0]), err
    assert "retries" not in err[0], err                    # obstore's own count is not ours
    assert "dyntool ls" in err[0] or "--resume" in err[0], err       # how the run goes on
    assert "internal error" not in err[0] and len(err[0]) < 600, err
    proxy.up()
    run = open_run(f"s3://{BUCKET}/outage/down")
    assert run.steps_written < 12 and all("chunk" not in p for p in run.problems), run.problems


def test_a_bad_ride_out_setting_is_one_line(s3, monkeypatch, capsys):   # noqa: F811
    monkeypatch.setenv("DYNTOOL_S3_RIDE_OUT", "soon")
    capsys.readouterr()
    assert main([*TOY, "--out", f"s3://{BUCKET}/outage", "--name", "bad"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "DYNTOOL_S3_RIDE_OUT='soon'" in err[0], err


def _train(*extra):
    from tests.integration.test_fsdp import ARGS
    return main(["train", *ARGS, "--max-steps", "8", *extra])


@pytest.mark.slow                      # about a minute: three trainings (the sims above run by default)
def test_train_rides_out_a_four_second_outage_and_resumes_after_a_long_one(proxied, monkeypatch, capsys):
    """``train`` through a 4-second outage finishes; through one past the ride-out it stops with one
    line naming ``dyntool train --resume RUN``, and that command, once the store is back, finishes
    the run from its last checkpoint."""
    proxied(4.0)
    assert _train("--out", f"s3://{BUCKET}/outage", "--name", "tblip") == 0
    run = open_run(f"s3://{BUCKET}/outage/tblip")
    assert run.status == "finished" and run.steps_written == 5 and not run.problems, (run, run.problems)

    monkeypatch.setenv("DYNTOOL_S3_RIDE_OUT", "2")
    proxy = proxied(None, b"/checkpoint.pt", nth=2)          # down from the second checkpoint on
    capsys.readouterr()
    assert _train("--out", f"s3://{BUCKET}/outage", "--name", "tdown") == 1
    err = capsys.readouterr().err.strip().splitlines()
    url = f"s3://{BUCKET}/outage/tdown"
    assert len(err) == 1 and _gave_up(err[0]) and f"dyntool train --resume {url}" in err[0], err
    proxy.up()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.target_url)
    assert main(["train", "--resume", url, "--max-steps", "8", "--quiet"]) == 0
