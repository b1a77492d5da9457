"""``dyntool train --out s3://…`` against moto's S3 server: a single-process run and an FSDP run
(2 ranks on CPU, each rank writing its own ``record.rank{r}.zarr`` into the S3 run) equal the same
runs written locally; kill -9 of torchrun and both ranks leaves every rank's committed steps
readable and the run resumes from its S3 checkpoint; bad input is one line, exit 2, and leaves no
object behind."""
from __future__ import annotations

import contextlib
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("obstore", reason="obstore not installed (pip install dyntool[scale])")
pytest.importorskip("moto.server", reason="moto[server] not installed")

from dyntool.cli import main  # noqa: E402
from dyntool.errors import RunError  # noqa: E402
from dyntool.run import open_run  # noqa: E402
from tests.integration import test_fsdp  # noqa: E402
from tests.integration.test_fsdp import ARGS, _descendants, finish  # noqa: E402
from tests.integration.test_s3 import BUCKET, SECRET, s3  # noqa: E402,F401  (the moto fixture)

STEPS = 30
FSDP = [*ARGS, "--data.batch_size=2", "--parallel=fsdp", "--max-steps", str(STEPS)]


def torchrun(*args):
    """test_fsdp's torchrun, with the S3 variables the fixture set after that module was imported."""
    old = test_fsdp.ENV
    test_fsdp.ENV = {**old, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    try:
        return test_fsdp.torchrun(*args)
    finally:
        test_fsdp.ENV = old


def keys(env, prefix: str) -> list[str]:
    import boto3
    c = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                     aws_secret_access_key=SECRET)
    return [k["Key"] for k in c.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def same_record(a, b, n=None) -> None:
    assert a.store.names() == b.store.names()
    for name in b.store.names():
        np.testing.assert_array_equal(a.arrays[name][:n], b.arrays[name][:n], err_msg=name)


@pytest.fixture(scope="module")
def fsdp_runs(s3, tmp_path_factory):
    """The same FSDP training written to S3 and to a local folder."""
    local = tmp_path_factory.mktemp("fsdp-local")
    finish(torchrun(*FSDP, "--out", str(local), "--name", "ref"))
    finish(torchrun(*FSDP, "--out", f"s3://{BUCKET}/train", "--name", "ref"))
    return open_run(f"s3://{BUCKET}/train/ref"), open_run(local / "ref")


def test_single_process_train_to_s3_and_resume(s3, tmp_path, capsys):
    args = [*ARGS, "--data.batch_size=2", "--max-steps", "6"]
    assert main(["train", *args, "--out", f"s3://{BUCKET}/one", "--name", "r"]) == 0
    assert main(["train", *args, "--out", str(tmp_path), "--name", "r"]) == 0
    r, loc = open_run(f"s3://{BUCKET}/one/r"), open_run(tmp_path / "r")
    assert r.status == "finished" and not r.problems and not r.check(full=True), r.problems
    assert list(r.steps) == list(loc.steps) == [0, 2, 4, 5]
    same_record(r, loc)
    # (the last row, the validation after the last step, has no training loss: NaN in both)
    assert list(r.metrics["loss"].dropna()) == list(loc.metrics["loss"].dropna())
    assert list(r.metrics["step"]) == list(loc.metrics["step"])
    assert r.meta["final"]["param_sha256"] == loc.meta["final"]["param_sha256"]
    assert f"one/r/checkpoint.pt" in keys(s3, "one/r/")
    assert SECRET not in capsys.readouterr().err
    # resume from the S3 checkpoint into a new S3 run beside it
    assert main(["train", "--resume", f"s3://{BUCKET}/one/r", "--max-steps", "8", "--quiet"]) == 0
    rest = open_run(f"s3://{BUCKET}/one/r-resume6")
    assert rest.status == "finished" and rest.meta["resumed_from"] == {"run": f"s3://{BUCKET}/one/r", "step": 6}
    assert list(rest.steps) == [6, 7]


def test_fsdp_ranks_write_their_shards_to_s3(s3, fsdp_runs):
    r, loc = fsdp_runs
    assert r.status == "finished" and not r.problems and not r.check(full=True), r.problems
    assert r.meta["parallel"] == "fsdp" and len(r.store.ranks) == 2
    have = keys(s3, "train/ref/")
    assert "train/ref/record.zarr/zarr.json" in have and "train/ref/record.rank1.zarr/zarr.json" in have
    assert r.store.ranks[1].attrs["rank"] == 1 and r.arrays["attn"].shape[3] == 2
    assert list(r.steps) == list(loc.steps)
    same_record(r, loc)
    assert r.meta["final"]["param_sha256"] == loc.meta["final"]["param_sha256"]


@pytest.mark.slow                  # ~30 s of torchrun; the local FSDP kill -9 test is slow too
def test_fsdp_to_s3_kill_9_keeps_every_rank_committed_and_resumes(s3, fsdp_runs):
    ref = fsdp_runs[0]
    url = f"s3://{BUCKET}/killed"
    proc = torchrun(*FSDP, "--out", url, "--name", "k")
    deadline, n = time.time() + 180, 0
    try:
        while time.time() < deadline and n < 3:
            assert proc.poll() is None, proc.stderr.read()[-2000:]
            with contextlib.suppress(RunError):
                run = open_run(f"{url}/k")
                n = run.steps_written if run.store is not None else 0
            time.sleep(0.05)
    finally:
        for pid in [proc.pid, *_descendants(proc.pid)]:          # torchrun and both ranks
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert n >= 3
    run = open_run(f"{url}/k")
    assert run.status == "running" and not run.problems and not run.check(full=True), run.problems
    assert all(st.steps_written >= 3 for st in run.store.ranks)
    m = run.steps_written
    assert m < len(ref.steps)                                     # really killed mid-run
    same_record(run, ref, m)
    finish(torchrun("--resume", f"{url}/k", "--name", "rest", "--quiet"))
    rest = open_run(f"{url}/rest")
    assert rest.status == "finished" and not rest.problems
    assert rest.meta["final"]["param_sha256"] == ref.meta["final"]["param_sha256"]
    k = rest.steps_written
    np.testing.assert_array_equal(rest.arrays["attn"][:], ref.arrays["attn"][-k:])


@pytest.mark.parametrize("case", ["no-bucket", "no-credentials", "unreachable", "uneven-ranks", "over-budget"])
def test_bad_train_input_is_one_line_exit_2_and_writes_nothing(s3, monkeypatch, capsys, case):
    out, extra = f"s3://{BUCKET}/bad-{case}", []
    if case == "no-bucket":
        out = "s3://no-such-bucket/runs"
    elif case == "no-credentials":
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    elif case == "unreachable":
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")      # nothing listens there
    elif case == "uneven-ranks":                       # 3 probe sequences over 2 FSDP ranks
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "0")
        extra = ["--parallel=fsdp", "--record.seqs=3"]
    else:                                              # refused after the run was created
        extra = ["--record.disk_budget_gb=0.000001"]
    t0 = time.time()
    rc = main(["train", *ARGS, "--max-steps", "4", *extra, "--out", out, "--name", "r"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert SECRET not in err[0] and time.time() - t0 < 60
    want = {"no-bucket": "no-such-bucket", "no-credentials": "AWS_SECRET_ACCESS_KEY",
            "unreachable": "can't be reached", "uneven-ranks": "2 ranks", "over-budget": "disk_budget_gb"}
    assert want[case] in err[0], err[0]
    monkeypatch.undo()
    assert keys(s3, f"bad-{case}") == []
