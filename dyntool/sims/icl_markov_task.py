"""The in-context Markov chain task (ICL-MC; Edelman et al. 2024, arXiv 2402.11004) and its strategies.

Every sequence has its own k-state Markov chain: each row of the transition matrix P is drawn
independently from Dirichlet(α·1) (``prior = "dirichlet"``), the first state uniformly from the k
states, then T − 1 transitions.  Given x_0..x_t the model predicts x_{t+1} at every position t.

The first state is uniform (the authors draw it from the chain's stationary distribution, which
ties x_0 to the rows and so couples their posteriors): with a uniform x_0 the rows' posteriors are
independent Dirichlets and the in-context bigram estimate below is *exactly* the posterior
predictive (docs/icl_markov_differences.md).

Three strategies, each a (B, T, k) next-state distribution at every position t (0-based; the
prefix x_0..x_t has t + 1 states):

* ``uniform``: 1/k;
* ``unigram``: in-context unigram, ``(c_j + α) / (t + 1 + kα)`` with c_j the count of state j in
  x_0..x_t;
* ``bigram``: in-context bigram, ``(N_ij + α) / (N_i + kα)`` for the current state i = x_t,
  N_ij the count of transitions i → j in x_0..x_t and N_i = Σ_j N_ij (the Bayes-optimal predictor
  under the Dirichlet prior).

Priors without informative unigrams (every chain doubly stochastic, so its stationary
distribution is uniform); the bigram strategy is then the same in-context estimate, no longer
exactly Bayes-optimal:

* ``doubly_stochastic`` (dyntool's first control): P = Σ_σ w_σ Π_σ over the k! permutation matrices
  with w ~ Dirichlet(1).  Not uniform on the Birkhoff polytope, and its rows are less concentrated
  than the other priors' (its bigram payoff, :func:`bigram_payoff`, is the smallest);
* ``birkhoff`` (the authors' control, as read in their repository's ``datasets.py``,
  ``doubly_stochastic_3``): uniform (Lebesgue) on the Birkhoff polytope, by rejection: the top-left
  (k−1)×(k−1) block uniform on [0, 1], the last row and column completing the sums, kept when every
  entry is positive.  The acceptance rate falls fast with k, so k ≤ 4 (as the authors' code);
* ``unigram``: every row the same r ~ Dirichlet(α·1) (the authors' ``unigram_3``): only the
  unigram strategy pays;
* ``birkhoff_unigram``: the authors' contrast — each chain ``unigram`` with probability
  ``unigram_share``, else ``birkhoff`` (drawn fresh; their ``mixture`` reuses a finite list of the
  first kind, docs/icl_markov_differences.md).
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

PRIORS = ("dirichlet", "doubly_stochastic", "birkhoff", "unigram", "birkhoff_unigram")
BIRKHOFF_MAX_K = 4     # the rejection sampler accepts ~1/k!-ish of its draws: slow beyond 4
STRATEGIES = ("uniform", "unigram", "bigram")


def permutation_matrices(k: int) -> torch.Tensor:
    """The k! permutation matrices, (k!, k, k) float64."""
    perms = list(itertools.permutations(range(k)))
    out = torch.zeros(len(perms), k, k, dtype=torch.float64)
    for n, p in enumerate(perms):
        out[n, torch.arange(k), torch.tensor(p)] = 1.0
    return out


def birkhoff(n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """``n`` matrices uniform on the Birkhoff polytope of k × k doubly stochastic matrices (float64).

    The polytope is the image of the (k−1)² free entries of the top-left block (the rest follow
    from the row and column sums) intersected with "every entry > 0"; a uniform point of the cube
    kept when the completed matrix is positive is uniform on that image (rejection sampling)."""
    if k > BIRKHOFF_MAX_K:
        raise ValueError(f"the birkhoff prior's rejection sampler is for k <= {BIRKHOFF_MAX_K}, got k = {k}")
    out, have = np.empty((n, k, k)), 0
    while have < n:
        m = np.empty((max(4 * (n - have), 64), k, k))
        m[:, :-1, :-1] = rng.random((len(m), k - 1, k - 1))
        m[:, -1, :-1] = 1.0 - m[:, :-1, :-1].sum(1)                     # column sums
        m[:, :, -1] = 1.0 - m[:, :, :-1].sum(2)                         # row sums (the corner last)
        ok = m[(m > 0).all(axis=(1, 2))][: n - have]
        out[have:have + len(ok)] = ok
        have += len(ok)
    return torch.from_numpy(out)


def transition_matrices(n: int, k: int, alpha: float, prior: str, rng: np.random.Generator,
                        unigram_share: float = 0.5) -> torch.Tensor:
    """``n`` transition matrices (n, k, k) float64 drawn from ``prior``, rows summing to 1."""
    if prior == "dirichlet":
        return torch.from_numpy(rng.dirichlet(np.full(k, float(alpha)), size=(n, k)))
    if prior == "doubly_stochastic":
        perm = permutation_matrices(k)                                          # (k!, k, k)
        w = torch.from_numpy(rng.dirichlet(np.ones(perm.shape[0]), size=n))     # (n, k!)
        return torch.einsum("np,pij->nij", w, perm)
    if prior == "birkhoff":
        return birkhoff(n, k, rng)
    if prior == "unigram":
        r = rng.dirichlet(np.full(k, float(alpha)), size=n)                     # (n, k)
        return torch.from_numpy(np.repeat(r[:, None, :], k, axis=1))
    if prior == "birkhoff_unigram":
        uni = rng.random(n) < unigram_share
        P = birkhoff(n, k, rng)
        P[torch.from_numpy(uni)] = transition_matrices(int(uni.sum()), k, alpha, "unigram", rng)
        return P
    raise ValueError(f"unknown prior {prior!r} (one of {', '.join(PRIORS)})")


def sample(n: int, T: int, k: int, alpha: float, prior: str, rng: np.random.Generator,
           unigram_share: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of length T, each from its own chain -> (states (n, T) int64, P (n, k, k))."""
    P = transition_matrices(n, k, alpha, prior, rng, unigram_share)
    x = np.empty((n, T), dtype=np.int64)
    x[:, 0] = rng.integers(k, size=n)                                           # uniform first state
    u = rng.random((n, T))
    cdf = P.numpy().cumsum(-1)                                                  # (n, k, k)
    cdf[..., -1] = 1.0
    rows = np.arange(n)
    for t in range(1, T):
        x[:, t] = (u[:, t, None] > cdf[rows, x[:, t - 1]]).sum(-1)
    return torch.from_numpy(x), P


def strategy_probs(x: torch.Tensor, k: int, alpha: float) -> dict[str, torch.Tensor]:
    """The three strategies' next-state distributions at every position: name -> (B, T, k) float64."""
    B, T = x.shape
    oh = torch.nn.functional.one_hot(x, k).double()                             # (B, T, k)
    counts = oh.cumsum(1)                                                       # c_j over x_0..x_t
    t1 = torch.arange(1, T + 1, dtype=torch.float64).view(1, T, 1)
    unigram = (counts + alpha) / (t1 + k * alpha)
    # transitions i -> j seen up to t: pairs (x_{s-1}, x_s) for s = 1..t
    pair = oh[:, :-1, :, None] * oh[:, 1:, None, :]                             # (B, T-1, k, k)
    N = torch.cat([torch.zeros(B, 1, k, k, dtype=torch.float64), pair.cumsum(1)], 1)   # (B, T, k, k)
    row = (N * oh[..., :, None]).sum(-2)                                        # N_{x_t, j}: (B, T, k)
    bigram = (row + alpha) / (row.sum(-1, keepdim=True) + k * alpha)
    return {"uniform": torch.full((B, T, k), 1.0 / k, dtype=torch.float64), "unigram": unigram,
            "bigram": bigram}


def kl(p: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) per position from p (…, k) and log q (…, k), float64, 0·log 0 = 0."""
    p = p.double()
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(1e-300)), torch.zeros_like(p))
    return (plogp - p * logq.double()).sum(-1)


def strategy_kls(logq: torch.Tensor, strategies: dict[str, torch.Tensor]) -> dict[str, float]:
    """KL(strategy ‖ model) averaged over positions and sequences, per strategy (nats)."""
    return {name: float(kl(p, logq).mean()) for name, p in strategies.items()}


def bayes_loss(x: torch.Tensor, k: int, alpha: float) -> float:
    """The bigram strategy's mean cross-entropy on the observed next states of ``x`` (nats): the
    Bayes-optimal loss on these sequences under the Dirichlet prior."""
    p = strategy_probs(x, k, alpha)["bigram"][:, :-1]
    return float(-torch.log(p.gather(-1, x[:, 1:, None])).mean())


def bigram_payoff(k: int, alpha: float, prior: str, T: int, n: int, rng: np.random.Generator,
                  unigram_share: float = 0.5) -> dict[str, float]:
    """What the in-context bigram estimate pays under ``prior``, by Monte Carlo over ``n`` sampled
    sequences of T predictions: mean cross-entropy (nats) of the uniform, unigram and bigram
    strategies on the observed next states, and the bigram's gain over the other two
    (``over_uniform`` = log k − CE_bigram; ``over_unigram`` = CE_unigram − CE_bigram), each with its
    standard error over sequences.  A prior whose payoff is small gives the bigram solution a weak
    signal, so transition times under two priors compare only at matched payoffs."""
    x, _ = sample(n, T + 1, k, alpha, prior, rng, unigram_share)
    probs = strategy_probs(x, k, alpha)
    nxt = x[:, 1:, None]
    ce = {s: -torch.log(p[:, :-1].gather(-1, nxt)).squeeze(-1).mean(1) for s, p in probs.items()}   # (n,)
    out = {f"ce_{s}": float(v.mean()) for s, v in ce.items()}
    for name, ref in (("over_uniform", "uniform"), ("over_unigram", "unigram")):
        d = ce[ref] - ce["bigram"]
        out[name], out[name + "_se"] = float(d.mean()), float(d.std() / np.sqrt(n))
    return out


def stationary(P: np.ndarray) -> np.ndarray:
    """Stationary distribution of each chain (n, k) from P (n, k, k) (left eigenvector of 1)."""
    P = np.asarray(P, dtype=float)
    out = []
    for m in P:
        w, v = np.linalg.eig(m.T)
        s = np.real(v[:, np.argmin(np.abs(w - 1))])
        out.append(s / s.sum())
    return np.array(out)
