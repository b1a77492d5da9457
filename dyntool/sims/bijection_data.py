"""The bijection in-context task of the Bayesian wind tunnel (Paper I, arXiv 2512.22471).

Each sequence draws a fresh random bijection π of {0..V-1} (so nothing about π can be memorised;
only in-context inference helps), L keys x_1..x_L (without replacement by default, so they are
distinct), and a query q drawn from the context keys::

    tokens   x_1  V+π(x_1)  x_2  V+π(x_2)  ...  x_L  V+π(x_L)  q          (length T = 2L + 1)
    target   π(x_1)   ·     π(x_2)   ·     ...  π(x_L)   ·     π(q)       (value classes 0..V-1)

Keys use token ids 0..V-1 and values V..2V-1 (separate vocabularies, the authors' setup).  The
model predicts at the L key positions 0, 2, .., 2L-2 and at the query position 2L.

Exact posterior (uniform prior over bijections): at key position k (1-based) the k-1 pairs seen
rule out k-1 values, so without replacement the posterior over π(x_k) is uniform on V-k+1 values
and ``H_Bayes(k) = log(V - k + 1)`` nats; at the query (a key already seen) it is a point mass,
H = 0.  :func:`posterior_entropy` computes it for any sequence (with or without replacement)
from the posterior support, independently of that closed form (:func:`bayes_entropy`).
"""
from __future__ import annotations

import math

import numpy as np
import torch

IGNORE = -100


def seq_len(L: int) -> int:
    return 2 * L + 1


def target_positions(L: int) -> np.ndarray:
    """Positions that carry a target: the L key positions, then the query position."""
    return np.r_[np.arange(0, 2 * L, 2), 2 * L]


def sample(n: int, V: int, L: int, generator: torch.Generator, with_replacement: bool = False):
    """``n`` sequences -> (tokens (n, 2L+1) int64, targets (n, 2L+1) int64, IGNORE off-target), drawn
    on the generator's device (a CUDA generator: no host→device copy; its stream differs from the CPU's)."""
    if not with_replacement and L > V:
        raise ValueError(f"L={L} distinct keys need V >= L (V={V})")
    dev = generator.device
    perm = torch.rand(n, V, generator=generator, device=dev).argsort(-1)                  # π: (n, V)
    if with_replacement:
        keys = torch.randint(V, (n, L), generator=generator, device=dev)
    else:
        keys = torch.rand(n, V, generator=generator, device=dev).argsort(-1)[:, :L]       # (n, L) distinct
    qi = torch.randint(L, (n, 1), generator=generator, device=dev)
    q = keys.gather(1, qi)                                                       # (n, 1)
    vals = perm.gather(1, keys)                                                  # (n, L)
    T = seq_len(L)
    tok = torch.empty(n, T, dtype=torch.long, device=dev)
    tok[:, 0:2 * L:2] = keys
    tok[:, 1:2 * L:2] = vals + V
    tok[:, 2 * L] = q[:, 0]
    tgt = torch.full((n, T), IGNORE, dtype=torch.long, device=dev)
    tgt[:, 0:2 * L:2] = vals
    tgt[:, 2 * L] = perm.gather(1, q)[:, 0]
    return tok, tgt


def bayes_entropy(V: int, L: int) -> np.ndarray:
    """Closed form, without replacement, query from context: (L+1,) nats at the target positions,
    ``log(V - k + 1)`` for k = 1..L, then 0 at the query."""
    return np.r_[[math.log(V - k + 1) for k in range(1, L + 1)], 0.0]


def posterior_entropy(tokens, V: int) -> np.ndarray:
    """Exact posterior entropy (nats) of the target at every target position of each sequence,
    computed from the posterior's support: if the key was seen before, the posterior is a point
    mass (0); otherwise it is uniform over the values not yet used (log of their number).
    ``tokens`` (n, 2L+1) -> (n, L+1)."""
    tok = np.asarray(tokens)
    n, T = tok.shape
    L = (T - 1) // 2
    out = np.zeros((n, L + 1))
    for b in range(n):
        seen_keys, used = set(), set()
        for k in range(L):
            key, val = int(tok[b, 2 * k]), int(tok[b, 2 * k + 1]) - V
            out[b, k] = 0.0 if key in seen_keys else math.log(V - len(used))
            seen_keys.add(key)
            used.add(val)
        q = int(tok[b, 2 * L])
        out[b, L] = 0.0 if q in seen_keys else math.log(V - len(used))
    return out


def bayes_accuracy(V: int, L: int) -> tuple[float, float]:
    """(mean Bayes-optimal accuracy at the key positions, at the query) without replacement."""
    return float(np.mean([1.0 / (V - k + 1) for k in range(1, L + 1)])), 1.0
