"""Open exports: every array and the metrics through each format equal what open_run reads."""
from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pandas as pd
import pytest

from dyntool.cli import main
from dyntool.run import open_run
from dyntool.run_writer import RunWriter

xr = pytest.importorskip("xarray", reason="xarray not installed (pip install 'dyntool[export]')")

STEPS = [0, 5, 10, 20, 35]


@pytest.fixture
def run(tmp_path):
    """A small run: float32/float16/int arrays with public dims, an undeclared array, a windowed
    matrix whose ``query`` differs in size from the per-position arrays, statics, odd metrics."""
    rng = np.random.default_rng(0)
    with RunWriter.create(tmp_path / "runs", "test", {"model": {"n_layer": 2}}, name="r1") as w:
        st = w.open_store(chunk_steps=2)
        st.declare("attn", attrs={"query_offset": 3, "key_offset": 3, "T": 7, "odd": {"a": None}, "f": True})     # the last 4 positions
        st.write_static("targets", rng.integers(0, 8, 7), ("query",))
        st.write_static("bayes_entropy", rng.random(7).astype(np.float32), ("query",))
        for k, s in enumerate(STEPS):
            st.append(s, {"attn": rng.random((2, 3, 1, 4, 4)).astype(np.float16),
                          "attn_entropy": rng.random((2, 3, 1, 7)).astype(np.float32),
                          "logit_max": rng.random((2, 3)).astype(np.float32) * 10,
                          "grad_scale": np.float32(0.5),
                          "diag_counts": rng.integers(0, 100, (5,)),
                          "upstream": rng.standard_normal((2, 3, 1, 7, 2))})
            w.log(s, loss=float(rng.random()), entropy=float(rng.random()), note="x" if k == 2 else None,
                  val_loss=float("nan") if k % 2 else float(rng.random()),
                  **{"logit_max/L0H1": float(rng.random())})
    return open_run(tmp_path / "runs" / "r1")


def _arrays(run):
    st = run.store
    return {n: st[n][:] for n in st.names()}


def test_to_xarray_dims_coords_values(run):
    ds = run.to_xarray()
    assert ds["step"].values.tolist() == STEPS and ds["step"].dims == ("step",)
    assert ds.attn.dims == ("step", "layer", "head", "seq", "query_4", "key")   # window: 4 ≠ 7 positions
    assert ds.attn_entropy.dims == ("step", "layer", "head", "seq", "query")
    assert ds.logit_max.dims == ("step", "layer", "head") and ds.grad_scale.dims == ("step",)
    assert ds.diag_counts.dims == ("step", "dim_1")
    assert ds["query_4"].values.tolist() == [3, 4, 5, 6] and ds["key"].values.tolist() == [3, 4, 5, 6]
    assert "query" not in ds.coords                           # per-position arrays: no window, no coord
    assert ds.static_targets.dims == ("query",)
    for n, a in _arrays(run).items():
        if n != "step":
            assert ds[n].dtype == a.dtype
            np.testing.assert_array_equal(ds[n].values, a)
    np.testing.assert_array_equal(ds.static_bayes_entropy.values, run.static("bayes_entropy"))
    assert ds.attrs["run_id"] == "r1" and json.loads(ds.attrs["config"]) == run.config
    np.testing.assert_array_equal(ds.logit_max.sel(step=20).values, run.arrays["logit_max"][3])


def test_to_xarray_is_lazy(run, monkeypatch):
    """Opening reads only the step array; a selection reads only what it needs."""
    from dyntool.record import store
    reads = []
    orig = store.RecordedArray.__getitem__

    def spy(self, key):
        reads.append((self.name, key))
        return orig(self, key)

    monkeypatch.setattr(store.RecordedArray, "__getitem__", spy)
    ds = run.to_xarray()
    assert {n for n, _ in reads} == {"step"}
    reads.clear()
    v = ds.attn.isel(step=2, layer=1, head=0).values
    assert [n for n, _ in reads] == ["attn"]
    assert reads[0][1][0] == 2 and v.shape == (1, 4, 4)


def test_to_xarray_does_not_touch_chunks(run):
    """Independent of the reader: corrupt every chunk file of one array; opening still works,
    reading it fails."""
    chunks = [p for p in (run.path / "record.zarr" / "upstream").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert chunks
    for p in chunks:
        p.write_bytes(b"garbage")
    ds = open_run(run.path).to_xarray()
    assert ds.upstream.shape == (5, 2, 3, 1, 7, 2)
    with pytest.raises(Exception):
        ds.upstream.values


def test_to_xarray_step_selection(run):
    ds = run.to_xarray(arrays=["logit_max"], steps="5,20:40")
    assert ds["step"].values.tolist() == [5, 20, 35] and list(ds.data_vars)[0] == "logit_max"
    np.testing.assert_array_equal(ds.logit_max.values, run.arrays["logit_max"][[1, 3, 4]])
    assert run.to_xarray(steps="last")["step"].values.tolist() == [35]


def _metrics_equal(got: pd.DataFrame, want: pd.DataFrame):
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_metrics_parquet_and_csv_round_trip(run, tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow not installed (pip install 'dyntool[export]')")
    out = tmp_path / "x"
    assert main(["export", str(run.path), "--to", str(out), "--format", "parquet,csv"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["metrics.csv", "metrics.parquet"]
    _metrics_equal(pd.read_parquet(out / "metrics.parquet"), run.metrics)
    _metrics_equal(pd.read_csv(out / "metrics.csv"), run.metrics)
    assert list(run.metrics.columns) == ["step", "loss", "entropy", "note", "val_loss", "logit_max/L0H1"]


def test_arrays_netcdf_round_trip(run, tmp_path):
    pytest.importorskip("h5netcdf", reason="h5netcdf not installed (pip install 'dyntool[export]')")
    out = tmp_path / "x"
    assert main(["export", str(run.path), "--to", str(out), "--format", "netcdf"]) == 0
    with xr.open_dataset(out / "arrays.nc", engine="h5netcdf") as ds:
        for n, a in _arrays(run).items():
            assert ds[n].dtype == a.dtype, n
            np.testing.assert_array_equal(ds[n].values, a)
        for n in run.static_names:
            np.testing.assert_array_equal(ds[f"static_{n}"].values, run.static(n))
        assert ds.attn.dims == ("step", "layer", "head", "seq", "query_4", "key")
        assert ds.attrs["run_id"] == "r1" and ds["query_4"].values.tolist() == [3, 4, 5, 6]
        assert ds.attn.attrs["T"] == 7 and json.loads(ds.attn.attrs["odd"]) == {"a": None}


def test_arrays_npz_round_trip(run, tmp_path):
    out = tmp_path / "x"
    assert main(["export", str(run.path), "--to", str(out), "--format", "npz", "--at-steps", "10:"]) == 0
    z = np.load(out / "arrays.npz")
    for n, a in _arrays(run).items():
        assert z[n].dtype == a.dtype
        np.testing.assert_array_equal(z[n], a[2:])
    for n in run.static_names:
        np.testing.assert_array_equal(z[f"static_{n}"], run.static(n))
    assert json.loads(str(z["_dims"]))["logit_max"] == ["step", "layer", "head"]


def test_selected_arrays_only(run, tmp_path):
    out = tmp_path / "x"
    assert main(["export", str(run.path), "--to", str(out), "--format", "npz", "--arrays", "logit_max"]) == 0
    with zipfile.ZipFile(out / "arrays.npz") as zf:
        assert sorted(zf.namelist()) == ["_dims.npy", "logit_max.npy", "static_bayes_entropy.npy",
                                         "static_targets.npy", "step.npy"]


@pytest.mark.parametrize("args, msg", [
    (["--format", "parquet,hdf9"], "unknown export format hdf9"),
    (["--format", "npz", "--arrays", "attn,nope"], "unknown array(s) nope"),
    (["--format", "npz", "--at-steps", "7"], "step 7 was not recorded"),
    (["--format", "npz", "--at-steps", "a:b"], "bad --at-steps item"),
    (["--format", "npz", "--at-steps", "5:2"], "--at-steps 5:2 selects no recorded step"),   # was: --steps
])
def test_bad_input_one_line_exit_2_nothing_left(run, tmp_path, capsys, args, msg):
    out = tmp_path / "new" / "x"
    before = sorted(p.name for p in run.path.rglob("*"))
    assert main(["export", str(run.path), "--to", str(out)] + args) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1 and err.startswith("dyntool: error:")
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in run.path.rglob("*")) == before


def test_unwritable_dir_exit_2_nothing_left(run, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["export", str(run.path), "--to", str(blocker / "sub"), "--format", "npz"]) == 2
    err = capsys.readouterr().err.strip()
    assert "can't be created" in err and len(err.splitlines()) == 1
    assert blocker.read_text() == "not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_readonly_dir_exit_2(run, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert main(["export", str(run.path), "--to", str(ro), "--format", "npz"]) == 2
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


def test_never_overwrites_and_failure_midway_leaves_nothing(run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "x"
    assert main(["export", str(run.path), "--to", str(out), "--format", "npz"]) == 0
    first = (out / "arrays.npz").read_bytes()
    assert main(["export", str(run.path), "--to", str(out), "--format", "csv,npz"]) == 2
    assert "already exist" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["arrays.npz"] and (out / "arrays.npz").read_bytes() == first

    import dyntool.export as ex

    def boom(ds, path):
        path.write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ex, "write_npz", boom)
    out2 = tmp_path / "y" / "z"
    assert main(["export", str(run.path), "--to", str(out2), "--format", "csv,npz"]) == 2
    assert "No space left" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()


def test_run_without_record(tmp_path, capsys):
    with RunWriter.create(tmp_path, "test", {}, name="bare") as w:
        w.log(0, loss=1.0)
    assert main(["export", str(tmp_path / "bare"), "--to", str(tmp_path / "o"), "--format", "netcdf"]) == 2
    assert "no record.zarr" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "bare"), "--to", str(tmp_path / "o"), "--format", "csv"]) == 0
    assert pd.read_csv(tmp_path / "o" / "metrics.csv")["loss"].tolist() == [1.0]
