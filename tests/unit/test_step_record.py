"""The sticky engine's recorded step: only the recorded runs' arrays, every run's diagnostics,
the same numbers whichever way the work is split (runs subset, threads, causal chunks)."""
import numpy as np
import pytest
import torch

from dyntool.quantities import head_quantities
from dyntool.record.policy import RecordConfig
from dyntool.recorder import Recorder
from dyntool.sims.diagnostics import step_record, step_record_threaded
from tests.engine_fixtures import engine_state

R, N = 4, 41


@pytest.fixture(scope="module")
def state():
    return engine_state(R, N, seed=3)


def _args(st):
    g = torch.Generator().manual_seed(4)
    prev = torch.randint(8, (R, N), generator=g)
    return ((12, 35), (3, 38), 6, prev, torch.rand(R, N, generator=g, dtype=torch.float64), 1.8,
            torch.rand(R, 23, 35, generator=g, dtype=torch.float64).softmax(-1))


def test_a_subset_of_runs_gets_the_same_arrays_and_every_run_its_diagnostics(state):
    full, dfull, wfull = step_record(state, *_args(state), chunk=12)
    sub, dsub, wsub = step_record(state, *_args(state), chunk=12, recorded=[3, 1])
    assert len(full) == R and len(sub) == 2
    for got, ref in ((sub[0], full[3]), (sub[1], full[1])):
        assert got.keys() == ref.keys()
        for n in ref:
            torch.testing.assert_close(got[n], ref[n], equal_nan=True, msg=n)
    for n in dfull:
        torch.testing.assert_close(dsub[n], dfull[n], equal_nan=True, msg=n)
    assert torch.equal(wsub, wfull)
    none, dnone, _ = step_record(state, *_args(state), recorded=[])
    assert none == [] and torch.allclose(dnone["diag_attn_entropy"], dfull["diag_attn_entropy"])


@pytest.mark.parametrize("workers", [2, 3])
def test_threads_split_the_runs_without_changing_a_number(state, workers):
    ref, dref, wref = step_record(state, *_args(state), chunk=12, recorded=[0, 2, 3])
    got, dgot, wgot = step_record_threaded(state, *_args(state), chunk=12, recorded=[0, 2, 3], workers=workers)
    for a, b in zip(got, ref):
        for n in b:
            torch.testing.assert_close(a[n], b[n], equal_nan=True, msg=n)
    for n in dref:
        torch.testing.assert_close(dgot[n], dref[n], equal_nan=True, msg=n)
    torch.testing.assert_close(wgot, wref)


def test_logit_stats_and_pooled_overview_equal_the_full_matrix_formulas(state):
    """Chunks stop at their last visible key; the statistics still cover exactly the visible entries."""
    per_run, _, _ = step_record(state, *_args(state), chunk=12)
    allowed = torch.ones(N, N, dtype=torch.bool).tril()
    for r in range(R):
        ref = head_quantities(state.queries[r], state.keys[r], state.values[r], state.upstream[r], allowed)
        torch.testing.assert_close(per_run[r]["logit_max"].double().squeeze(), ref["logit_max"], rtol=1e-6, atol=0)
        torch.testing.assert_close(per_run[r]["logit_norm"].double().squeeze(), ref["logit_norm"], rtol=1e-6, atol=0)
        # the overview: 6×6 block means over visible entries, NaN above the diagonal blocks
        s = ref["attn"]
        for bi, bj in ((0, 0), (6, 2), (6, 6), (3, 1)):
            blk, vis = s[6 * bi:6 * bi + 6, 6 * bj:6 * bj + 6], allowed[6 * bi:6 * bi + 6, 6 * bj:6 * bj + 6]
            want = (blk * vis).sum() / vis.sum()
            torch.testing.assert_close(per_run[r]["attn_pooled"][0, 0, 0, bi, bj], want)
        assert torch.isnan(per_run[r]["attn_pooled"][0, 0, 0, 0, 1])
        # the stored score window: NaN exactly where masked
        sw = per_run[r]["scores"][0, 0, 0]
        assert torch.equal(torch.isnan(sw), ~allowed[12:35, 3:38])


def test_recorder_write_stores_what_reduce_makes(tmp_path):
    """record = write ∘ reduce: a full-T producer and a pre-reduced one store the same arrays."""
    from dyntool.record.store_writer import StoreWriter
    T = 10
    cfg = RecordConfig(every=1, pool=5, dtype="float32", query_crop=[2, 8], key_crop=[0, 6])
    g = torch.Generator().manual_seed(0)
    s = torch.randn(1, 1, 1, T, T, generator=g).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("nan"))
    q = {"scores": s, "attn": torch.rand(1, 1, 1, T, T, generator=g), "upstream": torch.randn(1, 1, 1, T, 3)}
    stores = {}
    for mode in ("record", "write"):
        st = StoreWriter(tmp_path / mode, chunk_steps=4)
        rec = Recorder(st, cfg, 2, T)
        if mode == "record":
            rec.record(0, q, extra={"diag_x": 1.5})
        else:
            rec.write(0, rec.reduce(q), extra={"diag_x": 1.5})
        rec.close()
        stores[mode] = st
    import zarr
    a, b = zarr.open_group(str(tmp_path / "record"), mode="r"), zarr.open_group(str(tmp_path / "write"), mode="r")
    assert sorted(a.array_keys()) == sorted(b.array_keys())
    for k in a.array_keys():
        np.testing.assert_array_equal(a[k][:], b[k][:])
    assert a["attn"].shape[-2:] == (6, 6) and a["attn_pooled"].shape[-2:] == (2, 2)
