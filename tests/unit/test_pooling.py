"""One pooling semantics everywhere: block means over VISIBLE entries of a causal matrix.

A 5×5 causal matrix pooled in 2×2 blocks has tiles holding 3, 0, 4, 1, ... visible entries; the
expected means below are worked out by hand from the visible entries only, so a pooler that
averages masked zeros in (the old figure fixtures) or mis-sizes edge tiles fails.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch

from dyntool.record import names
from dyntool.record.policy import RecordConfig
from dyntool.record.pooling import pool_blocks
from dyntool.recorder import Recorder

# causal 5×5: entry (i, j) = 10 i + j for j ≤ i; above the diagonal a junk value that must not count
M = np.array([[10 * i + j if j <= i else 999.0 for j in range(5)] for i in range(5)])
VIS = np.tri(5, dtype=bool)
EXPECTED = np.array([
    [(0 + 10 + 11) / 3, np.nan, np.nan],
    [(20 + 21 + 30 + 31) / 4, (22 + 32 + 33) / 3, np.nan],
    [(40 + 41) / 2, (42 + 43) / 2, 44.0],
])


def test_pool_blocks_torch_and_numpy():
    np.testing.assert_allclose(pool_blocks(torch.tensor(M), 2, torch.tensor(VIS)).numpy(), EXPECTED)
    np.testing.assert_allclose(pool_blocks(M, 2, VIS), EXPECTED)
    # masked entries holding NaN or −inf do not leak either
    for junk in (np.nan, -np.inf, 0.0):
        np.testing.assert_allclose(pool_blocks(np.where(VIS, M, junk), 2, VIS), EXPECTED)


def test_sim_engine_pools_the_same():
    """StepState.pooled (chunked by whole block rows) == pool_blocks of the full matrix."""
    from dyntool.sims.single_head import init_weights, train
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 23, 20, generator=g, dtype=torch.float64)
    y = torch.randint(0, 8, (2, 23), generator=g)
    W = init_weights([0, 1], dtype=torch.float64)
    got = {}
    train(x, y, W, [(0.0,) * 4] * 2, 1, on_step=lambda s, st: got.setdefault(s, st), record_steps={0})
    st = got[0]
    full, vis = st.row_block(0, 23), st.mask(0, 23)
    pooled = st.pooled(4, rows_per_chunk=8)
    for n in ("attn", "compat", "advantage", "score_grad"):
        torch.testing.assert_close(pooled[n], pool_blocks(full[n], 4, vis), equal_nan=True)


def test_app_block_mean_uses_the_same_semantics():
    from dyntool.app.analysis import block_mean       # the app is a package (was app/analysis.py)
    np.testing.assert_allclose(block_mean(np.where(VIS, M, np.nan), 2), EXPECTED)


def test_figure_fixtures_pool_like_the_recorder():
    from tests.figures_fixtures import _pool
    np.testing.assert_allclose(_pool(np.where(VIS, M, 0.0), 2), EXPECTED)


# ------------------------------------------------------------- against an independent loop

def loop_pool(x: np.ndarray, block: int, visible: np.ndarray) -> np.ndarray:
    """Reference: for every tile, the plain mean of the entries the mask shows (NaN if none),
    written as explicit loops over tiles and entries; leading axes are looped over too."""
    T, Tk = x.shape[-2:]
    nq, nk = -(-T // block), -(-Tk // block)
    lead = x.shape[:-2]
    out = np.empty(lead + (nq, nk))
    for idx in np.ndindex(*lead):
        vis = visible[idx] if visible.ndim == x.ndim else visible
        for I in range(nq):
            for J in range(nk):
                total, count = 0.0, 0
                for i in range(I * block, min((I + 1) * block, T)):
                    for j in range(J * block, min((J + 1) * block, Tk)):
                        if vis[i, j]:
                            total += float(x[idx + (i, j)])
                            count += 1
                out[idx + (I, J)] = total / count if count else np.nan
    return out


def _masks(T: int, Tk: int, q0: int = 0, k0: int = 0, window: int | None = None) -> np.ndarray:
    """Causal visibility of a (T, Tk) window whose first query/key sit at q0/k0 in the sequence;
    ``window``: a local (sliding-window) head, query i sees keys i-window+1..i."""
    i = np.arange(T)[:, None] + q0
    j = np.arange(Tk)[None, :] + k0
    vis = j <= i
    if window is not None:
        vis &= j > i - window
    return vis


@pytest.mark.parametrize("T,Tk,q0,k0,window,block", [
    (23, 23, 0, 0, None, 5),       # full causal matrix, ragged edge tiles
    (7, 11, 30, 27, None, 3),      # a recorded window: 7 queries from 30, 11 keys from 27
    (16, 16, 0, 0, 4, 4),          # LS local head: a band, most tiles fully masked
    (9, 9, 0, 0, None, 1),         # block 1: the matrix itself, NaN above the diagonal
    (6, 6, 0, 0, None, 8),         # one tile larger than the matrix
])
def test_pool_blocks_matches_loop_reference(T, Tk, q0, k0, window, block):
    rng = np.random.default_rng(T * 100 + block)
    vis = _masks(T, Tk, q0, k0, window)
    x = rng.standard_normal((2, 3, T, Tk))                       # (L, H, T, Tk)
    want = loop_pool(x, block, vis)
    # the case discriminates: a pooler that averaged the masked zeros in would get another answer
    assert not np.allclose(loop_pool(np.where(vis, x, 0.0), block, np.ones_like(vis)), want, equal_nan=True)
    for junk in (0.0, np.nan, np.inf, -np.inf, 1e30):            # whatever masked entries hold
        got = pool_blocks(np.where(vis, x, junk), block, vis)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        got_t = pool_blocks(torch.tensor(np.where(vis, x, junk)), block, torch.tensor(vis)).numpy()
        np.testing.assert_allclose(got_t, want, rtol=1e-12, atol=0)
    # a per-(layer, head) mask of the full shape pools the same
    np.testing.assert_allclose(pool_blocks(x, block, np.broadcast_to(vis, x.shape).copy()), want, rtol=1e-12)


class _Store:
    """Stand-in for StoreWriter: keeps what the recorder appends."""
    def __init__(self):
        self.rows = []

    def declare(self, name, attrs=None):
        pass

    def append(self, step, arrays, ready=None):
        self.rows.append((step, arrays))

    def close(self):
        pass


def test_recorder_pools_visible_entries_of_a_causal_head():
    """The recorder's *_pooled arrays (what the app and figures draw) are the loop means over the
    causal entries: the mask comes from the NaN of the recorded ``scores``, and masked attention
    weights (exact zeros) never pull a diagonal tile down."""
    T, block = 13, 4
    g = torch.Generator().manual_seed(1)
    vis = torch.tril(torch.ones(T, T, dtype=torch.bool))
    s = torch.randn(1, 2, 1, T, T, generator=g, dtype=torch.float64)          # (L, H, S, T, T)
    attn = torch.softmax(s.masked_fill(~vis, float("-inf")), dim=-1)          # zeros above the diagonal
    compat = torch.randn(1, 2, 1, T, T, generator=g, dtype=torch.float64).masked_fill(~vis, 0.0)
    q = {"scores": s.masked_fill(~vis, float("nan")), "attn": attn, "compat": compat}
    store = _Store()
    cfg = RecordConfig(every=1, arrays=["attn", "scores", "compat"], pool=block, dtype="float32")
    rec = Recorder(store, cfg, max_steps=1, T=T)
    rec.record(0, q)
    (_, out), = store.rows
    for name in ("attn", "compat"):
        want = loop_pool(q[name].numpy(), block, vis.numpy())
        np.testing.assert_allclose(out[names.POOLED[name]], want, rtol=1e-6)
    # the diagonal tile (0, 0) of α: 10 visible entries of 16, the mean of those, not of 16
    a = attn[0, 0, 0, :4, :4].numpy()
    assert out["attn_pooled"][0, 0, 0, 0, 0] == pytest.approx(a[np.tril_indices(4)].mean(), rel=1e-6)
    assert np.isnan(out["attn_pooled"][0, 0, 0, 0, 1])                      # fully masked tile
