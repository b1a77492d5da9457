"""Hardening, second round (issue 22): no hang, no memory blow-up and no crash from any file in a
run folder (FIFOs, devices, huge or deeply nested JSON, crafted array shapes), per-chunk
checksums verified by ``check``, exports that refuse what they can't do, bad input as one line."""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from dyntool import cli, safeio
from dyntool.record.store import RecordError
from dyntool.run import list_runs, open_run
from tests.app import fixtures

STEPS = 20
CHUNK = "record.zarr/attn/c/1/0/0/0/0/0"


@pytest.fixture(autouse=True)
def _no_hang():
    """A hang is a failure, not a stuck test run."""
    def boom(*_):
        raise TimeoutError("hung for 60 s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _edit(p: Path, f) -> None:
    d = json.loads(p.read_text())
    f(d)
    p.write_text(json.dumps(d))


def _replace(run: Path, rel: str, how: str) -> None:
    p = run / rel
    p.unlink()
    if how == "fifo":
        os.mkfifo(p)
    else:                                              # a device node: /dev/null's numbers
        os.mknod(p, 0o600 | 0o020000, os.makedev(1, 3))


DEEP = "[" * 200_000
SHAPE = [STEPS, 1, 1, 1, 100_000, 100_000]
KINDS = {
    "fifo_meta": (lambda r: _replace(r, "meta.json", "fifo"), "FIFO"),
    "fifo_config": (lambda r: _replace(r, "config.json", "fifo"), "FIFO"),
    "fifo_metrics": (lambda r: _replace(r, "metrics.jsonl", "fifo"), "FIFO"),
    "fifo_group_meta": (lambda r: _replace(r, "record.zarr/zarr.json", "fifo"), "FIFO"),
    "fifo_array_meta": (lambda r: _replace(r, "record.zarr/attn/zarr.json", "fifo"), "FIFO"),
    "fifo_chunk": (lambda r: _replace(r, CHUNK, "fifo"), "not a regular file"),
    "device_meta": (lambda r: _replace(r, "meta.json", "dev"), "device"),
    "device_chunk": (lambda r: _replace(r, CHUNK, "dev"), "not a regular file"),
    "deep_meta": (lambda r: (r / "meta.json").write_text(DEEP), "nests deeper"),
    "deep_config": (lambda r: (r / "config.json").write_text('{"a": ' + "[" * 500 + "]" * 500 + "}"),
                    "nests deeper"),
    "deep_array_meta": (lambda r: (r / "record.zarr/attn/zarr.json").write_text(DEEP), "nests deeper"),
    "deep_metrics_line": (lambda r: open(r / "metrics.jsonl", "a").write(DEEP + "\n"), "malformed line"),
    "huge_meta": (lambda r: (r / "meta.json").write_text('{"x": "' + "a" * (safeio.MAX_JSON_BYTES + 1) + '"}'),
                  "over the"),
    "step_1e21": (lambda r: open(r / "metrics.jsonl", "a").write('{"step": 1000000000000000000000}\n'),
                  "malformed line"),
    "crafted_shape": (lambda r: _edit(r / "record.zarr/attn/zarr.json", lambda m: m.update(shape=SHAPE)),
                      "declares shape"),
    "crafted_chunks": (lambda r: _edit(r / "record.zarr/attn/zarr.json", lambda m: (
        m.update(shape=SHAPE), m["chunk_grid"]["configuration"].update(chunk_shape=SHAPE))), "declares chunks"),
    "crafted_few_chunks": (lambda r: _edit(r / "record.zarr/attn/zarr.json", lambda m: (
        m.update(shape=SHAPE), m["chunk_grid"]["configuration"].update(chunk_shape=[1, 1, 1, 1, 5000, 5000]))),
        "chunk files exist"),
    "offset_not_int": (lambda r: _edit(r / "record.zarr/attn/zarr.json",
                                       lambda m: m["attributes"].update(query_offset="x")), "query_offset"),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return fixtures.make_toy(tmp_path_factory.mktemp("base"), "good", steps=STEPS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, good) -> Path:
    root = tmp_path_factory.mktemp("runs")
    shutil.copytree(good, root / "good")
    for kind, (breaks, _) in KINDS.items():
        shutil.copytree(good, root / kind)
        breaks(root / kind)
    return root


@pytest.mark.parametrize("kind", KINDS)
def test_open_run_reports_each_kind_without_hanging(folder, kind):
    run = open_run(folder / kind)
    assert run.corrupt and any(KINDS[kind][1] in p for p in run.problems), run.problems
    assert len(run.metrics) >= STEPS - 1 or "metrics" in kind
    if "compat" in run.arrays:                       # the neighbours of a bad array stay readable
        assert np.isfinite(run.arrays["compat"][:]).any()


def test_ls_check_figures_list_the_neighbours(folder, tmp_path, capsys):
    assert {r.path.name for r in list_runs(folder)} == {"good", *KINDS}
    assert cli.main(["ls", str(folder)]) == 0
    out = capsys.readouterr().out
    status = {line.split()[0]: line.split()[2] for line in out.splitlines()[1:] if line.strip()
              and not line[0].isdigit()}
    assert status.pop("good") == "finished" and set(status.values()) == {"corrupt"}, out
    assert cli.main(["check", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"1 of {len(KINDS) + 1} run(s) ok" in out
    rc = cli.main(["figures", str(folder), "--out", str(tmp_path / "f"), "--only", "f2_toy", "--format", "png",
                   "--dpi", "40"])
    cap = capsys.readouterr()
    assert rc == 0 and "Traceback" not in cap.err + cap.out and "FAILED" not in cap.out, cap.out
    assert "written" in cap.out and "warning:" in cap.err


@pytest.mark.parametrize("kind", ["crafted_shape", "crafted_chunks", "fifo_array_meta", "fifo_chunk",
                                  "fifo_metrics"])
def test_export_fails_when_it_cannot_export_what_was_asked(folder, kind, tmp_path, capsys):
    out = tmp_path / "x"
    assert cli.main(["export", str(folder / kind), "--to", str(out), "--format", "npz,csv"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_export_refuses_a_destination_inside_a_run(folder, capsys):
    for flag in ("--to", "--to-tensorboard"):
        for dest in (folder / "good" / "out", folder / "crafted_shape" / "deep" / "er"):
            assert cli.main(["export", str(folder / "good"), flag, str(dest)]) == 2
            assert "inside the run" in capsys.readouterr().err
            assert not dest.exists()


def test_a_crafted_chunk_header_is_refused_before_decoding(good, tmp_path):
    """A zstd frame declaring far more decoded bytes than its chunk holds is refused unread."""
    run = tmp_path / "r"
    shutil.copytree(good, run)
    frame = b"\x28\xb5\x2f\xfd" + bytes([0xC0]) + (1 << 40).to_bytes(8, "little") + b"\x01\x00\x00" + b"\0" * 4
    (run / CHUNK).write_bytes(frame)
    with pytest.raises(RecordError, match="declares"):
        open_run(run).arrays["attn"][STEPS - 1]


# -- checksums ----------------------------------------------------------------------------------

def _flip(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x10
    p.write_bytes(bytes(b))


def test_new_records_carry_a_checksum_per_chunk(good):
    for meta in (good / "record.zarr").rglob("zarr.json"):
        d = json.loads(meta.read_text())
        if d.get("node_type") == "array":
            assert [c["name"] for c in d["codecs"]][-2:] == ["zstd", "crc32c"], meta


def test_check_finds_a_flipped_byte_in_any_chunk(good, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(good, run)
    assert cli.main(["check", str(run)]) == 0
    out = capsys.readouterr().out
    assert "ok" in out and "not checksummed" not in out
    _flip(run / "record.zarr/attn/c/0/0/0/0/0/0")
    assert cli.main(["check", str(run)]) == 1
    assert "fails its checksum" in capsys.readouterr().out


def test_check_covers_static_arrays(tmp_path, capsys):
    from dyntool.run_writer import RunWriter
    w = RunWriter.create(tmp_path, "toy", {}, name="s")
    store = w.open_store(chunk_steps=2)
    store.write_static("targets", np.arange(50, dtype=np.float64), ("position",))
    store.append(0, {"x": np.ones(3)})
    w.finish()
    assert cli.main(["check", str(w.path)]) == 0
    capsys.readouterr()
    _flip(w.path / "record.zarr/static/targets/c/0")
    assert cli.main(["check", str(w.path)]) == 1
    assert "static/targets" in capsys.readouterr().out


def test_an_older_record_is_not_checksummed_not_corrupt(good, tmp_path, capsys):
    """A record written before checksums (zstd only) reads as before and says so."""
    import zarr
    run = tmp_path / "old"
    shutil.copytree(good, run)
    rec = run / "record.zarr"
    for d in sorted(p for p in rec.iterdir() if p.is_dir()):
        data, z = zarr.open_array(str(d), mode="r")[...], zarr.open_array(str(d), mode="r")
        attrs, dims, chunks = dict(z.attrs), z.metadata.dimension_names, z.chunks
        shutil.rmtree(d)
        new = zarr.create_array(str(d), shape=data.shape, dtype=data.dtype, chunks=chunks,
                                dimension_names=dims, attributes=attrs, config={"write_empty_chunks": True})
        new[...] = data
    assert not open_run(run).corrupt
    assert cli.main(["check", str(run)]) == 0
    assert "not checksummed" in capsys.readouterr().out


# -- bad input: one line, exit 2, nothing left --------------------------------------------------

def _one_line(capsys, needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "internal error" not in err, err
    assert needle in err, err


@pytest.mark.parametrize("argv,needle", [
    (["sim", "toy", "--out", ""], "--out"),
    (["sim", "toy", "--steps.x=1", "--steps", "2"], "steps.x"),
    (["sim", "toy", "--lr=1e308"], "float32"),
    (["sim", "toy", "--steps=1e30"], "steps"),
])
def test_bad_values_are_one_line(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    _one_line(capsys, needle)
    assert list(tmp_path.iterdir()) == []


def test_check_of_a_folder_without_runs_fails(tmp_path, capsys):
    assert cli.main(["check", str(tmp_path)]) == 1
    assert "no runs" in capsys.readouterr().out


def test_a_full_disk_is_one_line_and_leaves_no_empty_run(tmp_path, capsys, monkeypatch):
    import errno
    from dyntool import run_writer

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(run_writer.RunWriter, "open_store", full)
    assert cli.main(["sim", "toy", "--steps", "2", "--out", str(tmp_path / "o"), "--quiet"]) == 2
    _one_line(capsys, "disk is full")
    assert not (tmp_path / "o").exists()


def test_wandb_without_a_login_is_one_line(good, capsys, monkeypatch):
    wandb = pytest.importorskip("wandb")

    def no_login(**kw):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")
    monkeypatch.setattr(wandb, "init", no_login)
    assert cli.main(["export", str(good), "--to-wandb", "proj"]) == 2
    _one_line(capsys, "wandb login")


def test_unreadable_folders_are_skipped_when_listing(tmp_path, good, monkeypatch):
    """`info /` met /proc/1/cwd (permission denied even for root): such folders are skipped."""
    from pathlib import Path as P
    shutil.copytree(good, tmp_path / "r")
    (tmp_path / "locked").mkdir()
    real = P.is_dir

    def is_dir(self):
        if self.name == "locked":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)
    monkeypatch.setattr(P, "is_dir", is_dir)
    assert [r.path.name for r in list_runs(tmp_path)] == ["r"]


def test_app_escapes_markdown_from_run_files(good, tmp_path, monkeypatch):
    """What the browser test checks end to end, without a browser: every Markdown element that
    quotes meta.json has its link/image syntax escaped."""
    from streamlit.testing.v1 import AppTest
    root = tmp_path / "runs"
    shutil.copytree(good, root / "evil")
    _edit(root / "evil" / "meta.json", lambda m: m.update(kind="![k](http://192.0.2.1/k.png)", status="failed",
                                                         error="[x](http://192.0.2.1/)"))
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(root))
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=60).run()
    at.query_params["run"] = "evil"
    at.switch_page("views/overview.py").run()
    assert not at.exception
    md = [e.value for e in [*at.markdown, *at.warning, *at.info, *at.error, *at.caption]]
    quoted = [m for m in md if "192" in m]
    assert quoted and not any("](http" in m for m in quoted), quoted
