"""Sticky Markov-chain data (arXiv 2512.22473, sticky Markov-chain task) and its Bayes reference quantities
(minimum entropy; the Bayes predictive given the whole observed prefix, by the HMM forward filter;
and, kept for comparison, the predictive from the current observation alone).

The generator follows the authors' RNG protocol literally, so that a given ``seed`` gives the
same sequence, noise and therefore the same per-seed numbers as their script under the same
torch version:

1. ``torch.manual_seed(seed)`` (done by :func:`generate`);
2. save the global RNG state, ``torch.manual_seed(embed_seed)``, draw ``mu = randn(n, d_x)``,
   restore the state (so μ is fixed across seeds and does not consume the seed's stream);
3. start symbol ``randint(n, (1,))``, then ``T-1`` calls ``multinomial(P[prev], 1)``;
4. noise ``randn(T-1, d_x)``; ``x_t = mu[y_{t-1}] + noise_t``, target ``y_t``.

Everything is in nats.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["StickyData", "transition_matrix", "h_min", "stationary", "generate", "single_observation_entropy",
           "filter_log_predictive", "filter_entropy", "filter_nll", "HELDOUT_OFFSET",
           "VALIDATION_OFFSET"]

# The held-out sequence of seed s is ``generate(s + HELDOUT_OFFSET, ...)``: the same chain and the same
# symbol means μ (drawn under embed_seed), a different path and noise.  The offset follows the
# authors' deep variant, which draws its evaluation sequence under ``manual_seed(seed + 10000)``.
HELDOUT_OFFSET = 10000
# sgd_tuned picks its learning rate on a third sequence, generate(s + VALIDATION_OFFSET): the held-out
# sequence then only reports (a pick on the reported losses would be optimistic by construction)
VALIDATION_OFFSET = 20000


def _circular_distance(i: int, j: int, n: int) -> int:
    return min(abs(i - j), n - abs(i - j))


def transition_matrix(n: int = 8, rho: float = 0.3, construction: str = "script",
                      rho_range: tuple[float, float] = (0.05, 0.9)) -> torch.Tensor:
    """Row-stochastic (n, n) float32 transition matrix with off-diagonal weights ∝ 1/circular distance.

    ``"script"`` reproduces the authors' normalisation quirk: the row is first filled with ``rho``
    on the diagonal and ``1/d`` off it, then ``row/row.sum()*(1-rho) + onehot*rho`` and renormalised.
    Because the diagonal ``rho`` is inside the first sum, the effective self-transition is
    ≈ 0.3498 for rho = 0.3, not 0.3.  ``"nominal"`` gives a diagonal of exactly ``rho``.
    Both are circulant, hence doubly stochastic (uniform stationary distribution), so every row
    has the same entropy and the Bayes predictive entropy barely varies across positions.

    ``"graded"`` (our option, for a posterior that varies): row i keeps the 1/d off-diagonal shape
    but its self-transition is ``rho_i``, spread linearly over ``rho_range`` from row 0 to row n−1,
    so rows range from nearly uniform-ish to very sticky (different entropies); not circulant, so
    the stationary law is not uniform (see :func:`stationary`).
    """
    if construction not in ("script", "nominal", "graded"):
        raise ValueError(f"construction must be 'script', 'nominal' or 'graded', got {construction!r}")
    if construction == "graded":
        lo, hi = rho_range
        P = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            r_i = lo + (hi - lo) * i / max(n - 1, 1)
            off = torch.tensor([0.0 if j == i else 1.0 / _circular_distance(i, j, n) for j in range(n)],
                               dtype=torch.float64)
            P[i] = off / off.sum() * (1 - r_i)
            P[i, i] = r_i
        return P.to(torch.float32)
    P = torch.zeros(n, n, dtype=torch.float32)
    for i in range(n):
        for j in range(n):
            if i != j:
                P[i, j] = 1.0 / _circular_distance(i, j, n)
            elif construction == "script":
                P[i, j] = rho
        onehot = (torch.arange(n) == i).float()
        # float32 row ops in this order, as in the script, so P is bit-identical to theirs
        P[i, :] = P[i, :] / P[i, :].sum() * (1 - rho) + onehot * rho
        P[i, :] = P[i, :] / P[i, :].sum()
    return P


def stationary(P: torch.Tensor) -> torch.Tensor:
    """Stationary law π (float64) of a row-stochastic P: the left eigenvector of eigenvalue 1."""
    evals, evecs = torch.linalg.eig(P.double().T)
    v = evecs[:, int((evals - 1).abs().argmin())].real
    return v / v.sum()


def h_min(P: torch.Tensor, pi: torch.Tensor | None = None) -> float:
    """H(Y_t | Y_{t-1}) = -Σ_i π_i Σ_j P_ij log(P_ij + 1e-10) (nats).  ``pi`` None: uniform π (exact
    for the circulant constructions, and bit-for-bit the authors' ``mean`` over rows)."""
    P = P.double()
    rows = -(P * torch.log(P + 1e-10)).sum(dim=1)
    return float(rows.mean() if pi is None else (pi.double() * rows).sum())


@dataclass
class StickyData:
    """One sticky-chain sequence as N = T-1 (input, target) pairs."""

    x: torch.Tensor     # (N, d_x) float32 inputs, x_t = mu[y_{t-1}] + eps_t
    y: torch.Tensor     # (N,) int64 targets y_t
    prev: torch.Tensor  # (N,) int64 previous symbols y_{t-1} (the latent that x_t encodes)
    mu: torch.Tensor    # (n, d_x) float32 symbol means (fixed by embed_seed)
    P: torch.Tensor     # (n, n) float32 transition matrix


def _draw_mu(n: int, d_x: int, embed_seed: int) -> torch.Tensor:
    """Draw μ under ``embed_seed`` without disturbing the caller's global RNG stream."""
    state = torch.get_rng_state()
    torch.manual_seed(embed_seed)
    mu = torch.randn(n, d_x)
    torch.set_rng_state(state)
    return mu


def _markov_sequence(P: torch.Tensor, T: int) -> torch.Tensor:
    """Sample y_1..y_T: uniform start, then one ``multinomial`` call per step (RNG-order exact)."""
    n = P.shape[0]
    seq = [int(torch.randint(n, (1,)).item())]
    for _ in range(T - 1):
        seq.append(int(torch.multinomial(P[seq[-1]], 1).item()))
    return torch.tensor(seq, dtype=torch.int64)


def generate(seed: int, T: int = 2000, n: int = 8, d_x: int = 20, P: torch.Tensor | None = None,
             embed_seed: int = 0, noise_std: float = 1.0) -> StickyData:
    """Generate one sequence with the authors' RNG order (see module docstring).

    ``noise_std`` scales the observation noise (x_t = μ[y_{t−1}] + noise_std·ε_t, our option; 1 is
    the authors' setting and leaves the numbers bit-identical).  Larger noise makes the latent
    y_{t−1} ambiguous from x_t, so the Bayes predictive entropy spreads across positions.
    Leaves the global torch RNG in the state right after the noise draw, as the script does.
    """
    if T < 2:
        raise ValueError(f"T must be >= 2, got {T}")
    if P is None:
        P = transition_matrix(n)
    P = P.to(torch.float32)
    torch.manual_seed(seed)
    mu = _draw_mu(P.shape[0], d_x, embed_seed)
    seq = _markov_sequence(P, T)
    noise = torch.randn(T - 1, d_x)
    if noise_std != 1.0:
        noise = noise * noise_std
    x = mu[seq[:-1]] + noise
    return StickyData(x=x, y=seq[1:].clone(), prev=seq[:-1].clone(), mu=mu, P=P)


def single_observation_entropy(x: torch.Tensor, mu: torch.Tensor, P: torch.Tensor,
                               noise_std: float = 1.0, pi: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy (nats) of p(y_t | x_t) from the CURRENT observation alone, per position, shape (N,).

    NOT the Bayes predictive of the task: the model sees x_1..x_t, and the chain makes earlier
    observations informative about y_{t-1}; that one is :func:`filter_entropy` (H_Bayes).  Kept
    under this explicit name because earlier dyntool versions (and the README's earlier varied-
    preset numbers) used it as "H_Bayes".

    Posterior over the latent y_{t-1} given x_t alone: ∝ π(y') N(x_t; mu_{y'}, noise_std² I) with
    the stationary law π as prior (``pi`` None: uniform, which cancels), computed in log space;
    predictive = posterior @ P (float64 throughout).
    """
    x, mu, P = x.double(), mu.double(), P.double()
    # log N(x; mu, σ²I) up to a constant shared by all y': -|x - mu|^2 / (2σ²)
    sq = (x[:, None, :] - mu[None, :, :]).pow(2).sum(-1)  # (N, n); exact, unlike cdist's mm path
    logits = -0.5 * sq if noise_std == 1.0 else -0.5 * sq / noise_std ** 2
    if pi is not None:
        logits = logits + torch.log(pi.double().clamp_min(1e-300))[None]
    log_post = torch.log_softmax(logits, dim=1)          # (N, n)
    pred = log_post.exp() @ P                            # (N, n)
    return -(pred * torch.log(pred.clamp_min(1e-300))).sum(dim=1)


def filter_log_predictive(x: torch.Tensor, mu: torch.Tensor, P: torch.Tensor, noise_std: float = 1.0,
                          init: torch.Tensor | None = None) -> torch.Tensor:
    """log p(y_t = j | x_1..x_t) for every position t and symbol j: the HMM forward filter, (..., N, n).

    The hidden chain is h_t = y_{t−1} (h_1 ~ ``init``; None = uniform, what :func:`generate` draws
    with ``randint``; h_{t+1} | h_t ~ P), the emission x_t | h_t ~ N(μ_{h_t}, noise_std² I), and the
    target of position t is y_t = h_{t+1}.  So the filter α_t(h) = p(h_t | x_≤t) is
    α_1 ∝ init · lik_1, α_t ∝ (α_{t−1} P) · lik_t, and the predictive is α_t P.  float64, in log
    space (a 20-dimensional Gaussian likelihood underflows in linear space); vectorised over the
    leading (batch) axes and the states, sequential over t (the recursion is).
    """
    x, mu, P = x.double(), mu.double(), P.double()
    P = P / P.sum(-1, keepdim=True)       # float32 rows sum to 1 ± 1e-7; multinomial renormalises too
    n = P.shape[0]
    sq = (x[..., :, None, :] - mu).pow(2).sum(-1)                         # (..., N, n)
    loglik = -0.5 * sq / noise_std ** 2
    logP = torch.log(P.clamp_min(1e-300))
    log_a = (torch.full((n,), -math.log(n), dtype=torch.float64) if init is None
             else torch.log(init.double().clamp_min(1e-300)))
    out = torch.empty_like(loglik)
    for t in range(loglik.shape[-2]):
        log_a = torch.log_softmax(log_a + loglik[..., t, :], dim=-1)      # α_t = p(h_t | x_≤t)
        # predictive p(h_{t+1} | x_≤t) = Σ_h α_t(h) P[h, ·], as a logsumexp
        log_a = torch.logsumexp(log_a[..., :, None] + logP, dim=-2)
        out[..., t, :] = log_a
    return out


def filter_entropy(x, mu, P, noise_std: float = 1.0, init=None) -> torch.Tensor:
    """H_Bayes: entropy (nats) of the Bayes predictive p(y_t | x_≤t) per position (forward filter)."""
    lp = filter_log_predictive(x, mu, P, noise_std, init)
    return -(lp.exp() * lp).sum(-1)


def filter_nll(x, mu, P, y: torch.Tensor, noise_std: float = 1.0, init=None) -> torch.Tensor:
    """Bayes NLL −log p(y_t | x_≤t) per position: the loss of the Bayes-optimal causal predictor on
    the task the model is trained on (target y_t at position t; its mean is the Bayes loss)."""
    lp = filter_log_predictive(x, mu, P, noise_std, init)
    return -lp.gather(-1, y.long()[..., None])[..., 0]


def log_uniform(n: int = 8) -> float:
    """Entropy of the uniform predictor, log n (2.0794 nats for n = 8)."""
    return math.log(n)
