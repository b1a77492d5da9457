"""Corrupt and hostile runs: every kind is reported by ``open_run`` (problems), ``ls`` (status
``corrupt``, the other runs still listed, exit 0), ``info``, ``check``, ``figures`` (warns, draws
what it can, no raw codec error) and the app's Runs page; readable parts stay readable; nothing
resolving outside the runs folder is read (symlinked files, folders and chunks)."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from dyntool import cli
from dyntool.record.guarded import zstd_frame_ok
from dyntool.record.reader import RecordReader
from dyntool.record.store import RecordError
from dyntool.run import list_runs, open_run
from dyntool.storage import open_backend
from tests.app import fixtures

STEPS = 40          # 3 chunks of 16 steps per array


def _chunk(run: Path, name: str = "attn", i: int = 1) -> Path:
    return run / "record.zarr" / name / "c" / str(i) / "0" / "0" / "0" / "0" / "0"


def _set_marker(run: Path, value) -> None:
    f = run / "record.zarr" / "zarr.json"
    d = json.loads(f.read_text())
    d["attributes"]["steps_written"] = value
    f.write_text(json.dumps(d))


def _metrics_insert(run: Path, line: str) -> None:
    f = run / "metrics.jsonl"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:3] + [line] + lines[3:]) + "\n")


def _meta(run: Path, obj) -> None:
    (run / "meta.json").write_text(json.dumps(obj))


def _meta_types(run: Path) -> None:
    m = json.loads((run / "meta.json").read_text())
    m.update(tags=5, created=3, status=["finished"], seeds="0")
    _meta(run, m)


# kind -> (how to break a copy of a good run, words the problem must contain, array that must
# still read back whole or None)
KINDS = {
    "deleted_chunk": (lambda r: _chunk(r).unlink(), "missing", "compat"),
    "truncated_chunk": (lambda r: _chunk(r, "compat").write_bytes(_chunk(r, "compat").read_bytes()[:-7]),
                        "truncated", "attn"),
    "garbage_chunk": (lambda r: _chunk(r).write_bytes(b"\x00garbage" * 20), "garbage", "compat"),
    "marker_past_data": (lambda r: _set_marker(r, STEPS + 9), "commit marker", "attn"),
    "negative_marker": (lambda r: _set_marker(r, -3), "not a count", None),
    "missing_array_metadata": (lambda r: (r / "record.zarr" / "scores" / "zarr.json").unlink(),
                               "metadata", "attn"),
    "metrics_line_list": (lambda r: _metrics_insert(r, "[1, 2, 3]"), "malformed line", "attn"),
    "metrics_line_number": (lambda r: _metrics_insert(r, "42"), "malformed line", "attn"),
    "metrics_step_two": (lambda r: _metrics_insert(r, '{"step": "two", "loss": 1.0}'), "malformed line", "attn"),
    # was: skipped quietly as a kill's torn line, though a finished run's writer ended every row
    "metrics_cut_after_finish": (lambda r: (r / "metrics.jsonl").write_bytes((r / "metrics.jsonl").read_bytes()[:-9]),
                                 "partial line", "attn"),
    "meta_is_a_list": (lambda r: _meta(r, [1, 2]), "not an object", "attn"),
    "meta_wrong_types": (_meta_types, "meta.json: tags", "attn"),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return fixtures.make_toy(tmp_path_factory.mktemp("base"), "good", steps=STEPS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, good) -> Path:
    """A runs folder: one good run and one broken copy per kind."""
    root = tmp_path_factory.mktemp("runs")
    shutil.copytree(good, root / "good")
    for kind, (breaks, _, _) in KINDS.items():
        shutil.copytree(good, root / kind)
        breaks(root / kind)
    return root


@pytest.mark.parametrize("kind", KINDS)
def test_open_run_reports_and_keeps_readable_parts(folder, kind):
    _, words, intact = KINDS[kind]
    run = open_run(folder / kind)
    assert run.corrupt and any(words in p for p in run.problems), run.problems
    if intact is not None:                       # the rest still reads back, bounded by the data
        a = run.arrays[intact]
        x = a[:]
        assert x.shape[0] == STEPS and np.isfinite(x).any()
    assert len(run.metrics) >= STEPS - 1
    assert not open_run(folder / "good").corrupt


@pytest.mark.parametrize("kind", ["deleted_chunk", "truncated_chunk", "garbage_chunk"])
def test_reading_a_bad_chunk_raises_a_named_error_not_a_codec_error(folder, kind):
    name = "compat" if kind == "truncated_chunk" else "attn"
    a = open_run(folder / kind).arrays[name]
    assert a[0].shape == a.shape[1:]            # chunk 0 is fine
    with pytest.raises(RecordError, match=f"array {name}"):
        a[20]                                    # chunk 1 (steps 16-31) is broken
    with pytest.raises(RecordError):
        a[:]


def test_zstd_structure_check_against_real_chunks(good, tmp_path):
    """The quick check accepts every chunk zarr wrote (a zstd frame + its 4-byte CRC-32C) and
    rejects every truncation of one."""
    chunks = [p for p in (good / "record.zarr").rglob("c/*") if p.is_file()]
    assert chunks and all(zstd_frame_ok(p, trailer=4) is None for p in chunks)
    assert all(zstd_frame_ok(p) is not None for p in chunks)        # the checksum is really there
    data = max(chunks, key=lambda p: p.stat().st_size).read_bytes()
    f = tmp_path / "chunk"
    for n in range(0, len(data)):
        f.write_bytes(data[:n])
        assert zstd_frame_ok(f, trailer=4) is not None, n


def test_ls_lists_every_run_with_corrupt_status(folder, capsys):
    assert cli.main(["ls", str(folder)]) == 0
    out = capsys.readouterr().out
    status = {line.split()[0]: line.split()[2] for line in out.splitlines()[1:] if line.strip()
              and not line.startswith(tuple("0123456789"))}
    assert status["good"] == "finished"
    for kind in KINDS:
        assert status[kind] == "corrupt", (kind, out)


def test_list_runs_never_raises(folder):
    runs = {r.path.name: r for r in list_runs(folder)}
    assert set(runs) == {"good", *KINDS}
    assert runs["meta_is_a_list"].kind == "?" and runs["meta_wrong_types"].meta.get("tags") is None


@pytest.mark.parametrize("kind", KINDS)
def test_info_names_the_problem(folder, kind, capsys):
    assert cli.main(["info", str(folder / kind)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"status +corrupt", out) and "problem  " in out and KINDS[kind][1] in out


def test_check_decodes_every_chunk(folder, capsys):
    assert cli.main(["check", str(folder / "good")]) == 0
    assert "ok" in capsys.readouterr().out
    for kind in ("deleted_chunk", "truncated_chunk", "garbage_chunk", "marker_past_data"):
        assert cli.main(["check", str(folder / kind)]) == 1
        assert KINDS[kind][1] in capsys.readouterr().out
    assert cli.main(["info", "--verify", str(folder / "garbage_chunk")]) == 1
    assert "1 problem(s)" in capsys.readouterr().out


def test_check_finds_a_bad_chunk_the_structure_check_misses(good, tmp_path, capsys):
    """A well-formed zstd frame holding the wrong number of bytes passes the quick structure
    check (``ls``) but not decoding (``check``)."""
    import google_crc32c
    from numcodecs import Zstd
    run = tmp_path / "r"
    shutil.copytree(good, run)
    frame = Zstd().encode(b"\x01" * 10)
    _chunk(run).write_bytes(frame + np.uint32(google_crc32c.value(frame)).tobytes())   # a valid checksum
    assert zstd_frame_ok(_chunk(run), trailer=4) is None and not open_run(run).corrupt
    assert cli.main(["check", str(run)]) == 1
    assert "array attn: chunk attn/c/1/0/0/0/0/0: a chunk can't be decoded" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["deleted_chunk", "truncated_chunk", "garbage_chunk", "marker_past_data",
                                  "missing_array_metadata", "meta_wrong_types"])
def test_figures_warn_and_draw_what_they_can(folder, kind, tmp_path, capsys):
    rc = cli.main(["figures", str(folder / kind), "--out", str(tmp_path), "--only", "f2_toy",
                   "--format", "png", "--dpi", "40"])
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert rc == 0, text
    assert "warning:" in cap.err and KINDS[kind][1] in cap.err
    assert "Zstd" not in text and "Traceback" not in text and "FAILED" not in text
    assert (tmp_path / "f2_toy.png").exists() or "recorded data can't be read" in cap.out


# -- outside the runs folder --------------------------------------------------------------------

@pytest.fixture()
def hostile(tmp_path, good) -> tuple[Path, Path]:
    """RUNS_DIR with runs whose files are symlinks to a secret run outside it."""
    secret = tmp_path / "secret"
    shutil.copytree(good, secret)
    _meta(secret, {"id": "SECRET-ID", "kind": "leak", "status": "finished"})
    (secret / "config.json").write_text(json.dumps({"password": "SECRET-CONFIG"}))
    (secret / "metrics.jsonl").write_text('{"step": 0, "SECRET_METRIC": 1.0}\n')
    root = tmp_path / "runs"
    root.mkdir()
    for name in ("meta.json", "config.json", "metrics.jsonl", "record.zarr"):
        run = root / f"link-{name.split('.')[0]}"
        shutil.copytree(good, run)
        target = run / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        target.symlink_to(secret / name)
    run = root / "link-chunk"
    shutil.copytree(good, run)
    _chunk(run).unlink()
    _chunk(run).symlink_to(_chunk(secret))
    (root / "link-dir").symlink_to(secret)          # a whole run folder pointing outside
    return root, secret


def test_reader_refuses_symlinks_out_of_the_runs_folder(hostile):
    root, secret = hostile
    runs = {r.path.name: r for r in list_runs(root)}
    assert "link-dir" not in runs                   # a folder resolving outside is not listed
    for name, run in runs.items():
        assert run.corrupt and any("outside" in p for p in run.problems), (name, run.problems)
        assert "SECRET" not in json.dumps(run.meta) + json.dumps(run.config)
        assert not any("SECRET" in c for c in run.metrics.columns)
    assert runs["link-record"].arrays == {}
    with pytest.raises(RecordError, match="outside"):
        runs["link-chunk"].arrays["attn"][20]
    with pytest.raises(RecordError, match="outside"):
        RecordReader(open_backend(root / "link-record", root=root), "record.zarr")


def test_app_refuses_symlinks_out_of_the_runs_folder(hostile, monkeypatch):
    from streamlit.testing.v1 import AppTest
    root, _ = hostile
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(root))
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=60).run()
    assert not at.exception
    df = at.dataframe[0].value
    assert "link-dir" not in set(df["run"]) and set(df["status"]) == {"corrupt"}
    assert "SECRET" not in df.to_csv()
    for run in ("link-meta", "link-config", "link-metrics", "link-chunk"):
        at.query_params["run"] = run
        at.switch_page("views/overview.py").run()
        assert not at.exception
        page = " ".join(str(e.value) for e in [*at.markdown, *at.warning, *at.error, *at.json])
        assert "SECRET" not in page and "outside" in page, (run, page[:500])


def test_app_runs_page_lists_corrupt_runs(folder, monkeypatch):
    from streamlit.testing.v1 import AppTest
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(folder))
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=60).run()
    assert not at.exception and not at.error
    df = at.dataframe[0].value.set_index("run")
    assert df.loc["good", "status"] == "finished"
    for kind, (_, words, _) in KINDS.items():
        assert df.loc[kind, "status"] == "corrupt", kind
        assert words in df.loc[kind, "problems"], (kind, df.loc[kind, "problems"])


def test_app_folder_box_refuses_nul_bytes_and_escapes(folder, monkeypatch):
    from streamlit.testing.v1 import AppTest
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(folder))
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=60).run()
    for bad, words in (("a\x00b", "NUL"), ("../..", "outside"), (str(Path(os.sep)), "outside")):
        at.sidebar.text_input(key="dt_subdir_box").set_value(bad).run()
        assert not at.exception, bad
        assert any(words in e.value for e in at.error), (bad, [e.value for e in at.error])
        assert len(at.dataframe[0].value) == len(KINDS) + 1        # falls back to all of RUNS_DIR


# -- live reads ---------------------------------------------------------------------------------

def test_live_slices_labelled_with_marker_m_hold_m_rows(tmp_path, monkeypatch):
    """The app reads a live run at the marker M it saw: later commits don't leak into that slice."""
    from dyntool.record.store import read_marker
    from dyntool.run_writer import RunWriter
    run = RunWriter.create(tmp_path, "toy", {}, name="live")
    store = run.open_store(chunk_steps=2)
    for s in range(4):
        store.append(s, {"x": np.full(3, float(s))})
    store.flush()
    m = read_marker(open_backend(run.path, root=tmp_path), "record.zarr")
    assert m == 4
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(tmp_path))
    data = fixtures.load_app_package().data
    for s in range(4, 9):                       # the writer commits more after M was taken
        store.append(s, {"x": np.full(3, float(s))})
    store.flush()
    r = data._reader(str(run.path), m)
    assert r.steps_written == m and len(r["x"][:]) == m and len(data.steps.__wrapped__(str(run.path), m)) == m
    assert RecordReader(open_backend(run.path), "record.zarr", limit=m)["step"][:].tolist() == [0, 1, 2, 3]
    assert data.marker(str(run.path)) == 9
    run.finish()


# kind -> (exit status, the one stderr line's start, words in it): what reads is exported and what
# does not is named (exit 0), except an asked-for array that can't be read: nothing (exit 2)
EXPORT = {"marker_past_data": (0, "dyntool: warning:", "commit marker says"),
          "metrics_line_list": (0, "dyntool: warning:", "malformed line"),
          "meta_is_a_list": (0, "dyntool: warning:", "meta.json holds a list"),
          "meta_wrong_types": (0, "dyntool: warning:", "meta.json: status is a list"),
          "missing_array_metadata": (2, "dyntool: error:", "scores")}


@pytest.mark.parametrize("kind", EXPORT)
def test_export_of_a_damaged_run_says_in_one_line_what_it_did_not_read(folder, kind, tmp_path, capsys):
    """An export of a damaged run names, in one stderr line, what it did not read (it used to
    write its files and exit 0 without a word)."""
    from dyntool.cli import main
    want_rc, start, words = EXPORT[kind]
    rc = main(["export", str(folder / kind), "--to", str(tmp_path / "x"), "--format", "csv,npz"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == want_rc and len(err) == 1 and err[0].startswith(start) and words in err[0], (rc, err)
    assert (tmp_path / "x" / "arrays.npz").exists() == (rc == 0)
    assert main(["export", str(folder / "good"), "--to", str(tmp_path / "y"), "--format", "csv"]) == 0
    assert capsys.readouterr().err == ""
