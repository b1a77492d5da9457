"""Summary statistics shared by the studies, figures and app: one ``mean_std``.

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
