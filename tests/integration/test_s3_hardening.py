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
