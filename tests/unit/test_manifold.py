"""Manifold metrics (dyntool.manifold) against constructions with known answers."""
import math

import numpy as np
import pytest

from dyntool.manifold import (key_orthogonality, linear_r2, manifold_metrics,
                              ordering_score, participation_ratio, pca, pearson, random_abs_cos)


def _entropy_line(n=1500, d=12, noise=0.02, seed=0):
    """Points on a 1-D line in R^d whose coordinate *is* the entropy, plus small isotropic noise."""
    rng = np.random.default_rng(seed)
    h = np.log(rng.integers(2, 21, size=n)).astype(float)         # bijection-like entropies
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    x = 3.0 + h[:, None] * u[None] * 2.0 + noise * rng.normal(size=(n, d))
    return x, h


def test_known_1d_entropy_ordering():
    x, h = _entropy_line()
    m = manifold_metrics(x, h)
    assert m.r_pc1 > 0.995 and m.best_pc == 1
    assert m.ordering_score == 1.0 and m.ordering_score_best == 1.0
    assert m.pc1_share > 0.98 and m.dims90 == 1
    assert m.r2_linear > 0.99
    # the orientation is by the entropy: flipping the sign of the data or of h keeps r >= 0
    m2 = manifold_metrics(-x, h)
    assert m2.r_pc1 == pytest.approx(m.r_pc1, abs=1e-12)
    assert all(r >= 0 for r in m.r_pc if np.isfinite(r))


def test_curved_monotone_manifold_is_ordered_but_not_linear():
    """A monotone but nonlinear 1-D curve is perfectly ordered (score 1) while r(PC1, H) < 1."""
    rng = np.random.default_rng(1)
    h = rng.uniform(0, 3, size=2000)
    x = np.stack([np.exp(2 * h), np.exp(2 * h)], 1) + 1e-3 * rng.normal(size=(2000, 2))
    m = manifold_metrics(x, h)
    assert m.ordering_score == 1.0
    assert 0.6 < m.r_pc1 < 0.95


def test_noise_has_no_entropy_direction():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3000, 8))
    h = np.log(rng.integers(2, 21, size=3000)).astype(float)
    m = manifold_metrics(x, h)
    assert max(abs(r) for r in m.r_pc) < 0.08           # ~ 1/sqrt(n) = 0.018 per PC
    assert m.r2_linear < 0.02
    assert m.pc1_share < 0.2                             # isotropic: ~1/8 each
    assert m.participation_ratio > 7.5


def test_participation_ratio_and_shares_closed_form():
    rng = np.random.default_rng(3)
    n, sig = 400, np.array([3.0, 2.0, 1.0, 0.5])
    q, _ = np.linalg.qr(rng.normal(size=(n, 4)) - 0)
    q -= q.mean(0)                                       # centre, then re-orthonormalise
    q, _ = np.linalg.qr(q)
    rot, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    x = (q * sig) @ rot.T + 7.0                         # known singular values, rotated, shifted
    m = manifold_metrics(x, rng.normal(size=n), r2=False)
    lam = sig ** 2
    assert m.participation_ratio == pytest.approx(lam.sum() ** 2 / (lam ** 2).sum(), rel=1e-10)
    assert m.pc1_share == pytest.approx(lam[0] / lam.sum(), rel=1e-10)
    assert m.pc12_share == pytest.approx(lam[:2].sum() / lam.sum(), rel=1e-10)
    assert m.dims90 == 2 and m.dims95 == 3              # (9+4)/14.25 = 91 %, (9+4+1)/14.25 = 98 %
    assert participation_ratio([1, 1, 1, 1]) == pytest.approx(4.0)
    assert participation_ratio([5, 0, 0]) == pytest.approx(1.0)


def test_ordering_score_by_hand():
    h = np.repeat(np.arange(4.0), 10)                    # 4 occupied bins of 10
    assert ordering_score(h * 2 + 1, h) == 1.0
    assert ordering_score(-h, h) == 1.0                  # monotone decreasing is ordered too
    pc = np.repeat([1.0, 3.0, 2.0, 4.0], 10)             # diffs +, -, + -> |1| / 3
    assert ordering_score(pc, h) == pytest.approx(1 / 3)
    assert math.isnan(ordering_score(pc, np.zeros(40)))  # one bin: undefined
    sparse = np.r_[np.zeros(10), np.ones(3)]             # second bin has <= 5 rows: dropped
    assert math.isnan(ordering_score(sparse, sparse))


def test_linear_r2_and_pearson():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(500, 5))
    h = x @ np.array([1.0, -2.0, 0.5, 0, 0]) + 3
    assert linear_r2(x, h) == pytest.approx(1.0, abs=1e-10)
    assert linear_r2(x, h) == linear_r2(x, h)            # deterministic split
    assert math.isnan(pearson(np.ones(5), np.arange(5)))
    assert pearson(np.arange(5), 2 * np.arange(5) + 1) == pytest.approx(1.0)


def test_pca_scores_orient_and_reconstruct():
    x, h = _entropy_line(n=300, d=5)
    p = pca(x, n=5, orient_by=h)
    assert np.allclose(p.scores @ p.components + p.mean, x, atol=1e-10)   # full rank: exact
    assert pearson(p.scores[:, 0], h) > 0
    p2 = pca(x, n=2, orient_by=-h)
    assert np.allclose(p2.scores[:, 0], -p.scores[:, 0])


def test_key_orthogonality_closed_forms():
    eye = np.eye(6)
    ko = key_orthogonality(eye)
    assert ko["mean_abs"] == 0.0 and ko["mean"] == 0.0 and ko["n_pairs"] == 30
    same = np.tile(np.array([[1.0, 2.0, 3.0]]), (4, 1))
    assert key_orthogonality(same)["mean_abs"] == pytest.approx(1.0)
    m = 5                                               # regular simplex: cos = -1/(m-1)
    simplex = np.eye(m) - 1.0 / m
    ko = key_orthogonality(simplex)
    assert ko["mean"] == pytest.approx(-1 / (m - 1)) and ko["mean_abs"] == pytest.approx(1 / (m - 1))
    assert ko["std"] == pytest.approx(0.0, abs=1e-12)
    # leading axes are groups: pairs never cross groups
    both = np.stack([eye[:3, :3], np.ones((3, 3))])
    assert key_orthogonality(both)["mean_abs"] == pytest.approx(0.5)
    # zero vectors have no direction and are excluded
    z = np.vstack([np.eye(3), np.zeros((1, 3))])
    assert key_orthogonality(z)["n_pairs"] == 6


def test_random_abs_cos_exact_and_monte_carlo():
    assert random_abs_cos(2) == pytest.approx(2 / math.pi)
    assert random_abs_cos(3) == pytest.approx(0.5)
    assert random_abs_cos(400) == pytest.approx(math.sqrt(2 / (math.pi * 400)), rel=0.01)
    rng = np.random.default_rng(5)
    d = 16
    ko = key_orthogonality(rng.normal(size=(200, 20, d)))
    se = 0.6 / math.sqrt(ko["n_pairs"] / 2)
    assert abs(ko["mean_abs"] - random_abs_cos(d)) < 4 * se


def test_as_dict():
    x, h = _entropy_line(n=200, d=4)
    d = manifold_metrics(x, h).as_dict("L0/")
    assert {"L0/pc1_share", "L0/r_pc1", "L0/r_pc5", "L0/ordering_score", "L0/r2_linear"} <= set(d)
    with pytest.raises(ValueError):
        manifold_metrics(x, h[:-1])


def test_precomputed_pca_gives_the_same_metrics():
    x, h = _entropy_line(n=300, d=6)
    a = manifold_metrics(x, h).as_dict()
    b = manifold_metrics(x, h, pca_result=pca(x, orient_by=h)).as_dict()
    assert a == b


# ---- baselines: partial R² (against sklearn), ordering-score permutation null (against Eulerian numbers)

def _sklearn_heldout_sse(a, h):
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import train_test_split
    atr, ate, htr, hte = train_test_split(a, h, test_size=0.2, random_state=42)
    return float(((hte - LinearRegression().fit(atr, htr).predict(ate)) ** 2).sum())


def test_partial_r2_matches_sklearn_and_closed_cases():
    from dyntool.manifold import partial_r2
    rng = np.random.default_rng(5)
    n = 600
    b, z = rng.normal(size=(n, 3)), rng.normal(size=(n, 4))
    h = b @ [1.0, -2.0, 0.5] + z @ [0.7, 0.0, 0.3, -0.2] + 0.3 * rng.normal(size=n)
    ref = 1 - _sklearn_heldout_sse(np.hstack([b, z]), h) / _sklearn_heldout_sse(b, h)
    assert partial_r2(z, h, b) == pytest.approx(ref, abs=1e-10)
    assert 0.5 < ref < 0.95
    # x that is a linear function of the baseline adds nothing (v = x W_V on the sticky chain)
    assert partial_r2(b @ rng.normal(size=(3, 5)), h, b) == pytest.approx(0.0, abs=1e-10)
    # the baseline explains h exactly (H_Bayes a function of position, one-hot baseline): undefined
    pos = rng.integers(0, 19, size=n)
    onehot = np.eye(19)[pos]
    assert np.isnan(partial_r2(z, np.log(20 - pos), onehot))
    assert linear_r2(onehot, np.log(20 - pos)) == pytest.approx(1.0, abs=1e-12)


def _eulerian(n, k):
    """Eulerian number A(n, k): permutations of n with k ascents (recurrence, closed form)."""
    if n == 0:
        return int(k == 0)
    if k < 0 or k >= n:
        return 0
    return (k + 1) * _eulerian(n - 1, k) + (n - k) * _eulerian(n - 1, k - 1)


def test_ordering_null_mean_is_the_eulerian_expectation():
    """With 9 equal-size bins and a PC independent of h, the 9 bin means of a shuffle are exchangeable,
    so their order is a uniform permutation: E score = Σ_k A(9, k) |2k − 8| / 8 / 9!."""
    from dyntool.manifold import ordering_null
    rng = np.random.default_rng(6)
    h = np.repeat(np.linspace(0, 1, 9), 40)
    assert np.all(np.bincount(np.digitize(h, np.linspace(0, 1.001, 10)) - 1) == 40)
    pc = rng.normal(size=h.size)
    expected = sum(_eulerian(9, k) * abs(2 * k - 8) / 8 for k in range(9)) / math.factorial(9)
    nul = ordering_null(pc, h, n_perm=4000, seed=1)
    assert nul["n_perm"] == 4000
    assert nul["mean"] == pytest.approx(expected, abs=4 * nul["std"] / math.sqrt(4000))
    # a perfectly ordered PC: nothing in the null reaches 1 (P = 2/9!), so p = 1/(1 + n_perm)
    ordered = ordering_null(h + 0.01 * rng.normal(size=h.size), h, n_perm=300)
    assert ordered["observed"] == 1.0 and ordered["p"] == pytest.approx(1 / 301)
    # the loop-free null equals the definition: ordering_score on explicitly shuffled h
    perms = np.random.default_rng(3).permuted(np.tile(np.arange(h.size), (50, 1)), axis=1)
    loop = [ordering_score(pc, h[p]) for p in perms]
    assert ordering_null(pc, h, n_perm=50, seed=3)["mean"] == pytest.approx(np.mean(loop), abs=1e-12)


def test_baseline_comparison_names_and_values():
    from dyntool.manifold import COMPARED, baseline_comparison, partial_r2
    x, h = _entropy_line(n=400)
    base = np.random.default_rng(0).normal(size=(400, 2))
    c = baseline_comparison(x, h, base, n_perm=200)
    assert set(c) == {"r2_partial", "ordering_null_mean", "ordering_null_p"} | {f"baseline_{m}" for m in COMPARED}
    assert c["r2_partial"] == pytest.approx(partial_r2(x, h, base))
    assert c["r2_partial"] > 0.99 and c["baseline_r2_linear"] < 0.1 and c["ordering_null_p"] < 0.01
    assert c["baseline_r2_linear"] == pytest.approx(linear_r2(base, h))
