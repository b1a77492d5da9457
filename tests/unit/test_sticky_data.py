"""Sticky Markov-chain data: transition matrix, H_min, RNG protocol, Bayes predictive entropy."""
import math

import numpy as np
import pytest
import torch

import itertools

from dyntool.sims.sticky_data import (filter_entropy, filter_log_predictive, filter_nll, generate, h_min,
                                     single_observation_entropy, stationary, transition_matrix)


@pytest.mark.parametrize("construction,diag", [("script", 0.34980), ("nominal", 0.3)])
def test_transition_matrix_is_doubly_stochastic_with_expected_diagonal(construction, diag):
    P = transition_matrix(8, 0.3, construction)
    assert P.dtype == torch.float32 and P.shape == (8, 8)
    assert torch.allclose(P.sum(1), torch.ones(8), atol=1e-6)
    assert torch.allclose(P.sum(0), torch.ones(8), atol=1e-6)
    assert torch.allclose(P.diagonal(), torch.full((8,), diag), atol=1e-5)
    for i in range(8):  # circulant: every row is row 0 shifted
        assert torch.allclose(P[i], torch.roll(P[0], i), atol=1e-7)


def test_script_row_matches_the_published_quirk():
    expected = [0.34980, 0.16601, 0.08300, 0.05534, 0.04150, 0.05534, 0.08300, 0.16601]
    assert torch.allclose(transition_matrix()[0], torch.tensor(expected), atol=1e-5)


def test_script_construction_is_parametrised_by_rho():
    P = transition_matrix(8, 0.5, "script")
    assert P[0, 0] > 0.5  # the quirk inflates the diagonal for any rho
    assert torch.allclose(transition_matrix(8, 0.5, "nominal").diagonal(), torch.full((8,), 0.5))


def test_h_min_values():
    assert h_min(transition_matrix()) == pytest.approx(1.8292, abs=1e-4)
    assert h_min(transition_matrix(construction="nominal")) == pytest.approx(1.8833, abs=1e-4)


def test_unknown_construction_raises():
    with pytest.raises(ValueError):
        transition_matrix(construction="other")


def _literal_generate(seed, T, P, d_x=20, embed_seed=0):
    """Independent re-implementation of the authors' order of RNG calls."""
    torch.manual_seed(seed)
    state = torch.get_rng_state()
    torch.manual_seed(embed_seed)
    mu = torch.randn(P.shape[0], d_x)
    torch.set_rng_state(state)
    seq = [torch.randint(P.shape[0], (1,)).item()]
    for _ in range(T - 1):
        seq.append(torch.multinomial(P[seq[-1]], 1).item())
    seq = torch.tensor(seq)
    x = mu[seq[:-1]] + torch.randn(T - 1, d_x)
    return x, seq[1:], seq[:-1], mu


@pytest.mark.parametrize("seed", [42, 1337])
def test_generate_follows_the_literal_rng_protocol(seed):
    P = transition_matrix()
    d = generate(seed, T=60, P=P)
    x, y, prev, mu = _literal_generate(seed, 60, P)
    assert d.x.shape == (59, 20) and d.y.dtype == torch.int64 and d.prev.dtype == torch.int64
    assert torch.equal(d.x, x) and torch.equal(d.y, y) and torch.equal(d.prev, prev)
    assert torch.equal(d.mu, mu)
    assert torch.equal(d.prev[1:], d.y[:-1])
    # the global stream continues exactly where the literal version's does
    after = torch.rand(3)
    _literal_generate(seed, 60, P)
    assert torch.equal(after, torch.rand(3))


def test_mu_is_fixed_across_seeds_and_seeds_differ():
    a, b = generate(1, T=30), generate(2, T=30)
    assert torch.equal(a.mu, b.mu)
    torch.manual_seed(0)
    assert torch.equal(a.mu, torch.randn(8, 20))
    assert not torch.equal(a.x, b.x)


def test_single_observation_entropy_matches_numpy_brute_force():
    d = generate(7, T=40)
    x, mu, P = d.x.double().numpy(), d.mu.double().numpy(), d.P.double().numpy()
    expected = []
    for t in range(x.shape[0]):
        lik = np.array([math.exp(-0.5 * np.sum((x[t] - mu[k]) ** 2) + 20.0) for k in range(8)])
        post = lik / lik.sum()
        pred = post @ P
        expected.append(-np.sum(pred * np.log(pred)))
    H = single_observation_entropy(d.x, d.mu, d.P)
    assert H.shape == (39,)
    np.testing.assert_allclose(H.numpy(), expected, rtol=1e-9, atol=1e-12)
    assert (H >= h_min(d.P) - 1e-6).all() and (H <= math.log(8) + 1e-9).all()


def _brute_force_predictive(x, mu, P, sigma, init):
    """p(y_t | x_1..x_t) by summing the joint over EVERY hidden path h_1..h_t (no recursion):
    p(h_1..t, x_1..t) = init(h_1) Π_s N(x_s; μ_{h_s}, σ²I) Π_s P[h_s, h_{s+1}], then ×P[h_t, y_t]."""
    n, N = P.shape[0], x.shape[0]
    out = np.zeros((N, n))
    for t in range(1, N + 1):
        num = np.zeros(n)
        for path in itertools.product(range(n), repeat=t):
            w = init[path[0]]
            for s, h in enumerate(path):
                w *= np.exp(-np.sum((x[s] - mu[h]) ** 2) / (2 * sigma ** 2))
                if s:
                    w *= P[path[s - 1], h]
            num += w * P[path[-1]]
        out[t - 1] = num / num.sum()
    return out


@pytest.mark.parametrize("sigma,use_pi", [(1.0, False), (1.7, True)])
def test_forward_filter_matches_enumeration_over_all_hidden_paths(sigma, use_pi):
    P = transition_matrix(3, construction="graded", rho_range=(0.1, 0.8))
    d = generate(3, T=7, n=3, d_x=2, P=P, noise_std=sigma)             # 6 observations, 3 states
    init = stationary(P) if use_pi else None
    x, mu, Pn = d.x.double().numpy(), d.mu.double().numpy(), P.double().numpy()
    Pn = Pn / Pn.sum(1, keepdims=True)                 # the law multinomial samples from
    ref = _brute_force_predictive(x, mu, Pn, sigma, init.numpy() if use_pi else np.full(3, 1 / 3))
    lp = filter_log_predictive(d.x, d.mu, P, sigma, init)
    assert lp.shape == (6, 3) and lp.dtype == torch.float64
    np.testing.assert_allclose(lp.exp().numpy(), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(filter_entropy(d.x, d.mu, P, sigma, init).numpy(),
                               -(ref * np.log(ref)).sum(1), rtol=0, atol=1e-12)
    np.testing.assert_allclose(filter_nll(d.x, d.mu, P, d.y, sigma, init).numpy(),
                               -np.log(ref[np.arange(6), d.y.numpy()]), rtol=0, atol=1e-12)
    # the first position has seen one observation: the filter and the single-observation predictive
    # agree (to 1e-7: the latter uses the float32 rows of P as they are, the filter renormalises them)
    one = single_observation_entropy(d.x, d.mu, P, sigma, init)
    assert float(one[0]) == pytest.approx(float(filter_entropy(d.x, d.mu, P, sigma, init)[0]), abs=1e-7)
    assert abs(float(one[-1]) - float(filter_entropy(d.x, d.mu, P, sigma, init)[-1])) > 1e-4


def test_forward_filter_is_batched_and_uses_the_history():
    P = transition_matrix(8, construction="graded")
    a, b = generate(1, T=300, P=P, noise_std=2.0), generate(2, T=300, P=P, noise_std=2.0)
    both = filter_entropy(torch.stack([a.x, b.x]), a.mu, P, 2.0)
    torch.testing.assert_close(both[1], filter_entropy(b.x, b.mu, P, 2.0), rtol=0, atol=1e-12)
    # with ambiguous observations the history is informative: the filter's NLL is lower on average
    one = single_observation_entropy(a.x, a.mu, P, 2.0, stationary(P))
    assert float(filter_entropy(a.x, a.mu, P, 2.0).mean()) < float(one.mean()) - 0.05
