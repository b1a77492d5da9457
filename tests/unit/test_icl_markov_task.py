"""The in-context Markov chain task: its Bayes-optimal predictor against independent computations,
the priors, and the strategies' KLs on constructed predictions."""
import math

import numpy as np
import pytest
import torch
from scipy import integrate

from dyntool.sims import icl_markov_task as task


def rng(seed=0):
    return np.random.default_rng(seed)


def _row_integral(n0: int, n1: int, alpha: float) -> float:
    """∫ p^n0 (1-p)^n1 Beta(α, α) dp up to the Beta normaliser (it cancels in a ratio), by
    quadrature with the Beta weight handled exactly at the end points (weight='alg')."""
    val, _ = integrate.quad(lambda p: p ** n0 * (1 - p) ** n1, 0, 1, weight="alg",
                            wvar=(alpha - 1, alpha - 1), epsabs=0, epsrel=1e-13, limit=200)
    return val


def _marginal(x: list[int], alpha: float) -> float:
    """P(x_1..x_t | x_0) for k = 2 by numerical integration over both rows (p_i = P(i -> 0)); the
    integrand is a product over the rows, so the double integral is a product of two quadratures."""
    n = np.zeros((2, 2), dtype=int)
    for a, b in zip(x[:-1], x[1:]):
        n[a, b] += 1
    return _row_integral(n[0, 0], n[0, 1], alpha) * _row_integral(n[1, 0], n[1, 1], alpha) / \
        _row_integral(0, 0, alpha) ** 2


@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.5])
def test_k2_bigram_is_the_posterior_predictive_by_numerical_integration(alpha):
    x, _ = task.sample(6, 14, 2, alpha, "dirichlet", rng(1))
    bigram = task.strategy_probs(x, 2, alpha)["bigram"]
    worst = 0.0
    for b in range(len(x)):
        seq = x[b].tolist()
        for t in range(len(seq)):
            z = _marginal(seq[:t + 1], alpha)
            for j in range(2):
                pred = _marginal(seq[:t + 1] + [j], alpha) / z
                worst = max(worst, abs(pred - float(bigram[b, t, j])))
    assert worst < 1e-6


def test_k3_bigram_matches_monte_carlo_over_sampled_chains():
    """Sequences of 5 states from the sampler (each with its own chain): for every 4-state prefix
    seen often enough, the frequency of the 5th state is the bigram predictor within 4 SE."""
    k, alpha, n = 3, 1.0, 400_000
    x, _ = task.sample(n, 5, k, alpha, "dirichlet", rng(7))
    pred = task.strategy_probs(x[:, :4], k, alpha)["bigram"][:, 3]            # (n, k) at t = 3
    key = (x[:, :4] * torch.tensor([27, 9, 3, 1])).sum(-1).numpy()
    checked, worst = 0, 0.0
    for code in np.unique(key):
        rows = np.nonzero(key == code)[0]
        if len(rows) < 500:
            continue
        p = pred[rows[0]].numpy()
        freq = np.bincount(x[rows, 4].numpy(), minlength=k) / len(rows)
        se = np.sqrt(p * (1 - p) / len(rows))
        worst = max(worst, float(np.max(np.abs(freq - p) / se)))
        checked += 1
    assert checked >= 60            # most of the 81 prefixes
    assert worst < 4.0


def test_k3_unigram_is_not_the_posterior_predictive():
    """The same Monte Carlo check rejects the unigram strategy (so the test above can fail)."""
    k, alpha, n = 3, 1.0, 200_000
    x, _ = task.sample(n, 5, k, alpha, "dirichlet", rng(8))
    uni = task.strategy_probs(x[:, :4], k, alpha)["unigram"][:, 3]
    code = (x[:, :4] * torch.tensor([27, 9, 3, 1])).sum(-1).numpy()
    rows = np.nonzero(code == 0)[0]                                  # prefix 0,0,0,0
    freq = np.bincount(x[rows, 4].numpy(), minlength=k) / len(rows)
    se = np.sqrt(uni[rows[0]].numpy() * (1 - uni[rows[0]].numpy()) / len(rows))
    assert np.max(np.abs(freq - uni[rows[0]].numpy()) / se) > 4


def test_first_state_is_uniform_and_rows_are_dirichlet():
    x, P = task.sample(40_000, 3, 3, 1.0, "dirichlet", rng(3))
    freq = np.bincount(x[:, 0].numpy(), minlength=3) / len(x)
    assert np.abs(freq - 1 / 3).max() < 4 * math.sqrt(2 / 9 / len(x))
    assert torch.allclose(P.sum(-1), torch.ones(1, dtype=torch.float64))
    # Dirichlet(1) on 3 states: each entry has mean 1/3 and variance (1/3)(2/3)/4 = 1/18
    assert abs(float(P.mean()) - 1 / 3) < 1e-3
    assert abs(float(P.var()) - 1 / 18) < 2e-3


@pytest.mark.parametrize("k", [2, 3])
def test_doubly_stochastic_prior_has_uniform_stationary_distributions(k):
    _, P = task.sample(50, 4, k, 1.0, "doubly_stochastic", rng(4))
    assert torch.allclose(P.sum(-1), torch.ones(1, dtype=torch.float64))
    assert torch.allclose(P.sum(-2), torch.ones(1, dtype=torch.float64))           # columns too
    assert np.allclose(task.stationary(P.numpy()), 1 / k)
    assert task.permutation_matrices(k).shape == (math.factorial(k), k, k)
    _, Pd = task.sample(50, 4, k, 1.0, "dirichlet", rng(4))
    assert not np.allclose(task.stationary(Pd.numpy()), 1 / k)


def test_strategies_on_a_sequence_worked_by_hand():
    """x = 0 1 1 0, k = 2, α = 1: unigram (c_j + 1)/(t + 3), bigram (N_ij + 1)/(N_i + 2)."""
    x = torch.tensor([[0, 1, 1, 0]])
    s = task.strategy_probs(x, 2, 1.0)
    assert torch.allclose(s["unigram"][0, :, 0], torch.tensor([2 / 3, 1 / 2, 2 / 5, 1 / 2], dtype=torch.float64))
    assert torch.allclose(s["bigram"][0, :, 0], torch.tensor([1 / 2, 1 / 2, 1 / 3, 1 / 3], dtype=torch.float64))
    assert torch.allclose(s["uniform"], torch.full((1, 4, 2), 0.5, dtype=torch.float64))


def test_strategy_kls_on_constructed_predictions():
    x = torch.tensor([[0, 1, 1, 0]])
    s = task.strategy_probs(x, 2, 1.0)
    # a model that predicts the bigram strategy exactly: KL to it 0; to uniform Σ_t KL(1/2 ‖ bigram_t)
    kls = task.strategy_kls(torch.log(s["bigram"]), s)
    assert kls["bigram"] == pytest.approx(0.0, abs=1e-15)
    by_hand = np.mean([0, 0, 0.5 * math.log(0.5 / (1 / 3)) + 0.5 * math.log(0.5 / (2 / 3)),
                       0.5 * math.log(0.5 / (1 / 3)) + 0.5 * math.log(0.5 / (2 / 3))])
    assert kls["uniform"] == pytest.approx(by_hand, rel=1e-12)
    # a model that predicts uniformly: KL(unigram ‖ uniform) = Σ p log(2p), by hand
    kls = task.strategy_kls(torch.log(s["uniform"]), s)
    kl_u = lambda p: p * math.log(2 * p) + (1 - p) * math.log(2 * (1 - p))   # noqa: E731
    assert kls["unigram"] == pytest.approx(np.mean([kl_u(2 / 3), 0, kl_u(2 / 5), 0]), rel=1e-12)
    assert kls["uniform"] == 0.0


def test_bayes_loss_is_the_bigram_cross_entropy():
    x = torch.tensor([[0, 1, 1, 0]])
    # next states 1, 1, 0 predicted with bigram p = 1/2, 1/2, 1/3
    assert task.bayes_loss(x, 2, 1.0) == pytest.approx(-(math.log(.5) * 2 + math.log(1 / 3)) / 3)


def test_birkhoff_prior_is_uniform_on_the_polytope():
    """k = 3: doubly stochastic and positive; uniform on the polytope means the moments of an entry
    equal those of the uniform measure on the free block's feasible set, computed here by midpoint
    quadrature over a grid of the 4 free entries (deterministic, no sampling), and every entry —
    free or completed — has the same law (the measure is invariant under row/column permutations)."""
    P = task.transition_matrices(40_000, 3, 1.0, "birkhoff", rng(2)).numpy()
    assert (P > 0).all() and np.allclose(P.sum(1), 1) and np.allclose(P.sum(2), 1)
    g = (np.arange(36) + 0.5) / 36
    a, b, c, d = np.meshgrid(g, g, g, g, indexing="ij")
    m20, m21 = 1 - a - c, 1 - b - d
    m02, m12 = 1 - a - b, 1 - c - d
    m22 = 1 - m20 - m21
    ok = (m20 > 0) & (m21 > 0) & (m02 > 0) & (m12 > 0) & (m22 > 0)
    exact = {"m00^2": (a ** 2)[ok].mean()}                    # the midpoint rule's error here is ~1e-3
    se = (P[:, 0, 0] ** 2).std() / np.sqrt(len(P))
    for (i, j) in [(0, 0), (2, 2), (2, 0), (0, 2), (1, 1)]:
        assert abs((P[:, i, j] ** 2).mean() - exact["m00^2"]) < 4 * se + 2e-3      # the grid's own error
    # the permutation mixture (dyntool's first control) is doubly stochastic but not this law
    Q = task.transition_matrices(40_000, 3, 1.0, "doubly_stochastic", rng(2)).numpy()
    assert abs((Q[:, 0, 0] ** 2).mean() - exact["m00^2"]) > 10 * se


def test_birkhoff_refuses_large_k_and_unigram_chains_have_identical_rows():
    with pytest.raises(ValueError, match="k <= 4"):
        task.transition_matrices(2, 5, 1.0, "birkhoff", rng())
    U = task.transition_matrices(100, 3, 1.0, "unigram", rng()).numpy()
    assert np.allclose(U, U[:, :1, :])
    M = task.transition_matrices(4000, 3, 1.0, "birkhoff_unigram", rng(), unigram_share=0.25).numpy()
    uni = np.all(np.isclose(M, M[:, :1, :]), axis=(1, 2))
    assert abs(uni.mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / 4000)


def test_bigram_payoff_against_the_strategies_cross_entropies():
    """The payoff is log k − CE(bigram) and CE(unigram) − CE(bigram), each CE recomputed here from
    strategy_probs on the same sequences; with one prediction the bigram estimate is uniform (0)."""
    pay = task.bigram_payoff(3, 1.0, "dirichlet", 20, 500, rng(5))
    x, _ = task.sample(500, 21, 3, 1.0, "dirichlet", rng(5))
    probs = task.strategy_probs(x, 3, 1.0)
    ce = {s: float(-torch.log(p[:, :-1].gather(-1, x[:, 1:, None])).mean()) for s, p in probs.items()}
    assert pay["over_uniform"] == pytest.approx(math.log(3) - ce["bigram"], rel=1e-9)
    assert pay["over_unigram"] == pytest.approx(ce["unigram"] - ce["bigram"], rel=1e-9)
    assert task.bigram_payoff(3, 1.0, "dirichlet", 1, 200, rng())["over_uniform"] == pytest.approx(0, abs=1e-12)
    # unigram-only chains: the bigram estimate pays less than the unigram one (it splits the counts)
    assert task.bigram_payoff(3, 1.0, "unigram", 50, 2000, rng())["over_unigram"] < 0
