"""Object storage under faults and misuse (issue 50 items 7-11), against the local S3 server of
``test_s3.py``: each a one-line refusal or a reported problem, nothing recorded changed."""
from __future__ import annotations

import pytest

from tests.integration.test_s3 import BUCKET, s3  # noqa: F401  (the module's local S3 server)

from dyntool.cli import main  # noqa: E402


def _objects(s3env) -> dict[str, str]:
    import boto3
    c = boto3.client("s3", endpoint_url=s3env["AWS_ENDPOINT_URL"])
    return {o["Key"]: o["ETag"] for o in c.list_objects_v2(Bucket=BUCKET).get("Contents", [])}


@pytest.mark.parametrize("below", ["", "/record.zarr", "/record.zarr/attn"])
def test_a_new_run_inside_a_run_on_s3_is_refused(s3, capsys, below):   # noqa: F811
    """Item 8: ``--out s3://bkt/runs/base`` (or below it) exited 0 and the second one made the
    healthy run corrupt; locally both are refused.  Now the same one line, exit 2, no object
    written, and the base run still checks ok."""
    base = f"s3://{BUCKET}/nest/base"
    if not any(k.startswith("nest/base/") for k in _objects(s3)):
        assert main(["sim", "toy", "--steps", "3", "--out", f"s3://{BUCKET}/nest", "--name", "base", "--quiet"]) == 0
    before = _objects(s3)
    capsys.readouterr()
    assert main(["sim", "toy", "--steps", "3", "--out", base + below, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"is inside the run {base}; runs are never written into" in err[0], err
    assert _objects(s3) == before
    assert main(["check", base]) == 0


def test_a_finished_remote_run_missing_its_record_metadata_is_a_problem(s3, capsys):   # noqa: F811
    """Item 9 on S3: a deleted ``record.zarr/zarr.json`` gave "ok (0 steps committed)" (locally
    reported); the finished run's step count now holds it, and a cut metrics.jsonl too."""
    import boto3
    assert main(["sim", "toy", "--steps", "3", "--out", f"s3://{BUCKET}/held", "--name", "r", "--quiet"]) == 0
    url = f"s3://{BUCKET}/held/r"
    assert main(["check", url]) == 0
    c = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    c.delete_object(Bucket=BUCKET, Key="held/r/record.zarr/zarr.json")
    rows = c.get_object(Bucket=BUCKET, Key="held/r/metrics.jsonl")["Body"].read().splitlines(keepends=True)
    c.put_object(Bucket=BUCKET, Key="held/r/metrics.jsonl", Body=b"".join(rows[:1]))
    capsys.readouterr()
    assert main(["check", url]) == 1
    out = capsys.readouterr().out
    assert "the finished run wrote 3 (deleted, or a commit marker lowered, since)" in out, out
    assert "metrics.jsonl holds 1 rows; the finished run wrote 3" in out, out


class FlakyProxy:
    """A TCP forwarder to the local S3 server that can go down (its port refuses connections, as
    a restarting endpoint's does) and come back on the same port."""

    def __init__(self, target: str):
        import socket
        import threading
        host, port = target.rsplit("//", 1)[-1].split(":")
        self.target = (host, int(port))
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.sock = None
        self.open: list = []                 # live connections: dropped too when it goes down
        self.up()

    def up(self) -> None:
        import socket
        import threading
        with self.lock:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.port))
            s.listen(64)
            self.sock = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def down(self) -> None:
        import socket
        with self.lock:
            try:                             # wakes the thread blocked in accept(): close alone
                self.sock.shutdown(socket.SHUT_RDWR)     # would leave the port listening
            except OSError:
                pass
            self.sock.close()
            for c in self.open:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.open = []

    def _accept(self, s) -> None:
        import socket
        import threading
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            with self.lock:
                self.open += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def cut(self, data: bytes) -> bool:
        """Whether to drop the connection instead of passing ``data`` on (a subclass's trigger)."""
        return False

    def _pipe(self, a, b) -> None:
        try:
            while data := a.recv(65536):
                if self.cut(data):
                    return
                b.sendall(data)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(2)
                except OSError:
                    pass


def test_a_writer_rides_out_a_four_second_outage(s3, monkeypatch):   # noqa: F811
    """Item 7: obstore's 2 retries were spent in 0.24 s on "connection refused", so a 4-second blip
    killed ``sim toy`` and ``train``.  A PUT issued while the endpoint is down succeeds once it is
    back (bounded backoff), and the object is there."""
    import threading
    import time

    import boto3

    from dyntool.storage.remote import Remote
    proxy = FlakyProxy(s3["AWS_ENDPOINT_URL"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    remote = Remote(f"s3://{BUCKET}/blip")          # the endpoint answered once: the probe passed
    proxy.down()
    threading.Timer(4.0, proxy.up).start()
    t0 = time.monotonic()
    remote.put("obj", b"kept")
    took = time.monotonic() - t0
    assert 3.5 < took < 30, took
    c = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    assert c.get_object(Bucket=BUCKET, Key="blip/obj")["Body"].read() == b"kept"


@pytest.mark.parametrize("argv", [["ls", "s3://{b}/x"],
                                  pytest.param(["sim", "toy", "--steps", "2", "--out", "s3://{b}/x"],
                                               marks=pytest.mark.slow)],    # the same probe, 8 s more
                         ids=["ls", "sim-toy"])
def test_a_silent_endpoint_is_refused_in_under_30_s(s3, monkeypatch, capsys, argv):   # noqa: F811
    """Item 7: an endpoint that accepts connections and never answers was refused after 30.6-35 s
    (writers 33-59 s); now one line, exit 2, well under 30 s."""
    import socket
    import time
    from dyntool.storage import remote
    monkeypatch.setattr(remote, "_ANSWERED", set(), raising=False)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        t0 = time.monotonic()
        rc = main([a.format(b=BUCKET) for a in argv])
        took = time.monotonic() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "can't be reached" in err[0], err
    assert took < 20, took


def test_a_writer_whose_endpoint_stays_down_fails_in_one_line(s3, monkeypatch):   # noqa: F811
    """Item 7: past the retries, a simulation's writer died with ``internal error: RuntimeError:
    recording writer failed`` and a 37-line Rust debug dump.  Now one line (a StorageError, exit 1
    through the CLI) saying what was kept.  (The ride-out is shortened to 2 s here.)"""
    import numpy as np

    from dyntool.errors import StorageError
    from dyntool.run_writer import RunWriter
    from dyntool.storage import remote
    monkeypatch.setenv("DYNTOOL_S3_RIDE_OUT", "2")
    monkeypatch.setattr(remote, "_DOWN", set())
    proxy = FlakyProxy(s3["AWS_ENDPOINT_URL"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    run = RunWriter.create(f"s3://{BUCKET}/down", "synthetic", {"n": 1}, name="r")
    st = run.open_store(chunk_steps=1, flush_seconds=0)
    st.append(0, {"x": np.zeros(3, np.float32)})
    st.flush()
    proxy.down()
    with pytest.raises(StorageError) as e:
        st.append(1, {"x": np.ones(3, np.float32)})
        st.flush()
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 500 and msg.startswith("recording writer failed: "), msg
    assert "what was committed before is kept" in msg and e.value.exit_code == 1
    assert remote._DOWN                            # later requests try once, quickly
    proxy.up()
    remote.Remote(f"s3://{BUCKET}/down").put("after", b"1")
    assert not remote._DOWN                        # it answers: the next outage is ridden out again


def test_export_of_a_remote_run_missing_a_chunk_is_refused_as_locally(s3, tmp_path, capsys):   # noqa: F811
    """Item 11: ``export`` of a remote run with a missing chunk exited 0 with the array filled in
    (locally exit 2).  Now exit 2, one line, nothing written; the other arrays still export."""
    import boto3
    assert main(["sim", "toy", "--steps", "3", "--record.arrays=attn,compat", "--out", f"s3://{BUCKET}/exp",
                 "--name", "r", "--quiet"]) == 0          # two arrays: each is a round of requests
    c = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    chunk = next(o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix="exp/r/record.zarr/attn/c/")["Contents"])
    c.delete_object(Bucket=BUCKET, Key=chunk)
    capsys.readouterr()
    assert main(["export", f"s3://{BUCKET}/exp/r", "--to", str(tmp_path / "out"), "--format", "npz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "array attn: chunk" in err[0] and "is missing" in err[0] and "nothing exported" in err[0], err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert main(["export", f"s3://{BUCKET}/exp/r", "--to", str(tmp_path / "ok"), "--format", "npz",
                 "--arrays", "compat"]) == 0


def _requests(caplog) -> list[str]:
    """The request lines the local S3 server logged ("GET /bucket?list-type=2&... HTTP/1.1")."""
    return [r.getMessage().split('"')[1] for r in caplog.records
            if r.name == "werkzeug" and r.getMessage().count('"') >= 2]


def test_ls_of_a_folder_of_runs_lists_once_not_once_per_run(s3, caplog, capsys):   # noqa: F811
    """Issue 51: ``ls s3://…`` opened a backend to list, then one per run, asking ``is_run`` twice
    (a LIST each).  Now one backend is opened and its listing yields the runs' backends: the LIST
    requests do not grow with the number of runs (the GETs of each run's files do)."""
    import logging

    import boto3
    import numpy as np

    from dyntool.run_writer import RunWriter
    with RunWriter.create(f"s3://{BUCKET}/many/src", "synthetic", {"n": 1}, name="r0") as w:
        st = w.open_store(chunk_steps=1, flush_seconds=0)
        for step in range(3):                     # three chunks of each array: each checked by `ls`
            st.append(step, {"x": np.full(4, step, np.float32), "y": np.zeros(2, np.float32)})
            w.log(step, loss=1.0)
    c = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix="many/src/r0/")["Contents"]]
    counts = {}
    for n in (1, 4):
        for i in range(n):                        # byte copies of one run, in two study-like folders
            for k in keys:
                c.copy_object(Bucket=BUCKET, Key=k.replace("many/src/r0/", f"many/n{n}/s{i % 2}/r{i}/"),
                              CopySource={"Bucket": BUCKET, "Key": k})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="werkzeug"):
            assert main(["ls", f"s3://{BUCKET}/many/n{n}"]) == 0
        out = capsys.readouterr().out
        assert out.count("finished") == n, out
        reqs = _requests(caplog)
        counts[n] = sum("list-type=2" in r for r in reqs)
        assert reqs, "the server's request log was not captured"
    assert counts[1] == counts[4] == 1, counts              # was 2 + 2 per run, and a LIST per array
    c.delete_object(Bucket=BUCKET, Key="many/n4/s1/r3/record.zarr/x/c/1/0")
    assert main(["ls", f"s3://{BUCKET}/many/n4"]) == 0      # the listing's chunks are what is checked
    out = capsys.readouterr().out
    assert out.count("finished") == 3 and "s1/r3" in out and "1 corrupt run(s)" in out, out

