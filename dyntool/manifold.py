"""Manifold metrics (arXiv 2512.22473 / 2512.22471: diagnostics D6–D8): one implementation for the
simulations, the trainer, the figures and the app.

Input: a representation matrix ``x`` (n points × d features: values v_j, head outputs g_i, or a
residual stream, one row per probe position) and the exact posterior entropy ``h`` (n,) of each
row (H_Bayes, any unit; the metrics are scale-free in ``h``).  Everything is numpy float64 and
deterministic.

=========================  ==================================================================  =====
metric                     definition                                                           spec
=========================  ==================================================================  =====
``pc1_share``              λ_1 / Σλ, λ the eigenvalues of the covariance of ``x`` (PCA)         D6
``pc12_share``             (λ_1 + λ_2) / Σλ                                                    D6
``participation_ratio``    PR = (Σλ)² / Σλ²  (1 = one direction, d = isotropic)                 D6
``dims90`` / ``dims95``    fewest PCs whose explained variance reaches 90 % / 95 %             D6
``r_pc``                   Pearson r(PC_k, h) for k = 1..min(5, rank); each PC's sign is        D7
                           chosen so that r ≥ 0 ("sign-oriented"), so these are |r|
``r_pc1`` / ``r_best``     r_pc[0] and max_k r_pc[k]; ``best_pc`` is that k (1-based)           D7
``r2_linear``              R² of an ordinary least-squares fit h ~ x (with intercept), fitted   D7
                           on 80 % of the rows and scored on the other 20 %; the split is
                           ``sklearn.model_selection.train_test_split(random_state=42)``
``ordering_score``         entropy-ordering score of the (oriented) PC1: bin h into             D7
                           ``np.linspace(min, max + 0.001, 10)`` (9 bins), keep bins with more
                           than 5 rows, take the mean PC1 per bin in bin order, then
                           |Σ sign(diff)| / #diffs (1 = monotone; NaN with < 2 bins)
``ordering_score_best``    the same on the best-correlated PC                                   D7
=========================  ==================================================================  =====

Key orthogonality (D8), :func:`key_orthogonality`: for key vectors ``K`` (..., m, d), rows L2-
normalised, ``C = K̂ K̂ᵀ``; ``mean_abs`` is the mean of |C_ij| over ordered pairs i ≠ j (the
spec's / Paper III's "mean off-diagonal absolute cosine"), ``mean`` the signed mean (Paper I's
``offdiag_mean``), ``std`` the std of the signed off-diagonal cosines; leading axes (e.g.
sequences, heads) are averaged.  A zero key vector has no direction and is excluded.  For
independent isotropic random keys E|cos| = Γ(d/2) / (√π Γ((d+1)/2)) ≈ sqrt(2/(π d))
(:func:`random_abs_cos`), the baseline to compare with.

Degenerate input never raises: a constant ``h`` or a constant PC gives r = NaN, fewer than 10
rows give ``r2_linear`` = NaN, and so on.  Callers log NaN as JSON null.

API::

    from dyntool.manifold import manifold_metrics, key_orthogonality, pca
    m = manifold_metrics(x, h)              # -> ManifoldMetrics
    m.as_dict("resid/L3/")                  # flat {name: float}, r_pc as r_pc1..r_pc5
    p = pca(x, n=2, orient_by=h)            # scores for a scatter, oriented like the metrics
    ko = key_orthogonality(keys)            # dict(mean_abs, mean, std, n_pairs)
    c = baseline_comparison(x, h, base)     # beside R², r, ordering: baseline, partial R², null

Baselines (:func:`partial_r2`, :func:`ordering_null`, :func:`baseline_comparison`): an R² of
H_Bayes from a representation says little by itself when a trivial representation already
carries H (in the wind tunnel H is a function of position, so a position one-hot gives R² = 1;
on the sticky chain the raw input x carries part of it).  ``r2_partial`` is the held-out share
of the baseline's residual error that adding ``x`` removes; ``ordering_null_*`` is the ordering
score's permutation null (H shuffled over the rows, PC1 fixed).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .stats import pearson

__all__ = ["PCAResult", "ManifoldMetrics", "pca", "pearson", "participation_ratio",
           "ordering_score", "linear_r2", "manifold_metrics",
           "key_orthogonality", "random_abs_cos", "N_PCS", "partial_r2", "ordering_null",
           "baseline_comparison", "COMPARED"]

N_PCS = 5          # r(PC_k, H) is reported for k = 1..N_PCS
R2_SEED = 42       # the authors' split (random_state 42)


@dataclass
class PCAResult:
    scores: np.ndarray        # (n, k) projections on the first k PCs (sign-oriented if asked)
    components: np.ndarray    # (k, d) unit principal axes
    eigvals: np.ndarray       # (min(n, d),) all covariance eigenvalues, descending
    mean: np.ndarray          # (d,)

    @property
    def explained_ratio(self) -> np.ndarray:
        tot = self.eigvals.sum()
        return self.eigvals / tot if tot > 0 else np.full_like(self.eigvals, np.nan)


def _as_2d(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"representation must be (n, d), got shape {x.shape}")
    return x


def pca(x, n: int = N_PCS, orient_by=None, standardize: bool = False) -> PCAResult:
    """PCA by SVD of the centred data (exact, deterministic).  With ``orient_by`` (n,) each PC's
    sign makes its correlation with ``orient_by`` non-negative; otherwise the largest-|loading|
    coordinate of each axis is made positive.  ``standardize`` scales each feature to unit
    variance first (the optional P3 variant; constant features are left at 0)."""
    x = _as_2d(x)
    mean = x.mean(0)
    xc = x - mean
    if standardize:
        sd = xc.std(0)
        xc = xc / np.where(sd > 0, sd, 1.0)
    _, s, vt = np.linalg.svd(xc, full_matrices=False)
    eig = s ** 2 / max(x.shape[0] - 1, 1)
    k = int(min(n, vt.shape[0]))
    comp = vt[:k].copy()
    scores = xc @ comp.T
    for i in range(k):
        if orient_by is not None:
            r = pearson(scores[:, i], orient_by)
            flip = r < 0
        else:
            flip = comp[i, np.argmax(np.abs(comp[i]))] < 0
        if flip:
            comp[i] *= -1
            scores[:, i] *= -1
    return PCAResult(scores, comp, eig, mean)


def participation_ratio(eigvals) -> float:
    """(Σλ)² / Σλ² of non-negative eigenvalues; NaN if all are 0."""
    lam = np.clip(np.asarray(eigvals, dtype=np.float64), 0, None)
    s2 = float((lam ** 2).sum())
    return float(lam.sum() ** 2 / s2) if s2 > 0 else float("nan")


def ordering_score(pc, h, n_edges: int = 10, min_count: int = 5) -> float:
    """Entropy-ordering score (Paper I): monotonicity of the mean of ``pc`` over entropy bins."""
    pc, h = np.asarray(pc, dtype=np.float64), np.asarray(h, dtype=np.float64)
    edges = np.linspace(h.min(), h.max() + 0.001, n_edges)
    idx = np.digitize(h, edges) - 1            # bin i holds edges[i] <= h < edges[i+1]
    means = [pc[idx == i].mean() for i in range(n_edges - 1) if (idx == i).sum() > min_count]
    if len(means) < 2:
        return float("nan")
    d = np.sign(np.diff(means))
    return float(abs(d.sum()) / len(d))


def linear_r2(x, h, test_size: float = 0.2, seed: int = R2_SEED) -> float:
    """Held-out R² of the least-squares fit h ≈ x w + b (train/test split 80/20, ``seed``)."""
    x, h = _as_2d(x), np.asarray(h, dtype=np.float64)
    if len(h) < 10:
        return float("nan")
    from sklearn.model_selection import train_test_split
    xtr, xte, htr, hte = train_test_split(x, h, test_size=test_size, random_state=seed)
    a = np.hstack([xtr, np.ones((len(xtr), 1))])
    w, *_ = np.linalg.lstsq(a, htr, rcond=None)
    pred = np.hstack([xte, np.ones((len(xte), 1))]) @ w
    ss_tot = float(((hte - hte.mean()) ** 2).sum())
    return 1.0 - float(((hte - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")


@dataclass
class ManifoldMetrics:
    n: int
    d: int
    pc1_share: float
    pc12_share: float
    participation_ratio: float
    dims90: int
    dims95: int
    r_pc: list[float] = field(default_factory=list)    # oriented r(PC_k, H), k = 1..
    r_pc1: float = float("nan")
    r_best: float = float("nan")
    best_pc: int = 0
    r2_linear: float = float("nan")
    ordering_score: float = float("nan")
    ordering_score_best: float = float("nan")

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat ``{prefix + name: float}``; ``r_pc`` becomes ``r_pc1``..``r_pc5`` (NaN-padded)."""
        d = asdict(self)
        r = d.pop("r_pc")
        out = {f"{prefix}{k}": (float(v) if not isinstance(v, int) else v) for k, v in d.items()}
        for i in range(N_PCS):
            out[f"{prefix}r_pc{i + 1}"] = float(r[i]) if i < len(r) else float("nan")
        return out


def _dims(ratio: np.ndarray, level: float) -> int:
    c = np.cumsum(ratio)
    return int(np.searchsorted(c, level - 1e-12) + 1) if np.isfinite(c).all() and len(c) else 0


def manifold_metrics(x, h, n_pcs: int = N_PCS, standardize: bool = False,
                     r2: bool = True, pca_result: PCAResult | None = None) -> ManifoldMetrics:
    """All D6/D7 metrics of representation ``x`` (n, d) against posterior entropy ``h`` (n,).
    ``r2=False`` skips the (slower) held-out regression; ``pca_result`` reuses
    ``pca(x, n_pcs, orient_by=h, standardize=...)`` computed by the caller (e.g. for a scatter)."""
    x, h = _as_2d(x), np.asarray(h, dtype=np.float64).ravel()
    if len(h) != x.shape[0]:
        raise ValueError(f"{x.shape[0]} rows but {len(h)} entropies")
    p = pca_result if pca_result is not None else pca(x, n_pcs, orient_by=h, standardize=standardize)
    ratio = p.explained_ratio
    r = [pearson(p.scores[:, i], h) for i in range(p.scores.shape[1])]
    finite = [v if np.isfinite(v) else -1.0 for v in r]
    best = int(np.argmax(finite)) if r and max(finite) >= 0 else -1
    return ManifoldMetrics(
        n=int(x.shape[0]), d=int(x.shape[1]),
        pc1_share=float(ratio[0]) if len(ratio) else float("nan"),
        pc12_share=float(ratio[:2].sum()) if len(ratio) else float("nan"),
        participation_ratio=participation_ratio(p.eigvals),
        dims90=_dims(ratio, 0.90), dims95=_dims(ratio, 0.95),
        r_pc=r, r_pc1=r[0] if r else float("nan"),
        r_best=r[best] if best >= 0 else float("nan"), best_pc=best + 1,
        r2_linear=linear_r2(x, h) if r2 else float("nan"),
        ordering_score=ordering_score(p.scores[:, 0], h) if r else float("nan"),
        ordering_score_best=ordering_score(p.scores[:, best], h) if best >= 0 else float("nan"),
    )


def _split_fit_sse(a, h, test_size: float, seed: int) -> float:
    """Held-out SSE of the least-squares fit h ≈ a w + b on the 80/20 split of :func:`linear_r2`."""
    from sklearn.model_selection import train_test_split
    atr, ate, htr, hte = train_test_split(a, h, test_size=test_size, random_state=seed)
    w, *_ = np.linalg.lstsq(np.hstack([atr, np.ones((len(atr), 1))]), htr, rcond=None)
    return float(((hte - np.hstack([ate, np.ones((len(ate), 1))]) @ w) ** 2).sum())


def partial_r2(x, h, baseline, test_size: float = 0.2, seed: int = R2_SEED) -> float:
    """Held-out partial R² of ``h`` from ``x`` beyond ``baseline`` (n, b):
    1 − SSE(h ~ [baseline, x]) / SSE(h ~ baseline), both fitted on the same 80 % of the rows and
    scored on the same 20 % (the split of :func:`linear_r2`).  0: x adds nothing the baseline does
    not already give; it can be < 0 on held-out rows (overfitting).  NaN when the baseline already
    explains h on the held-out rows (SSE ≤ 1e-12 of the total): there is nothing left to add."""
    x, b, h = _as_2d(x), _as_2d(baseline), np.asarray(h, dtype=np.float64)
    if len(h) < 10:
        return float("nan")
    from sklearn.model_selection import train_test_split
    hte = train_test_split(h, test_size=test_size, random_state=seed)[1]
    ss_tot = float(((hte - hte.mean()) ** 2).sum())
    sse_b = _split_fit_sse(b, h, test_size, seed)
    if not ss_tot > 0 or sse_b <= 1e-12 * ss_tot:
        return float("nan")
    return 1.0 - _split_fit_sse(np.hstack([b, x]), h, test_size, seed) / sse_b


def ordering_null(pc, h, n_perm: int = 200, seed: int = 0, n_edges: int = 10, min_count: int = 5) -> dict:
    """Permutation null of :func:`ordering_score`: the score of ``pc`` against ``h`` shuffled over
    the rows, ``n_perm`` times.  Returns observed score, the null's mean and std, and the one-sided
    p = (1 + #{null ≥ observed}) / (1 + n_perm).  Shuffling keeps h's range and bin counts, so only
    the pairing of rows with bins changes: bins are computed once and permuted (vectorised)."""
    pc, h = np.asarray(pc, dtype=np.float64), np.asarray(h, dtype=np.float64)
    obs = ordering_score(pc, h, n_edges, min_count)
    nb = n_edges - 1
    edges = np.linspace(h.min(), h.max() + 0.001, n_edges)
    idx = np.clip(np.digitize(h, edges) - 1, 0, nb)            # nb = outside every bin (never counted)
    counts = np.bincount(idx, minlength=nb + 1)[:nb]
    keep = counts > min_count
    if not np.isfinite(obs) or keep.sum() < 2:
        return {"observed": obs, "mean": float("nan"), "std": float("nan"), "p": float("nan"), "n_perm": 0}
    rng = np.random.default_rng(seed)
    lab = rng.permuted(np.tile(idx, (n_perm, 1)), axis=1)          # row r: the bins of one shuffle of h
    lab += (nb + 1) * np.arange(n_perm)[:, None]                     # one bincount for all rows
    sums = np.bincount(lab.ravel(), weights=np.tile(pc, n_perm), minlength=n_perm * (nb + 1))
    means = sums.reshape(n_perm, nb + 1)[:, :nb][:, keep] / counts[keep]
    d = np.sign(np.diff(means, axis=1))
    null = np.abs(d.sum(1)) / d.shape[1]
    return {"observed": obs, "mean": float(null.mean()), "std": float(null.std(ddof=1)),
            "p": float((1 + (null >= obs - 1e-12).sum()) / (1 + n_perm)), "n_perm": int(n_perm)}


# the geometry numbers that get a baseline beside them (see baseline_comparison)
COMPARED = ("r2_linear", "r_pc1", "r_best", "ordering_score")


def baseline_comparison(x, h, baseline, n_perm: int = 200, seed: int = 0,
                        baseline_metrics: ManifoldMetrics | None = None,
                        pca_result: PCAResult | None = None) -> dict[str, float]:
    """The baselines beside ``x``'s geometry numbers against ``h``: flat dict with
    ``r2_partial`` (:func:`partial_r2` beyond ``baseline``), ``ordering_null_mean`` / ``_p``
    (:func:`ordering_null` of x's oriented PC1), and ``baseline_<m>`` for m in :data:`COMPARED`
    (the same metric of the baseline representation).  The step-0 value is the caller's (the same
    call on the untrained model).  A precomputed ``baseline_metrics`` (the baseline is often the
    same at every step) and ``pca_result`` of x (oriented by h) are reused."""
    x, h = _as_2d(x), np.asarray(h, dtype=np.float64).ravel()
    p = pca_result if pca_result is not None else pca(x, N_PCS, orient_by=h)
    bm = baseline_metrics if baseline_metrics is not None else manifold_metrics(baseline, h)
    nul = ordering_null(p.scores[:, 0], h, n_perm, seed)
    out = {"r2_partial": partial_r2(x, h, baseline), "ordering_null_mean": nul["mean"],
           "ordering_null_p": nul["p"]}
    out.update({f"baseline_{m}": float(getattr(bm, m)) for m in COMPARED})
    return out


def key_orthogonality(keys) -> dict[str, float]:
    """Off-diagonal cosine statistics of key vectors ``keys`` (..., m, d); see the module doc."""
    k = np.asarray(keys, dtype=np.float64)
    if k.ndim < 2 or k.shape[-2] < 2:
        raise ValueError(f"need at least 2 key vectors (..., m, d), got shape {k.shape}")
    k = k.reshape(-1, *k.shape[-2:])                            # (G, m, d)
    norm = np.linalg.norm(k, axis=-1, keepdims=True)
    ok = norm[..., 0] > 0                                         # (G, m)
    kh = k / np.where(norm > 0, norm, 1.0)
    c = kh @ kh.transpose(0, 2, 1)                                # (G, m, m)
    m = k.shape[1]
    pair = (~np.eye(m, dtype=bool))[None] & ok[:, :, None] & ok[:, None, :]
    vals = c[pair]
    if vals.size == 0:
        return {"mean_abs": float("nan"), "mean": float("nan"), "std": float("nan"), "n_pairs": 0}
    return {"mean_abs": float(np.abs(vals).mean()), "mean": float(vals.mean()),
            "std": float(vals.std()), "n_pairs": int(vals.size)}


def random_abs_cos(d: int) -> float:
    """E|cos| between two independent isotropic random vectors in R^d (exact)."""
    return float(math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi))
