"""Analysis past memory: a run's record as dask arrays, and two reductions over every step.

``run.to_xarray(chunks="record")`` (or ``{dim: size}``, ``"auto"``) returns a Dataset whose
arrays are dask arrays reading the record chunk by chunk (bounded by the commit marker; every
rank's shard merged, :mod:`dyntool.record.ranks`).  ``"record"`` uses the stored zarr chunks, so
each task reads exactly one chunk file.  The reductions below are lazy: ``.compute()`` runs them
on the threaded scheduler, or on a ``dask.distributed`` cluster when a ``Client`` is active
(the same code; ``bench/bench_dask.py --cluster`` runs it on a LocalCluster).  Peak memory is a
few chunks per worker thread (~4 MB each, :data:`dyntool.record.store_writer.TARGET_CHUNK_BYTES`),
whatever the size of the record.

- :func:`routing_residual`: ‖∂L/∂S − α ⊙ (B − E_α[b])‖_F per (step, layer, head) from the stored
  ``score_grad``, ``attn`` and ``compat``: the routing law checked over the whole run (≈ 0 up to
  the storage dtype's rounding).
- :func:`expected_compat_stats`: per (step, layer, head) mean, std, min and max over sequences and
  queries of E_α[b]_i = Σ_j α_ij b_ij (the recorded ``expected_compat``, else from α and B).
"""
from __future__ import annotations

from .dataset import chunk, need_dask  # noqa: F401  (the scale API)
from .errors import ExportError

HEAD_DIMS = ("step", "layer", "head")


def _key_dim(ds, name: str) -> str:
    return ds[name].dims[-1]


def routing_residual(ds):
    """‖score_grad − attn ⊙ (compat − E_α[b])‖_F over (seq, query, key), per (step, layer, head),
    accumulated in float64."""
    for n in ("attn", "compat", "score_grad"):
        if n not in ds:
            raise ExportError(f"routing_residual needs the recorded array {n!r}")
    a, b, ds_ = (ds[n].astype("float64") for n in ("attn", "compat", "score_grad"))
    key = _key_dim(ds, "attn")
    e = (a * b).sum(key)
    r = ds_ - a * (b - e)
    other = [d for d in r.dims if d not in HEAD_DIMS]
    return ((r * r).sum(other) ** 0.5).rename("routing_residual")


def expected_compat_stats(ds):
    """Dataset of ``mean``, ``std``, ``min``, ``max`` of E_α[b] over (seq, query) per head."""
    if "expected_compat" in ds:
        e = ds["expected_compat"].astype("float64")
    elif "attn" in ds and "compat" in ds:
        e = (ds["attn"].astype("float64") * ds["compat"]).sum(_key_dim(ds, "attn"))
    else:
        raise ExportError("expected_compat_stats needs expected_compat, or attn and compat")
    other = [d for d in e.dims if d not in HEAD_DIMS]
    import xarray as xr
    return xr.Dataset({"mean": e.mean(other), "std": e.std(other), "min": e.min(other),
                       "max": e.max(other)})
