"""A run's record as a lazy ``xarray.Dataset``: the view behind :meth:`dyntool.run.Run.to_xarray`,
``dyntool export`` (:mod:`dyntool.export`) and the dask reductions (:mod:`dyntool.scale`).

It sits below all three (it reads any object with the :class:`~dyntool.run.Run` reading API and
imports none of them), so the run does not import its consumers to offer ``to_xarray``.
Arrays are read lazily, bounded by the commit marker; ``chunks`` makes them dask arrays
(``"record"``: one task per stored chunk).
"""
from __future__ import annotations

import json

import numpy as np

from .errors import ExportError
from .extras import need as _need

STATIC_PREFIX = "static_"


def need(module: str):
    """Import an optional dependency or fail with one line naming the extra to install."""
    return _need(module, error=ExportError)


# -- lazy xarray ---------------------------------------------------------------------------

def _lazy(arr, n: int | None = None):
    """xarray lazy-indexing wrapper around a zarr array (or RecordedArray) with basic indexing."""
    # deferred: xarray is an optional extra (export), asked for only by Run.to_xarray and exports
    from xarray.backends import BackendArray
    from xarray.core import indexing

    class _Backend(BackendArray):
        def __init__(self, a, n):
            self.a = a
            self.shape = tuple(a.shape) if n is None else (n, *a.shape[1:])
            self.dtype = np.dtype(a.dtype)

        def __getitem__(self, key):
            return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC,
                                                      self._raw)

        def _raw(self, key):
            return np.asarray(self.a[key])

    return indexing.LazilyIndexedArray(_Backend(arr, n))


def _resolve_dims(specs: dict[str, tuple[tuple[str, ...], tuple[int, ...]]]) -> dict[str, tuple[str, ...]]:
    """Dimension names per array.  A name used with several sizes (e.g. ``query`` of a recorded
    crop and of the whole sequence) keeps its plain name for its most common size; the
    others become ``{dim}_{size}``, shared by every array of that size."""
    from collections import Counter
    count = Counter((d, n) for dims, shape in specs.values() for d, n in zip(dims, shape))
    main = {}
    for (d, n), c in count.items():
        if d not in main or c > count[(d, main[d])]:
            main[d] = n
    return {name: tuple(d if main[d] == n else f"{d}_{n}" for d, n in zip(dims, shape))
            for name, (dims, shape) in specs.items()}


def to_xarray(run, arrays: list[str] | None = None, steps: str | None = None, static: bool = True):
    """The run's record as a lazy ``xarray.Dataset`` (coordinate ``step``); see module doc."""
    xr = need("xarray")
    st = run.store
    names = [n for n in (st.names() if st is not None else []) if n != "step"]
    arrays = check_arrays(run, arrays, names)
    step = np.asarray(st["step"][:], dtype=np.int64) if st is not None and "step" in st.names() \
        else np.zeros(0, np.int64)
    specs, srcs = {}, {}
    for n in arrays:
        a = st[n]
        dims = a.dims if len(a.dims) == a.ndim else ("step",) + tuple(f"dim_{i}" for i in range(1, a.ndim))
        specs[n], srcs[n] = (tuple(dims), a.shape), a
    if static and st is not None:
        for n in st.static_names():
            z = st.static_array(n)
            dims = tuple(z.metadata.dimension_names or ()) or tuple(f"dim_{i}" for i in range(z.ndim))
            key = STATIC_PREFIX + n
            if key in specs:
                raise ExportError(f"array {key} clashes with the static array {n}")
            specs[key], srcs[key] = (dims, tuple(z.shape)), z
    specs["step"] = (("step",), (len(step),))
    names_ = _resolve_dims(specs)
    data = {n: xr.Variable(names_[n], _lazy(a), attrs=dict(a.attrs)) for n, a in srcs.items()}
    ds = xr.Dataset(data, coords={"step": ("step", step), **_crop_coords(specs, names_, srcs)},
                    attrs={"run_id": run.id, "kind": run.kind, "status": run.status,
                           "config": json.dumps(run.config), "meta": json.dumps(run.meta, default=str)})
    if steps is not None:
        ds = ds.isel(step=select_steps(step, steps))
    return ds


def _crop_coords(specs, names_, srcs) -> dict:
    """Sequence positions of cropped matrices (attributes ``query_offset``/``key_offset``) as
    coordinates of their query/key dimensions, where every array on that dimension agrees."""
    offsets: dict[str, set] = {}
    for n, (dims, _) in specs.items():
        attrs = getattr(srcs.get(n), "attrs", {}) or {}
        for d, new in zip(dims, names_[n]):
            if d in ("query", "key"):
                offsets.setdefault(new, set()).add(attrs.get(f"{d}_offset"))
    sizes = {new: s for n, (_, shape) in specs.items() for new, s in zip(names_[n], shape)}
    return {d: (d, int(next(iter(o))) + np.arange(sizes[d], dtype=np.int64))
            for d, o in offsets.items() if len(o) == 1 and None not in o}


# -- selections ----------------------------------------------------------------------------

def check_arrays(run, wanted: list[str] | None, names: list[str] | None = None) -> list[str]:
    if names is None:
        st = run.store
        names = [n for n in (st.names() if st is not None else []) if n != "step"]
    if wanted is None:
        return list(names)
    unknown = [w for w in wanted if w not in names]
    if unknown:
        have = ", ".join(names) or "none"
        raise ExportError(f"unknown array(s) {', '.join(unknown)} in run {run.id} (recorded: {have})")
    return list(dict.fromkeys(wanted))


def select_steps(step_values: np.ndarray, spec: str, strict: bool = True) -> np.ndarray:
    """Positions of the steps a spec selects: comma-separated training steps ``N``, ranges
    ``A:B`` (A ≤ step < B, either end optional) and ``last``.  ``strict``: every ``N`` must be
    present and something must be selected (the record); else a plain filter (the metrics)."""
    step_values = np.asarray(step_values, dtype=np.int64)
    keep = np.zeros(len(step_values), dtype=bool)
    for part in (p.strip() for p in str(spec).split(",")):
        try:
            if part == "last":
                if len(step_values):
                    keep |= step_values == step_values.max()
            elif ":" in part:
                a, b = (x.strip() for x in part.split(":", 1))
                lo = int(a) if a else np.iinfo(np.int64).min
                hi = int(b) if b else np.iinfo(np.int64).max
                keep |= (step_values >= lo) & (step_values < hi)
            else:
                hit = step_values == int(part)
                if strict and not hit.any():
                    raise ExportError(f"step {part} was not recorded ({_describe(step_values)})")
                keep |= hit
        except ValueError:
            raise ExportError(f"bad --at-steps item {part!r}: use N, A:B or last, comma-separated") from None
    if strict and not keep.any():
        raise ExportError(f"--at-steps {spec} selects no recorded step ({_describe(step_values)})")
    return np.nonzero(keep)[0]


def _describe(s: np.ndarray) -> str:
    return f"recorded steps {s[0]}..{s[-1]}, {len(s)} in all" if len(s) else "nothing recorded"


# -- dask --------------------------------------------------------------------------------------

def need_dask():
    need("dask.array")


def _stored_chunks(arr) -> tuple[int, ...] | None:
    part = getattr(arr, "parts", [arr])[0]                     # a merged array: rank 0's chunks
    z = getattr(part, "_z", None)
    return tuple(z.metadata.chunk_grid.chunk_shape) if z is not None else None


def chunk(run, ds, chunks):
    """``ds`` with dask-backed variables (see the module doc)."""
    need_dask()
    if chunks != "record":
        return ds.chunk(chunks)
    st = run.store
    out = ds.copy()
    for name, var in ds.data_vars.items():
        arr = None
        if st is not None and name in st.names():
            arr = st[name]
        cs = _stored_chunks(arr) if arr is not None else None
        if cs is None or len(cs) != var.ndim:
            out[name] = var.chunk()
            continue
        out[name] = var.chunk(dict(zip(var.dims, (min(c, n) or 1 for c, n in zip(cs, var.shape)))))
    return out


