"""One pooling semantics everywhere: block means over VISIBLE entries of a causal matrix.

A 5×5 causal matrix pooled in 2×2 blocks has tiles holding 3, 0, 4, 1, ... visible entries; the
expected means below are worked out by hand from the visible entries only, so a pooler that
averages masked zeros in (the old figure fixtures) or mis-sizes edge tiles fails.
"""
from __future__ import annotations


import numpy as np
import torch

from dyntool.record.recorder import pool_blocks

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
    full, vis = st.window(0, 23), st.mask(0, 23)
    pooled = st.pooled(4, rows_per_chunk=8)
    for n in ("attn", "compat", "advantage", "score_grad"):
        torch.testing.assert_close(pooled[n], pool_blocks(full[n], 4, vis), equal_nan=True)


def test_app_block_mean_uses_the_same_semantics():
    from dyntool.app.analysis import block_mean
    np.testing.assert_allclose(block_mean(np.where(VIS, M, np.nan), 2), EXPECTED)


def test_figure_fixtures_pool_like_the_recorder():
    from tests.figures_fixtures import _pool
    np.testing.assert_allclose(_pool(np.where(VIS, M, 0.0), 2), EXPECTED)
