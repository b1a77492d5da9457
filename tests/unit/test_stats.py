"""The small statistics, each written once (mean ± std, Pearson, Jensen–Shannon, PCA) and the fast
copies the engine keeps, against independent references (statistics, scipy, scikit-learn)."""
import math
import statistics

import numpy as np
import pytest

from dyntool.stats import mean_std


def test_sample_std_matches_the_statistics_module():
    xs = [746, 282, 345, 394, 522]
    m, s = mean_std(xs)
    assert m == pytest.approx(statistics.fmean(xs), rel=1e-15)
    assert s == pytest.approx(statistics.stdev(xs), rel=1e-14)          # ddof = 1, not pstdev
    assert s != pytest.approx(statistics.pstdev(xs))


def test_nan_ignored_single_value_zero_empty_nan():
    assert mean_std([1.0, float("nan"), 3.0]) == (2.0, pytest.approx(math.sqrt(2.0)))
    assert mean_std([5.0]) == (5.0, 0.0)
    m, s = mean_std([])
    assert math.isnan(m) and math.isnan(s)
    m, s = mean_std([float("nan")])
    assert math.isnan(m) and math.isnan(s)


def test_axis_zero_per_column():
    mat = np.array([[1.0, 2.0, np.nan], [3.0, np.nan, np.nan], [5.0, 4.0, 7.0]])
    m, s = mean_std(mat, axis=0)
    np.testing.assert_allclose(m, [3.0, 3.0, 7.0])
    np.testing.assert_allclose(s, [statistics.stdev([1, 3, 5]), statistics.stdev([2, 4]), 0.0])


def test_summaries_use_it():
    from dyntool.sims.targets import seed_mean_std
    assert seed_mean_std([1.0, 2.0, 4.0])["std"] == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))
    from dyntool.figures.common import mean_std as fig_mean_std
    np.testing.assert_allclose(fig_mean_std(np.array([[1.0], [2.0], [4.0]]))[1], [statistics.stdev([1, 2, 4])])


def test_pearson_equals_scipy_and_is_nan_without_a_correlation():
    from scipy.stats import pearsonr

    from dyntool.stats import pearson
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    b[:25] += a[:25]
    assert pearson(a, b) == pytest.approx(pearsonr(a, b)[0], abs=1e-12)
    a2, b2 = a.copy(), b.copy()
    a2[3], b2[7] = np.nan, np.inf                                    # only finite pairs count
    keep = np.isfinite(a2) & np.isfinite(b2)
    assert pearson(a2, b2) == pytest.approx(pearsonr(a2[keep], b2[keep])[0], abs=1e-12)
    assert np.isnan(pearson(np.ones(10), b[:10])) and np.isnan(pearson(a[:2], b[:2]))


def test_js_rows_equals_scipy_and_the_fast_torch_copy():
    import torch
    from scipy.spatial.distance import jensenshannon

    from dyntool.sims.diagnostics import _js
    from dyntool.stats import js_rows
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(6), size=8), rng.dirichlet(np.ones(6), size=8)
    p[0] = [1, 0, 0, 0, 0, 0]                                          # zeros: 0 log 0 = 0
    want = np.array([jensenshannon(a, b) ** 2 for a, b in zip(p, q)])   # scipy: sqrt of JS, nats
    np.testing.assert_allclose(js_rows(p, q), want, atol=1e-12)
    # the engine keeps a torch copy (batched, on its device); it must agree with the reference
    np.testing.assert_allclose(_js(torch.from_numpy(p), torch.from_numpy(q)).numpy(), want, atol=1e-12)


def test_pca_the_engine_and_the_app_agree_with_the_reference():
    import torch
    from sklearn.decomposition import PCA

    from dyntool.app.analysis import fit_basis
    from dyntool.manifold import pca, participation_ratio
    from dyntool.sims.diagnostics import _pca_stats
    rng = np.random.default_rng(2)
    x = rng.normal(size=(200, 5)) @ rng.normal(size=(5, 5))
    h = x[:, 0] + 0.3 * rng.normal(size=200)
    ref = PCA(n_components=3).fit(x)
    p = pca(x, n=3)
    np.testing.assert_allclose(p.explained_ratio[:3], ref.explained_variance_ratio_, rtol=1e-10)
    np.testing.assert_allclose(np.abs(p.components), np.abs(ref.components_), atol=1e-10)
    b = fit_basis(x, k=3)
    np.testing.assert_allclose(b.components, p.components, atol=1e-12)
    # the engine's batched torch copy (R runs at once) equals the reference per run
    eng = _pca_stats(torch.from_numpy(np.stack([x, 2 * x])), torch.from_numpy(np.stack([h, h])))
    full = pca(x, n=5, orient_by=h)
    assert eng["diag_pc1_share"][0].item() == pytest.approx(full.explained_ratio[0], rel=1e-10)
    assert eng["diag_participation"][1].item() == pytest.approx(participation_ratio(full.eigvals), rel=1e-10)
    r1 = abs(np.corrcoef(full.scores[:, 0], h)[0, 1])
    assert eng["diag_r_pc1_entropy"][0].item() == pytest.approx(r1, rel=1e-10)
