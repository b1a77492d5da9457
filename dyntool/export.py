"""Open exports of a run: a lazy xarray Dataset, metrics to Parquet/CSV, arrays to NetCDF/npz.

``to_xarray(run)`` wraps every recorded array in xarray's lazy indexing (no dask needed):
opening reads only the ``step`` array; a slice reads only the chunks it touches, bounded by
the commit marker like :class:`~dyntool.record.store.RecordedArray`.  Dimension names come from
the store's ``dimension_names``; ``step`` is the coordinate of the leading axis.  Per-run
arrays without a step axis (``record.zarr/static/NAME``) appear as ``static_NAME``.  Arrays
whose dimension names collide with a different size (e.g. a recorded crop vs the whole
sequence) get the array name prefixed to that dimension (``NAME_dim``).

``export_run(run, out, formats)`` writes, in ``out``:

* ``metrics.parquet`` / ``metrics.csv``: ``run.metrics`` as is (one row per logged step);
* ``arrays.nc``: NetCDF-4 (HDF5, via h5netcdf: no netCDF C library), the Dataset above with
  the run's id, kind, config and meta as JSON attributes;
* ``arrays.npz``: numpy archive, one entry per array plus ``step`` and ``_dims`` (JSON
  ``{name: [dims]}``); written one array at a time.

Either array format holds one whole array in memory while it is written: for a big record
pick arrays and steps (``arrays=``, ``steps=``).  Files are written in a hidden temporary
directory inside ``out`` and moved in place at the end; on any error nothing is left behind
and existing files are never overwritten.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from . import safeio
from .dataset import check_arrays, need, select_steps, to_xarray  # noqa: F401  (the export API)
from .errors import DyntoolError, ExportError  # noqa: F401  (ExportError: re-exported)
from .paths import inside_run
from .run_writer import RECORD_DIR
from .storage import open_backend

FORMATS = ("parquet", "csv", "netcdf", "npz")
METRIC_FORMATS = ("parquet", "csv")
ARRAY_FORMATS = ("netcdf", "npz")
FILES = {"parquet": "metrics.parquet", "csv": "metrics.csv", "netcdf": "arrays.nc", "npz": "arrays.npz"}




def parse_formats(spec: str) -> list[str]:
    fmts = [f.strip().lower() for f in str(spec).split(",") if f.strip()]
    bad = [f for f in fmts if f not in FORMATS]
    if bad or not fmts:
        raise ExportError(f"unknown export format {', '.join(bad) or repr(spec)}; choose from {', '.join(FORMATS)}")
    return list(dict.fromkeys(fmts))


# -- writers -------------------------------------------------------------------------------

def _metrics(run, steps: str | None):
    df = run.metrics
    if steps is not None and len(df) and "step" in df:
        df = df.iloc[select_steps(df["step"].to_numpy(np.int64), steps, strict=False)].reset_index(drop=True)
    return df


def write_npz(ds, path: Path) -> None:
    """One ``.npy`` entry per variable, loading one array at a time (np.savez needs them all)."""
    dims = {n: list(v.dims) for n, v in ds.variables.items()}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
        for n in ds.variables:
            with zf.open(f"{n}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(ds[n].values), allow_pickle=False)
        with zf.open("_dims.npy", "w") as f:
            np.lib.format.write_array(f, np.array(json.dumps(dims)), allow_pickle=False)


def _netcdf_attrs(ds):
    """NetCDF attributes hold strings, numbers and flat numeric lists: anything else
    (None, bools, dicts, nested lists) goes in as JSON text."""
    def ok(v):
        if isinstance(v, (bool, np.bool_)) or v is None:
            return False
        if isinstance(v, (str, int, float, np.number)):
            return True
        return isinstance(v, (list, tuple)) and len(v) > 0 and \
            all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)

    def fix(attrs):
        return {k: v if ok(v) else json.dumps(v, default=str) for k, v in attrs.items()}

    out = ds.copy()
    out.attrs = fix(ds.attrs)
    for n in out.variables:
        out[n].attrs = fix(ds[n].attrs)
    return out


def check_destination(out: str | Path, what: str = "--to") -> None:
    """An export never goes inside a run (the one exported or any other)."""
    if "\0" in str(out):
        raise ExportError(f"{what}: contains a NUL byte")
    backend = open_backend(out, what)
    if not backend.plain_files:
        raise ExportError(f"{what} {out}: exports are written to a local folder (object storage is read, "
                          "never written, by export)")
    p = backend.where
    try:
        run = inside_run(p.absolute())
    except OSError as e:
        raise ExportError(f"{what} {p} can't be used: {e.strerror or e}") from None
    if run is not None:
        raise ExportError(f"{what} {p} is inside the run {run}; exports are never written into a run")


def _record_problem(run) -> str | None:
    """Why a run whose recording exists can't be read (None: it reads, or there is none); the
    same for a local folder and object storage, since both report it in ``run.problems``."""
    return next((p for p in run.problems if RECORD_DIR in p), None) if run.store is None else None


def check_readable(run, arrays: list[str] | None, metrics: bool) -> None:
    """Refuse (before anything is written) an export of data that can't be read as recorded: an
    asked-for (default: every) array whose metadata is unreadable, or an unreadable metrics.jsonl."""
    st = run.store
    if st is not None:
        bad = {n: why for n, why in st.unreadable.items() if arrays is None or n in arrays}
        if bad:
            first = next(iter(bad.values()))
            raise ExportError(f"run {run.id}: {len(bad)} array(s) can't be read ({', '.join(bad)}; {first}); "
                              "nothing exported (export the others with --arrays)")
        # a missing or damaged chunk: a local read raises on it, an object store's read would give
        # its fill values, so both are refused here, from the cheap check, before anything is written
        names = arrays if arrays is not None else st.names()
        damaged = [p for p in run.problems if any(p.startswith(f"array {n}:") for n in names)]
        if damaged:
            raise ExportError(f"run {run.id}: {damaged[0]}{f' (+{len(damaged) - 1} more)' if len(damaged) > 1 else ''}; "
                              "nothing exported (export the others with --arrays)")
    elif (why := _record_problem(run)) and (arrays or not metrics):
        raise ExportError(f"run {run.id}: {why}; nothing exported")
    if metrics:
        run.metrics
        bad_m = [p for p in run.file_problems if p.startswith("metrics.jsonl can't be read")
                 or p.startswith("metrics.jsonl resolves outside")]
        if bad_m:
            raise ExportError(f"run {run.id}: {bad_m[0]}; nothing exported")


def _check_memory(ds) -> None:
    """Each array format holds one whole array in memory: refuse one that would not fit."""
    for n, v in ds.variables.items():
        need = int(np.prod(v.shape, dtype=np.float64)) * v.dtype.itemsize
        why = safeio.memory_problem(need, f"array {n} {tuple(v.shape)}")
        if why:
            raise ExportError(f"{why}; pick fewer with --arrays / --at-steps")


def export_run(run, out: str | Path, formats: list[str], arrays: list[str] | None = None,
               steps: str | None = None) -> list[Path]:
    """Write the chosen formats into ``out``; returns the files written.  All-or-nothing."""
    formats = parse_formats(",".join(formats))
    check_destination(out)
    for f in formats:                                    # missing extras: fail before any write
        need({"parquet": "pyarrow", "netcdf": "h5netcdf"}.get(f, "numpy"))
    want_arrays = [f for f in formats if f in ARRAY_FORMATS]
    check_readable(run, arrays if want_arrays or arrays else [],
                   metrics=any(f in METRIC_FORMATS for f in formats))
    ds = None
    if want_arrays:
        if run.store is None:
            why = _record_problem(run)
            raise ExportError(f"run {run.id}: {why}; nothing exported" if why else
                              f"run {run.id} has no record.zarr: nothing for {', '.join(want_arrays)}")
        ds = to_xarray(run, arrays, steps)
        _check_memory(ds)
    elif arrays:
        check_arrays(run, arrays)
    if steps is not None and ds is None and run.store is not None and "step" in run.store.names():
        select_steps(run.store["step"][:], steps)        # same validation as the array formats
    out = Path(out)
    targets = [out / FILES[f] for f in formats]
    clash = [str(t) for t in targets if t.exists()]
    if clash:
        raise ExportError(f"{', '.join(clash)} already exist(s); choose another --to (exports never overwrite)")
    created = _make_dir(out)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".dyntool-export-", dir=out))
    except OSError as e:
        _remove(created)
        raise ExportError(f"output directory {out} is not writable: {e.strerror or e}") from None
    moved: list[Path] = []
    try:
        for f in formats:
            dst = tmp / FILES[f]
            if f == "parquet":
                _metrics(run, steps).to_parquet(dst, index=False)
            elif f == "csv":
                _metrics(run, steps).to_csv(dst, index=False)
            elif f == "netcdf":
                _netcdf_attrs(ds).to_netcdf(dst, engine="h5netcdf")
            else:
                write_npz(ds, dst)
        for t in targets:
            os.replace(tmp / t.name, t)
            moved.append(t)
    except BaseException as e:
        for t in moved:                                  # all or nothing
            t.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        _remove(created)
        if isinstance(e, (OSError, ValueError, TypeError)) and not isinstance(e, DyntoolError):
            raise ExportError(f"export to {out} failed: {type(e).__name__}: {e}") from None
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return targets


def _make_dir(out: Path) -> Path | None:
    """Create ``out`` (and parents); return the top-most directory created, for cleanup."""
    top = None
    p = out.absolute()
    while not p.exists():
        top, p = p, p.parent
    if p.is_file():
        raise ExportError(f"output directory {out} can't be created: {p} is a file")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"output directory {out} can't be created: {e.strerror or e}") from None
    if not out.is_dir():
        raise ExportError(f"--to {out} is not a directory")
    return top


def _remove(top: Path | None) -> None:
    if top is not None:
        shutil.rmtree(top, ignore_errors=True)
