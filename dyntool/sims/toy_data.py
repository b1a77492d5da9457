"""Toy attention-head task (arXiv 2512.22473, toy attention-head simulation): T one-hot positions, a few classes, 2-D q/k/v.

With x_j = e_j (d_x = T), the rows of W_Q, W_K, W_V *are* q_j, k_j, v_j, so raw 2-D geometry and
the full T×T α / B / A matrices can be plotted directly.  Training uses the batched engine
(:func:`dyntool.sims.single_head.train`) with R = 1, full-batch plain GD.

What it shows at the defaults (loss, entropy, value norms, the routing each query settles on) and
how that compares with the paper: ``docs/results.md`` (toy task).
"""
from __future__ import annotations

import torch

from dyntool.sims.single_head import init_weights

__all__ = ["toy_data", "toy_weights"]


def toy_data(T: int = 5, labels=(0, 0, 1, 1, 2)) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot inputs x (T, T) float32 (x_j = e_j) and labels y (T,) int64."""
    if len(labels) != T:
        raise ValueError(f"need {T} labels, got {len(labels)}")
    return torch.eye(T), torch.as_tensor(labels, dtype=torch.int64)


def toy_weights(T: int = 5, n_classes: int = 3, d_k: int = 2, d_v: int = 2, std: float = 0.5, seed: int = 0):
    """R=1 Weights: manual_seed(seed), then W_Q, W_K (T,d_k), W_V (T,d_v), W_O (d_v,C) ~ N(0, std²)."""
    return init_weights([seed], d_x=T, d_k=d_k, d_v=d_v, n_classes=n_classes, std=std)

