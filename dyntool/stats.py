"""Small statistics shared by the studies, sims, figures and app, each written once: ``mean_std``,
``pearson`` and ``js_rows`` (PCA is :func:`dyntool.manifold.pca`).

Every "mean ± std" dyntool prints, plots or writes to a summary is the mean and the *sample*
standard deviation (ddof = 1, the unbiased variance estimate across seeds), ignoring NaN.
With a single finite value the std is 0 (one seed has no spread to show, and plotting code
needs a number); with none, both are NaN.
"""
from __future__ import annotations

import warnings

import numpy as np


def mean_std(x, axis: int | None = None):
    """Mean and sample std (ddof = 1) of ``x`` over ``axis`` (all values if None), NaN ignored.

    Returns floats for ``axis=None``, arrays otherwise.
    """
    a = np.asarray(x, dtype=float)
    n = np.sum(np.isfinite(a) | np.isinf(a), axis=axis)        # non-NaN count (inf counts)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)       # all-NaN slices -> NaN, quietly
        mu = np.nanmean(a, axis=axis) if a.size else np.full(np.shape(n), np.nan)
        sd = np.nanstd(a, axis=axis, ddof=1) if a.size else np.full(np.shape(n), np.nan)
    sd = np.where(n == 1, 0.0, sd)
    sd = np.where(n == 0, np.nan, sd)
    if axis is None:
        return float(mu), float(sd)
    return np.asarray(mu, dtype=float), np.asarray(sd, dtype=float)


def pearson(a, b) -> float:
    """Pearson correlation of the pairs where both are finite; NaN with fewer than 3 such pairs or
    when either side is constant (no correlation to speak of, rather than a misleading 0)."""
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return float("nan")
    a, b = a[ok] - a[ok].mean(), b[ok] - b[ok].mean()
    d = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / d) if d > 1e-300 else float("nan")


def js_rows(p, q) -> np.ndarray:
    """Jensen–Shannon divergence (nats) between matching rows (last axis) of distributions p, q;
    0 · log 0 = 0."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)

    def kl(a, b):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(a > 0, a * (np.log(np.where(a > 0, a, 1.0)) - np.log(np.where(b > 0, b, 1.0))), 0.0)
        return t.sum(-1)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)
