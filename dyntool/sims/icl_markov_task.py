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

The control prior (``prior = "doubly_stochastic"``, the paper's "unigrams carry no information"
experiment): P = Σ_σ w_σ Π_σ over the k! permutation matrices with w ~ Dirichlet(1) (Birkhoff), so
every chain's stationary distribution is uniform and in-context unigram counts are uninformative.
The bigram strategy is then the same in-context estimate (no longer exactly Bayes-optimal).
"""
from __future__ import annotations

import itertools

import numpy as np
import torch

PRIORS = ("dirichlet", "doubly_stochastic")
STRATEGIES = ("uniform", "unigram", "bigram")


def permutation_matrices(k: int) -> torch.Tensor:
    """The k! permutation matrices, (k!, k, k) float64."""
    perms = list(itertools.permutations(range(k)))
    out = torch.zeros(len(perms), k, k, dtype=torch.float64)
    for n, p in enumerate(perms):
        out[n, torch.arange(k), torch.tensor(p)] = 1.0
    return out


def transition_matrices(n: int, k: int, alpha: float, prior: str, rng: np.random.Generator) -> torch.Tensor:
    """``n`` transition matrices (n, k, k) float64 drawn from ``prior``, rows summing to 1."""
    if prior == "dirichlet":
        return torch.from_numpy(rng.dirichlet(np.full(k, float(alpha)), size=(n, k)))
    if prior == "doubly_stochastic":
        perm = permutation_matrices(k)                                          # (k!, k, k)
        w = torch.from_numpy(rng.dirichlet(np.ones(perm.shape[0]), size=n))     # (n, k!)
        return torch.einsum("np,pij->nij", w, perm)
    raise ValueError(f"unknown prior {prior!r} (one of {', '.join(PRIORS)})")


def sample(n: int, T: int, k: int, alpha: float, prior: str, rng: np.random.Generator
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of length T, each from its own chain -> (states (n, T) int64, P (n, k, k))."""
    P = transition_matrices(n, k, alpha, prior, rng)
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


def stationary(P: np.ndarray) -> np.ndarray:
    """Stationary distribution of each chain (n, k) from P (n, k, k) (left eigenvector of 1)."""
    P = np.asarray(P, dtype=float)
    out = []
    for m in P:
        w, v = np.linalg.eig(m.T)
        s = np.real(v[:, np.argmin(np.abs(w - 1))])
        out.append(s / s.sum())
    return np.array(out)
