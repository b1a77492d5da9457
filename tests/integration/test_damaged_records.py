"""Damaged or foreign records that must read as *that run's* problem (issue 50 items 9-11): the
other runs list as usual, ``info`` says what is wrong, ``check`` exits 1, ``export`` exits 2 in
one line, and nothing is written."""
from __future__ import annotations

import shutil

import pytest
import zarr

from dyntool.cli import main

V2_LINE = "record.zarr is in zarr format 2; dyntool records (and reads) zarr format 3 only"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name in ("good", "v2"):
        assert main(["sim", "toy", "--steps", "3", "--out", str(root), "--name", name, "--quiet"]) == 0
    rec = root / "v2" / "record.zarr"            # the same arrays, rewritten in zarr format 2
    shutil.rmtree(rec)
    g = zarr.open_group(rec, mode="w", zarr_format=2)
    g.create_array("step", shape=(3,), dtype="i8")[:] = [0, 1, 2]
    g.create_array("attn", shape=(3, 1, 1, 5, 5), chunks=(1, 1, 1, 5, 5), dtype="f4")[:] = 0.2
    return root


def test_a_zarr_v2_record_is_that_runs_problem_in_ls_info_check_export(runs, tmp_path, capsys):
    """Item 10: was an internal error (``'ArrayV2Metadata' object has no attribute 'codecs'``) in
    all four, and ``ls`` of the folder listed no run at all."""
    capsys.readouterr()
    assert main(["ls", str(runs)]) == 0
    table = {ln.split()[0]: ln.split()[2] for ln in capsys.readouterr().out.splitlines()[1:] if ln.strip()
             and not ln.startswith("1 corrupt")}
    assert table == {"good": "finished", "v2": "corrupt"}, table
    assert main(["info", str(runs / "v2")]) == 0
    out = capsys.readouterr().out
    assert f"problem  {V2_LINE}" in out and "internal error" not in out
    assert main(["check", str(runs)]) == 1
    out = capsys.readouterr().out
    assert V2_LINE in out and "1 of 2 run(s) ok" in out
    assert main(["export", str(runs / "v2"), "--to", str(tmp_path / "out"), "--format", "npz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and V2_LINE in err[0], err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_app_lists_a_zarr_v2_run_as_corrupt(runs, monkeypatch):
    """Item 10: the app's Runs page raised; it lists both runs, the v2 one ``corrupt``."""
    from streamlit.testing.v1 import AppTest
    from tests.app import fixtures
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(runs))
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    status = dict(zip(table["id"] if "id" in table else table.iloc[:, 0], table["status"]))
    assert status == {"good": "finished", "v2": "corrupt"}, status


@pytest.mark.parametrize("damage, line", [
    ("cut", "metrics.jsonl holds 2 rows; the finished run wrote 4 (cut or deleted since)"),
    ("no-metrics", "metrics.jsonl holds 0 rows; the finished run wrote 4"),
    ("no-record", "record.zarr holds 0 committed steps; the finished run wrote 4"),
    ("marker", "record.zarr holds 1 committed steps; the finished run wrote 4")])
def test_a_finished_run_is_held_to_the_steps_it_wrote(tmp_path, capsys, damage, line):
    """Item 9: ``metrics.jsonl`` cut at a row boundary or deleted, ``record.zarr`` deleted, or its
    commit marker lowered, and ``check`` said ok (``info``: rows 0..1 against 4 steps).  A finished
    run's meta says what it wrote; ``check`` holds every file to it."""
    import json
    assert main(["sim", "toy", "--steps", "4", "--out", str(tmp_path), "--name", "r", "--quiet"]) == 0
    run = tmp_path / "r"
    assert json.loads((run / "meta.json").read_text())["written"] == {"metrics_rows": 4, "record_steps": 4}
    assert main(["check", str(run)]) == 0
    if damage == "cut":
        rows = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
        (run / "metrics.jsonl").write_text("".join(rows[:2]))
    elif damage == "no-metrics":
        (run / "metrics.jsonl").unlink()
    elif damage == "no-record":
        shutil.rmtree(run / "record.zarr")
    else:
        meta = json.loads((run / "record.zarr" / "zarr.json").read_text())
        meta["attributes"]["steps_written"] = 1
        (run / "record.zarr" / "zarr.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["check", str(run)]) == 1
    assert line in capsys.readouterr().out


def test_a_run_that_never_said_what_it_wrote_is_not_held(tmp_path, capsys):
    """Runs written before ``written`` existed (or not finished) are read as before."""
    import json
    assert main(["sim", "toy", "--steps", "4", "--out", str(tmp_path), "--name", "old", "--quiet"]) == 0
    meta = json.loads((tmp_path / "old" / "meta.json").read_text())
    del meta["written"]
    (tmp_path / "old" / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(tmp_path / "old" / "record.zarr")
    assert main(["check", str(tmp_path / "old")]) == 0


def test_a_full_disk_while_the_record_makes_its_arrays_leaves_it_readable(tmp_path, monkeypatch, capsys):
    """Item 11: the disk filled between the step array's folder and its ``zarr.json``; the message
    said what was recorded is kept, but the record then read as corrupt (metadata missing).  The
    half-made array is taken away: ``check`` says ok, ``info`` says failed and why."""
    import errno

    import zarr.storage._local as local
    real = local._put

    def full_at_step_metadata(path, value, exclusive=False):
        if path.parent.name == "step" and path.name == "zarr.json":
            path.parent.mkdir(parents=True, exist_ok=True)      # as far as a real full disk gets
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, value, exclusive=exclusive)
    monkeypatch.setattr(local, "_put", full_at_step_metadata)
    assert main(["sim", "toy", "--steps", "3", "--out", str(tmp_path), "--name", "full", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dyntool: error: the disk is full"), err
    monkeypatch.setattr(local, "_put", real)
    assert not (tmp_path / "full" / "record.zarr" / "step").exists()
    assert main(["check", str(tmp_path / "full")]) == 0
    assert capsys.readouterr().out.strip() == f"{tmp_path / 'full'}: ok (0 steps committed)"
    assert main(["info", str(tmp_path / "full")]) == 0
    rows = {ln[:9].strip(): ln[9:] for ln in capsys.readouterr().out.splitlines() if ln[:1].strip()}
    assert rows["status"] == "failed" and "No space left on device" in rows["stopped"], rows


READ_ALL = """
import sys, dyntool
try:
    dyntool.open_run(sys.argv[1]).arrays["attn"][:]
except Exception as e:
    print(type(e).__name__)
"""


@pytest.fixture(scope="module")
def damaged_chunk(tmp_path_factory):
    """A toy run of 40 chunks of attn along step (one step each) with one chunk's bytes changed."""
    root = tmp_path_factory.mktemp("damaged")
    assert main(["sim", "toy", "--steps", "40", "--record.chunk_steps=1", "--record.arrays=attn", "--out", str(root), "--name", "d", "--quiet"]) == 0
    chunk = root / "d" / "record.zarr" / "attn" / "c" / "1" / "0" / "0" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 0xFF
    chunk.write_bytes(bytes(data))
    return root / "d"


def _read_all(run):
    import os
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-c", READ_ALL, str(run)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})


def test_a_failed_read_ends_without_pending_task_noise(damaged_chunk):
    """Item 11: after the right error, reading a run with a damaged chunk sometimes added "Task
    was destroyed but it is pending!" or a "cannot schedule new futures after shutdown" traceback
    at exit (the failed read's sibling chunk reads, still in flight on zarr's loop).  They are let
    finish first: the error, and nothing after it."""
    p = _read_all(damaged_chunk)      # without the drain: 160-380 lines of it, 3 runs of 3
    assert p.stdout.strip() == "RecordError" and p.stderr == "", p.stderr[-2000:]
