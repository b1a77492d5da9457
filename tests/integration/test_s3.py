"""Runs in object storage, against a real S3-compatible server (moto's server mode on 127.0.0.1):
written and read with the same API, a reader polling while a writer commits, kill -9 of the
writer, and one-line refusals (no credentials, unreachable endpoint, missing bucket)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore", reason="obstore not installed (pip install dyntool[scale])")
moto_server = pytest.importorskip("moto.server", reason="moto[server] not installed")

from dyntool.cli import main  # noqa: E402
from dyntool.errors import RunError  # noqa: E402
from dyntool.run import open_run  # noqa: E402
from dyntool.run_writer import RunWriter  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUCKET = "dyntool-runs"
SECRET = "s3cr3t-never-logged"


@pytest.fixture(scope="module")
def s3():
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import boto3
    boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=BUCKET)
    yield env
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    srv.stop()


def _values(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"attn": rng.random((1, 2, 1, 4, 4), dtype=np.float32),
            "logit_max": rng.random((1, 2), dtype=np.float32)}


WRITER = textwrap.dedent("""
    import sys, time, numpy as np
    sys.path.insert(0, {repo!r})
    from dyntool.run_writer import RunWriter
    from tests.integration.test_s3 import _values
    with RunWriter.create({url!r}, "synthetic", {{"n": 1}}, name="live") as run:
        st = run.open_store(chunk_steps=2, flush_seconds=0.05)
        for step in range(10_000):
            st.append(step, _values(step))
            run.log(step, loss=1.0 / (step + 1))
            time.sleep(0.02)
""")


def test_write_read_info_check_xarray(s3, capsys):
    url = f"s3://{BUCKET}/runs"
    with RunWriter.create(url, "synthetic", {"n": 1}, name="r1") as run:
        st = run.open_store(chunk_steps=2, flush_seconds=0)
        for step in range(5):
            st.append(step * 3, _values(step))
            run.log(step * 3, loss=float(step))
    r = open_run(f"{url}/r1")
    assert r.status == "finished" and not r.problems, r.problems
    assert list(r.steps) == [0, 3, 6, 9, 12] and list(r.metrics["loss"]) == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(r.arrays["attn"][:], np.stack([_values(s)["attn"] for s in range(5)]))
    assert r.to_xarray()["attn"].sizes["step"] == 5
    assert main(["check", f"{url}/r1"]) == 0
    assert main(["info", f"{url}/r1"]) == 0
    out = capsys.readouterr().out
    assert "5 steps committed" in out and SECRET not in out
    with pytest.raises(RunError, match="already exists"):          # never overwritten
        RunWriter.create(url, "synthetic", {}, name="r1")


def test_damaged_run_files_read_the_same_from_object_storage_as_from_disk(s3, tmp_path):
    """meta.json nested past the limit (json.loads alone raises RecursionError), config.json not an
    object, metrics.jsonl with a boolean step, a negative step and a non-JSON line: both readers
    report the same problems and keep the same rows."""
    import boto3
    files = {"meta.json": b"[" * 5000, "config.json": b"[1, 2]",
             "metrics.jsonl": b'{"step": 0, "loss": 1.0}\n{"step": true}\n{"step": -1}\nnot json\n'
                              b'{"step": 2, "loss": 0.5, "big": 99999999999999999999}\n'}
    local = tmp_path / "damaged"
    local.mkdir()
    client = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    for name, data in files.items():
        (local / name).write_bytes(data)
        client.put_object(Bucket=BUCKET, Key=f"damaged/{name}", Body=data)
    for name, data in (("meta.json", b'{"kind": "synthetic"}'),):   # a run needs one readable file to open
        (local / name).write_bytes(data)
        client.put_object(Bucket=BUCKET, Key=f"damaged/{name}", Body=data)
    a, b = open_run(str(local)), open_run(f"s3://{BUCKET}/damaged")
    for r in (a, b):
        assert list(r.metrics["step"]) == [0, 2] and r.metrics["big"].dtype == np.float64
        assert any("config.json holds a list" in p for p in r.problems), r.problems
        assert any("3 malformed line(s)" in p and "first at line 2" in p for p in r.problems), r.problems
    for name, data in (("meta.json", files["meta.json"]), ("config.json", b'{"n": 1}')):
        (local / name).write_bytes(data)
        client.put_object(Bucket=BUCKET, Key=f"damaged/{name}", Body=data)
    for r in (open_run(str(local)), open_run(f"s3://{BUCKET}/damaged")):
        assert any("meta.json is corrupted" in p and "nests deeper" in p for p in r.problems), r.problems


def test_reader_polls_while_writing_and_kill_9_keeps_committed_steps(s3):
    url = f"s3://{BUCKET}/live-runs"
    code = WRITER.format(repo=str(REPO), url=url)
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, deadline = [], time.time() + 120
    try:
        while time.time() < deadline and (not seen or seen[-1] < 12):
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            try:
                r = open_run(f"{url}/live")
            except RunError:
                time.sleep(0.05)
                continue
            n = r.steps_written
            if n:                                  # every committed row reads back exactly
                np.testing.assert_array_equal(r.arrays["attn"][n - 1], _values(n - 1)["attn"])
                assert list(r.steps) == list(range(n))
            seen.append(n)
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert seen[-1] >= 12 and len(set(seen)) > 2, seen           # watched it grow
    r = open_run(f"{url}/live")
    assert r.status == "running" and not r.check(full=True), r.problems
    n = r.steps_written
    assert n >= seen[-1]
    np.testing.assert_array_equal(r.arrays["attn"][:], np.stack([_values(s)["attn"] for s in range(n)]))


def test_bad_object_store_input_is_one_line_and_writes_nothing(s3, monkeypatch, capsys):
    import boto3
    with pytest.raises(RunError, match="no-such-bucket.*can't be written"):
        RunWriter.create("s3://no-such-bucket/x", "synthetic", {}, name="r")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")            # nothing listens there
    t0 = time.time()
    with pytest.raises(RunError) as e:
        RunWriter.create(f"s3://{BUCKET}/unreachable", "synthetic", {}, name="r")
    assert "\n" not in str(e.value) and SECRET not in str(e.value) and time.time() - t0 < 30
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["AWS_ENDPOINT_URL"])
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert main(["info", f"s3://{BUCKET}/runs/r1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "AWS_SECRET_ACCESS_KEY" in err[0]
    keys = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"], aws_secret_access_key=SECRET,
                        aws_access_key_id="testing").list_objects_v2(Bucket=BUCKET).get("Contents", [])
    assert not any(k["Key"].startswith("unreachable") for k in keys)


def test_app_reads_a_live_remote_run_up_to_its_growing_marker(s3):
    """The app's marker of an s3:// run follows the writer (its reader cache is bounded at a marker;
    the marker itself is read afresh once its 3 s signature changes)."""
    from tests.app.fixtures import load_app_package
    data = load_app_package().data
    url = f"s3://{BUCKET}/live-app"
    run = RunWriter.create(url, "synthetic", {"n": 1}, name="r")
    st = run.open_store(chunk_steps=1, flush_seconds=0)
    for step in range(2):
        st.append(step, _values(step))
    st.flush()
    assert data._marker(f"{url}/r", ("t0",)) == 2
    for step in range(2, 5):
        st.append(step, _values(step))
    st.flush()
    assert data._marker(f"{url}/r", ("t1",)) == 5            # a new 3 s window: the new marker
    assert data.reader(f"{url}/r", 5).steps_written == 5
    run.finish()
