"""The app's own overview (a run without ``*_pooled`` arrays and a crop too big to draw entry by
entry) pools like the recorder: the mean over visible entries only.  Masked α/B/A/∂L/∂s are stored
as exact zeros, so the mask must come from the recorded scores (NaN where masked)."""
from __future__ import annotations

import numpy as np
import pytest

from dyntool.run_writer import RunWriter
from tests.unit.test_pooling import loop_pool

T, BLOCK = 24, 5


def _causal_run(root, with_scores: bool):
    rng = np.random.default_rng(3)
    vis = np.tri(T, dtype=bool)
    s = rng.standard_normal((1, 1, 1, T, T)).astype(np.float32)          # (L, H, S, T, T)
    e = np.where(vis, np.exp(s), 0.0)
    attn = (e / e.sum(-1, keepdims=True)).astype(np.float32)            # zeros above the diagonal
    run = RunWriter.create(root, "train", {"model": {"n_layer": 1, "n_head": 1, "block_size": T}}, name="r")
    store = run.open_store(chunk_steps=2)
    arrays = {"attn": attn}
    if with_scores:
        arrays["scores"] = np.where(vis, s, np.nan).astype(np.float32)
    for n in arrays:
        store.declare(n, attrs={"query_offset": 0, "key_offset": 0, "T": T})
    store.append(0, arrays)
    run.finish()
    return run.path, attn[0, 0, 0], vis


@pytest.mark.parametrize("with_scores", [True, False])
def test_app_overview_pools_visible_entries(tmp_path, monkeypatch, with_scores):
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(tmp_path))
    from dyntool.app import data
    path, attn, vis = _causal_run(tmp_path, with_scores)
    mark = data.marker(str(path))
    assert mark == 1
    got = data.pooled(str(path), mark, "attn", 0, 0, 0, 0, BLOCK)
    if with_scores:                                  # the causal mask, read from the scores' NaN
        np.testing.assert_allclose(got, loop_pool(attn, BLOCK, vis), rtol=1e-6)
        assert np.isnan(got[0, 1])
        np.testing.assert_allclose(data.pooled(str(path), mark, "scores", 0, 0, 0, 0, BLOCK)[1, 0],
                                   np.nan_to_num(data.matrix(str(path), mark, "scores", 0, 0, 0, 0))[5:10, :5].mean())
    else:                                            # no mask recorded: every finite entry counts
        np.testing.assert_allclose(got, loop_pool(attn, BLOCK, np.ones_like(vis)), rtol=1e-6)
