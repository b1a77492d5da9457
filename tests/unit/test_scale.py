"""Run.to_xarray(chunks=...) is dask-backed and the out-of-core reductions (dyntool.scale) equal a
direct numpy computation, on the threaded scheduler and on a dask.distributed cluster."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("dask", reason="dask not installed (pip install dyntool[scale])")
pytest.importorskip("xarray", reason="xarray not installed")

from dyntool import open_run  # noqa: E402
from dyntool.run_writer import RunWriter  # noqa: E402
from dyntool.scale import expected_compat_stats, routing_residual  # noqa: E402


def _record(tmp_path, n_steps=6, L=2, H=3, S=2, T=8, noise=0.01):
    rng = np.random.default_rng(0)
    causal = np.tril(np.ones((T, T), bool))
    run = RunWriter.create(tmp_path, "synthetic", {}, name="syn")
    store = run.open_store(chunk_steps=2, flush_seconds=0)
    raw = {"attn": [], "compat": [], "score_grad": []}
    for step in range(n_steps):
        s = np.where(causal, rng.normal(size=(L, H, S, T, T)), -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        b = np.where(causal, rng.normal(size=a.shape), 0.0)
        e = (a * b).sum(-1, keepdims=True)
        dS = a * (b - e) + np.where(causal, noise * rng.normal(size=a.shape), 0.0)
        arrs = {"attn": a, "compat": b, "score_grad": dS, "expected_compat": e[..., 0]}
        arrs = {k: v.astype(np.float32) for k, v in arrs.items()}
        for k in raw:
            raw[k].append(arrs[k].astype(np.float64))
        store.append(step * 10, arrs)
    run.finish()
    return open_run(tmp_path / "syn"), {k: np.stack(v) for k, v in raw.items()}


def _numpy_residual(raw):
    a, b, dS = raw["attn"], raw["compat"], raw["score_grad"]
    r = dS - a * (b - (a * b).sum(-1, keepdims=True))
    return np.sqrt((r ** 2).sum(axis=(3, 4, 5)))                      # (step, L, H)


def test_chunked_dataset_is_dask_backed_on_the_stored_chunks(tmp_path):
    run, _ = _record(tmp_path)
    ds = run.to_xarray(chunks="record")
    import dask.array as da
    assert isinstance(ds["attn"].data, da.Array)
    stored = run.store["attn"]._z.metadata.chunk_grid.chunk_shape
    assert ds["attn"].data.chunksize == tuple(stored)
    np.testing.assert_array_equal(ds["attn"].values, run.arrays["attn"][:])
    assert list(ds["step"].values) == [0, 10, 20, 30, 40, 50]


def test_routing_residual_and_expected_compat_match_numpy(tmp_path):
    run, raw = _record(tmp_path)
    ds = run.to_xarray(chunks={"step": 2, "layer": 1})
    res = routing_residual(ds).compute()
    want = _numpy_residual(raw)
    assert res.dims == ("step", "layer", "head") and want.min() > 0.01    # the noise is seen
    np.testing.assert_allclose(res.values, want, rtol=1e-6)
    st = expected_compat_stats(ds).compute()
    e = (raw["attn"] * raw["compat"]).sum(-1)                             # (step, L, H, S, T)
    np.testing.assert_allclose(st["mean"].values, e.mean(axis=(3, 4)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(st["max"].values, e.max(axis=(3, 4)), rtol=1e-5, atol=1e-7)


def test_same_code_on_a_distributed_cluster(tmp_path):
    distributed = pytest.importorskip("distributed")
    run, raw = _record(tmp_path, n_steps=4)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster):
        res = routing_residual(run.to_xarray(chunks="record")).compute()
    np.testing.assert_allclose(res.values, _numpy_residual(raw), rtol=1e-6)
