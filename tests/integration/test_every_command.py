"""Every command on every kind of run (issue "every command on every kind of run").

Two runs are trained locally, one by a single process and one by two FSDP ranks (each rank its own
``record.rank{r}.zarr``); each is then copied byte for byte to the local S3 server (moto) and to a
``file://`` folder.  On every copy, ``ls``, ``info``, ``check``, ``export``, ``figures`` and the
Python API (``open_run``, ``to_xarray(chunks="record")``, :mod:`dyntool.scale`) must give the local
run's answer: the same ``ls`` row and ``info`` lines apart from location and size, the same exported
bytes, the same figure data files and captions.  A run written to S3 *by* two ranks is checked
against its local twin too.  No command may create a local path from a URL, and every refusal
(unreachable endpoint, wrong bucket, bad credentials, a rank's record missing or damaged) is one
line, exit 2 or 1, within 30 s.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore", reason="obstore not installed (pip install dyntool[scale])")
pytest.importorskip("moto.server", reason="moto[server] not installed")
pytest.importorskip("xarray", reason="xarray not installed (pip install dyntool[export])")

from dyntool.cli import main  # noqa: E402
from dyntool.run import list_runs, open_run  # noqa: E402
from tests.integration.test_fsdp import ARGS, finish  # noqa: E402
from tests.integration.test_s3 import BUCKET, s3  # noqa: E402,F401  (the moto fixture)
from tests.integration.test_s3_train import torchrun  # noqa: E402

STEPS = 6
TRAIN = [*ARGS, "--max-steps", str(STEPS)]
FIGS = "recorded_attn,recorded_head_stats,recorded_score_grad"


def _upload(env, folder: Path, prefix: str) -> None:
    import boto3
    c = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            c.upload_file(str(f), BUCKET, f"{prefix}/{f.relative_to(folder.parent).as_posix()}")


@pytest.fixture(scope="module")
def kinds(s3, tmp_path_factory):
    """kind -> (location of the run, location of its parent folder, the local twin's run path)."""
    base = tmp_path_factory.mktemp("every")
    local = base / "local"
    assert main(["train", *TRAIN, "--data.batch_size=4", "--out", str(local), "--name", "one"]) == 0
    finish(torchrun(*TRAIN, "--data.batch_size=2", "--parallel=fsdp", "--out", str(local), "--name", "two"))
    finish(torchrun(*TRAIN, "--data.batch_size=2", "--parallel=fsdp", "--out", f"s3://{BUCKET}/written",
                    "--name", "two"))
    copies = base / "filecopy"
    shutil.copytree(local, copies)
    out = {}
    for name in ("one", "two"):
        _upload(s3, local / name, "copies")
        out[f"local-{name}"] = (str(local / name), str(local), local / name)
        out[f"s3-{name}"] = (f"s3://{BUCKET}/copies/{name}", f"s3://{BUCKET}/copies", local / name)
        out[f"file-{name}"] = (f"file://{copies / name}", f"file://{copies}", local / name)
    out["s3-written-by-two-ranks"] = (f"s3://{BUCKET}/written/two", f"s3://{BUCKET}/written", local / "two")
    return out


COPIES = ["s3-one", "s3-two", "file-one", "file-two"]
EVERY = ["local-one", "local-two", *COPIES, "s3-written-by-two-ranks"]


@pytest.fixture
def in_empty_cwd(tmp_path, monkeypatch):
    """Each command runs in an empty folder, which must stay empty (no local path made from a URL)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert list(cwd.iterdir()) == [], f"a command created {list(cwd.iterdir())} in the working folder"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def _ls_row(out: str, run_name: str) -> list[str]:
    rows = [line.split() for line in out.splitlines()[1:] if line.split()]
    row = next(r for r in rows if r[0] == run_name)
    return row[:5] + row[7:]                      # ID KIND STATUS STEPS RECORDED, TAGS (not SIZE)


def _info(out: str) -> list[str]:
    """info's lines without the location and sizes on disk."""
    keep = []
    for line in out.splitlines():
        if line.startswith("run "):
            continue
        if line.startswith("record "):
            line = line.split(",")[0]
        keep.append(line)
    return keep


@pytest.mark.parametrize("kind", EVERY)
def test_ls_info_check_answer_as_the_local_run(kinds, kind, capsys, in_empty_cwd):
    where, parent, twin = kinds[kind]
    rc, out, err = run_cli(capsys, "ls", parent)
    rc0, out0, _ = run_cli(capsys, "ls", twin.parent)
    assert rc == rc0 == 0, err
    assert _ls_row(out, Path(str(where)).name) == _ls_row(out0, twin.name)
    rc, out, err = run_cli(capsys, "info", where)
    _, out0, _ = run_cli(capsys, "info", twin)
    assert rc == 0 and err == "", err
    if kind == "s3-written-by-two-ranks":             # another training: its times differ, nothing else
        timed = ("created ", "updated ", "final ")
        assert [ln for ln in _info(out) if not ln.startswith(timed)] == \
               [ln for ln in _info(out0) if not ln.startswith(timed)]
    else:
        assert _info(out) == _info(out0)
    rc, out, err = run_cli(capsys, "check", where)
    assert rc == 0 and ": ok (" in out and "problem" not in out, out + err
    rc, out, _ = run_cli(capsys, "check", parent)
    n = len(list_runs(parent))
    assert rc == 0 and out.count(": ok (") == n >= 1 and "problem" not in out, out


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("kind", COPIES)
def test_export_and_figures_of_a_copy_are_byte_identical(kinds, kind, capsys, in_empty_cwd, tmp_path):
    where, _, twin = kinds[kind]
    for src, dest in ((where, tmp_path / "exp"), (twin, tmp_path / "exp0")):
        rc, _, err = run_cli(capsys, "export", src, "--to", dest, "--format", "csv,parquet,npz")
        assert rc == 0, err
    a, b = tmp_path / "exp", tmp_path / "exp0"
    assert {k: v for k, v in _digest(a).items() if k != "arrays.npz"} == \
           {k: v for k, v in _digest(b).items() if k != "arrays.npz"}
    with np.load(a / "arrays.npz") as x, np.load(b / "arrays.npz") as y:      # zip entries carry a time
        assert sorted(x.files) == sorted(y.files)
        for n in x.files:
            np.testing.assert_array_equal(x[n], y[n], err_msg=n)
    for src, dest in ((where, tmp_path / "fig"), (twin, tmp_path / "fig0")):
        rc, out, err = run_cli(capsys, "figures", src, "--out", dest, "--only", FIGS, "--format", "png",
                               "--dpi", "40")
        assert rc == 0 and "3 figure(s) written" in out, out + err
    data = lambda d: {k: v for k, v in _digest(d).items() if not k.endswith(".png")}   # noqa: E731
    assert data(tmp_path / "fig") == data(tmp_path / "fig0")


def test_a_run_written_by_two_ranks_to_s3_exports_the_local_twins_arrays(kinds, capsys, in_empty_cwd, tmp_path):
    where, _, twin = kinds["s3-written-by-two-ranks"]
    for src, dest in ((where, tmp_path / "exp"), (twin, tmp_path / "exp0")):
        rc, _, err = run_cli(capsys, "export", src, "--to", dest, "--format", "npz")
        assert rc == 0, err
    with np.load(tmp_path / "exp" / "arrays.npz") as x, np.load(tmp_path / "exp0" / "arrays.npz") as y:
        assert sorted(x.files) == sorted(y.files) and "attn" in x.files
        for n in x.files:
            np.testing.assert_array_equal(x[n], y[n], err_msg=n)


@pytest.mark.parametrize("kind", ["s3-two", "file-two", "s3-written-by-two-ranks"])
def test_python_api_to_xarray_and_scale(kinds, kind, in_empty_cwd):
    import dyntool
    from dyntool import scale
    pytest.importorskip("dask", reason="dask not installed (pip install dyntool[scale])")
    where, _, twin = kinds[kind]
    r, r0 = dyntool.open_run(where), dyntool.open_run(twin)
    assert r.store.__class__.__name__ == "RankedStore" and r.meta["world_size"] == 2
    ds, ds0 = r.to_xarray(chunks="record"), r0.to_xarray(chunks="record")
    assert sorted(ds.data_vars) == sorted(ds0.data_vars)
    np.testing.assert_array_equal(ds["attn"].values, ds0["attn"].values)
    np.testing.assert_allclose(scale.routing_residual(ds).compute().values,
                               scale.routing_residual(ds0).compute().values, rtol=0, atol=0)
    listed = dyntool.list_runs(str(where).rsplit("/", 1)[0])
    assert str(where) in [str(x.path) for x in listed]


# -- refusals -------------------------------------------------------------------------------------

def _refused(capsys, *argv, within: float = 30.0) -> str:
    t0 = time.monotonic()
    rc, out, err = run_cli(capsys, *argv)
    took = time.monotonic() - t0
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dyntool: error:") and "Traceback" not in err, err
    assert took < within, f"{argv} took {took:.0f} s"
    return lines[0]


COMMANDS = [("ls", "{parent}"), ("info", "{run}"), ("check", "{run}"),
            ("export", "{run}", "--to", "{tmp}/x"), ("figures", "{run}", "--out", "{tmp}/f"),
            ("app", "{parent}"), ("train", "--resume", "{run}")]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_unreachable_endpoint_wrong_bucket_and_missing_credentials_are_one_line(cmd, s3, capsys, monkeypatch,
                                                                            in_empty_cwd, tmp_path):
    def argv(url_parent):
        return [a.format(parent=url_parent, run=f"{url_parent}/one", tmp=tmp_path) for a in cmd]
    msg = _refused(capsys, *argv("s3://no-such-bucket-here/copies"))
    assert "no-such-bucket-here" in msg and "Traceback" not in msg
    with monkeypatch.context() as m:                   # moto accepts any key, so: none at all
        m.delenv("AWS_SECRET_ACCESS_KEY")
        assert "AWS_SECRET_ACCESS_KEY" in _refused(capsys, *argv(f"s3://{BUCKET}/copies"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")       # the discard port: nothing listens
    _refused(capsys, *argv(f"s3://{BUCKET}/copies"))
    assert not (tmp_path / "x").exists() and not (tmp_path / "f").exists()


def test_a_missing_or_damaged_rank_record_is_named_by_every_command(kinds, s3, capsys, in_empty_cwd, tmp_path):
    import boto3
    c = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    src = kinds["local-two"][2]
    _upload(s3, src, "gone")                              # rank 1's record deleted
    for k in c.list_objects_v2(Bucket=BUCKET, Prefix="gone/two/record.rank1.zarr")["Contents"]:
        c.delete_object(Bucket=BUCKET, Key=k["Key"])
    _upload(s3, src, "broken")                            # rank 1's attn metadata damaged
    c.put_object(Bucket=BUCKET, Key="broken/two/record.rank1.zarr/attn/zarr.json", Body=b"{not json")
    _upload(s3, src, "norank0")                           # rank 0's record deleted
    for k in c.list_objects_v2(Bucket=BUCKET, Prefix="norank0/two/record.zarr/")["Contents"]:
        c.delete_object(Bucket=BUCKET, Key=k["Key"])
    local = tmp_path / "norank0"                          # the same, in a local folder
    shutil.copytree(src, local / "two")
    shutil.rmtree(local / "two" / "record.zarr")
    shutil.copytree(src, tmp_path / "noarray" / "two")   # one rank's array folder deleted: never silent
    shutil.rmtree(tmp_path / "noarray" / "two" / "record.rank1.zarr" / "attn")
    for where, says in ((f"s3://{BUCKET}/gone/two", "rank 1"), (f"s3://{BUCKET}/broken/two", "attn"),
                        (f"s3://{BUCKET}/norank0/two", "record.rank1.zarr"), (local / "two", "record.rank1.zarr"),
                        (tmp_path / "noarray" / "two", "array attn: not readable on rank(s) [1]")):
        rc, out, err = run_cli(capsys, "check", where)
        assert rc == 1 and says in out, (where, out, err)
        rc, out, err = run_cli(capsys, "info", where)
        assert rc == 0 and "problem" in out and says in out, (where, out)
        rc, out, err = run_cli(capsys, "export", where, "--to", tmp_path / f"e{abs(hash(str(where)))}",
                               "--format", "npz")
        assert rc in (0, 2) and "Traceback" not in err, err
        lines = err.strip().splitlines()                   # what was not read is said, in one line
        assert len(lines) == 1 and says in lines[0], (where, rc, err)


def test_writers_make_no_local_path_from_a_url_and_refuse_what_they_do_not_serve(s3, capsys, in_empty_cwd):
    rc, out, err = run_cli(capsys, "sim", "toy", "--out", f"s3://{BUCKET}/sims", "--name", "t", "--steps", "3",
                           "--quiet")
    assert rc == 0 and f"s3://{BUCKET}/sims/t" in out, err
    assert open_run(f"s3://{BUCKET}/sims/t").steps_written > 0
    for argv, says in ((["sim", "sticky-markov", "--out", f"s3://{BUCKET}/sims", "--quiet"], "local folder"),
                       (["sim", "toy", "--out", "gs://bucket/runs"], "gs://"),
                       (["train", "--out", "gs://bucket/runs"], "gs://"),
                       (["ls", "gs://bucket/runs"], "gs://"),
                       (["ls", ""], "empty"), (["info", ""], "empty"), (["check", ""], "empty"),
                       (["figures", f"s3://{BUCKET}/sims/t", "--out", f"s3://{BUCKET}/figs"], "local folder"),
                       (["export", f"s3://{BUCKET}/sims/t", "--to", f"s3://{BUCKET}/exp"], "local folder"),
                       (["sim", "toy", "--out", "~no-such-user-here/x"], "no such user"),
                       (["ls", f"s3://{BUCKET}/../{BUCKET}/sims"], "'..'"),
                       (["ls", f"s3://{BUCKET}/no-such-prefix"], "does not exist"),
                       (["check", f"s3://{BUCKET}/no-such-prefix"], "does not exist"),
                       # the server's own code and message, through the real client (was cut at its XML)
                       (["sim", "toy", "--out", "s3://no-such-bucket-here/runs"],
                        "NoSuchBucket: The specified bucket does not exist"),
                       (["train", "--resume", "gs://bucket/run"], "gs://")):
        assert says in _refused(capsys, *argv), argv


def test_a_huge_declared_shape_in_object_storage_is_refused_quickly(kinds, s3, capsys, in_empty_cwd):
    import json

    import boto3
    c = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    _upload(s3, kinds["local-one"][2], "huge")
    key = "huge/one/record.zarr/attn/zarr.json"
    meta = json.loads(c.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    meta["shape"] = [meta["shape"][0]] + [10**6] * (len(meta["shape"]) - 1)
    c.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(meta).encode())
    for cmd in ("info", "check"):
        t0 = time.monotonic()
        rc, out, err = run_cli(capsys, cmd, f"s3://{BUCKET}/huge/one")
        assert time.monotonic() - t0 < 30 and "array attn" in out and "not read" in out, (cmd, out, err)


def test_a_reader_never_creates_a_file_url_folder(capsys, in_empty_cwd, tmp_path):
    """Reading ``file://`` runs goes through the object store, which made any folder it was asked
    about: a mistyped URL must be a one-line error that leaves the disk as it was."""
    gone = tmp_path / "typo" / "deep"
    for cmd in (["info", f"file://{gone}/run"], ["check", f"file://{gone}/run"], ["ls", f"file://{gone}"],
                ["figures", f"file://{gone}/run", "--out", str(tmp_path / "f")]):
        assert "does not exist" in _refused(capsys, *cmd), cmd
    assert not (tmp_path / "typo").exists() and not (tmp_path / "f").exists()
    rc, out, err = run_cli(capsys, "info", "file:///")          # the root is a folder of runs, not a crash
    assert rc in (0, 2) and "internal error" not in err, err


def test_a_damaged_run_in_object_storage_is_listed_as_corrupt_not_fatal(kinds, s3, capsys, in_empty_cwd):
    import boto3
    c = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"])
    _upload(s3, kinds["local-one"][2], "mixed")
    c.put_object(Bucket=BUCKET, Key="mixed/bad/meta.json", Body=b"{not json")
    c.put_object(Bucket=BUCKET, Key="mixed/empty/meta.json", Body=b"{}")
    rc, out, err = run_cli(capsys, "ls", f"s3://{BUCKET}/mixed")
    rows = {line.split()[0]: line.split()[2] for line in out.splitlines()[1:] if line.split()[:1] in (["one"], ["bad"], ["empty"])}
    assert rc == 0 and rows["one"] == "finished" and rows["bad"] == "corrupt", out + err
    rc, out, err = run_cli(capsys, "check", f"s3://{BUCKET}/mixed")
    assert rc == 1 and f"s3://{BUCKET}/mixed/one: ok (" in out and "meta.json is corrupted" in out, out + err
