"""Derived numbers the pages show: block pooling, PCA bases, head outputs, seed bands.

Pure numpy/scikit-learn, no Streamlit, so the benchmark and tests can call them directly.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dyntool.manifold import pca
from dyntool.stats import mean_std


def block_mean(x: np.ndarray, block: int, visible: np.ndarray | None = None) -> np.ndarray:
    """Mean over ``block × block`` tiles of a 2-D array over its visible entries (``visible``; by
    default the finite ones, so NaN marks masked entries); edge tiles average what they hold;
    all-masked tiles stay NaN.  The one pooling function of dyntool
    (:func:`dyntool.record.pooling.pool_blocks`)."""
    if block <= 1:
        return x
    from dyntool.record.pooling import pool_blocks  # deferred: keeps torch off the app until a matrix is pooled
    x = np.asarray(x, dtype=np.float32)
    return pool_blocks(x, block, np.isfinite(x) if visible is None else np.asarray(visible, dtype=bool))


def display_block(n: int, max_cells: int) -> int:
    """Smallest block so that ``n`` entries pool into at most ``max_cells``."""
    return max(1, math.ceil(n / max_cells))


@dataclass
class Basis:
    """A PCA basis fitted once per run (never per step)."""
    mean: np.ndarray          # (d,)
    components: np.ndarray    # (k, d)
    explained: np.ndarray     # (k,) explained-variance ratios
    fitted_on: str

    def project(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) @ self.components.T


def fit_basis(x: np.ndarray, k: int = 3, fitted_on: str = "") -> Basis:
    """PCA of the finite rows of ``x`` (n, d) (:func:`dyntool.manifold.pca`); each axis' largest
    |loading| is positive, so the picture does not flip between runs."""
    x = x[np.isfinite(x).all(axis=1)]
    p = pca(x, n=max(1, min(k, x.shape[1], len(x))))
    k = p.components.shape[0]
    return Basis(p.mean, p.components, p.explained_ratio[:k], fitted_on)


def head_outputs(attn: np.ndarray, values: np.ndarray, key_offset: int = 0) -> np.ndarray:
    """g_i = Σ_j α_ij v_j for the recorded queries: attn (n, q, k) over keys
    [key_offset, key_offset + k) and values (n, T, d)."""
    v = values[:, key_offset:key_offset + attn.shape[-1]]
    return np.einsum("nqk,nkd->nqd", np.nan_to_num(attn), v)


def dominant_users(attn: np.ndarray, query_offset: int, key_offset: int, n_keys: int) -> np.ndarray:
    """For each key j: the query that attends to it most (attn (q, k), crop offsets); −1 where the
    key lies outside the recorded crop."""
    out = np.full(n_keys, -1, dtype=np.int64)
    top = np.nanargmax(np.nan_to_num(attn, nan=-1.0), axis=0) + query_offset
    out[key_offset:key_offset + attn.shape[1]] = top
    return out


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested config → ``{"model.n_layer": 4, ...}``."""
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


SEED_KEYS = ("seed",)          # what varies between the seeds of one config (never a grouping)
NO_GROUP = "(each run on its own)"
SAME_CONFIG = "(same config, seeds pooled)"


def _comparable(k: str) -> bool:
    return not k.startswith("record.") and k not in SEED_KEYS


def differing_keys(configs: list[dict]) -> list[str]:
    """Flattened config keys whose values differ across runs (candidates for grouping)."""
    flats = [flatten(c) for c in configs]
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys if _comparable(k) and len({repr(f.get(k)) for f in flats}) > 1]


def config_identity(config: dict, ignore: str | None = None) -> str:
    """The config with its seed, record settings and ``ignore`` left out: two runs with the same
    identity are seeds of one experiment (the only runs a mean ± std band may pool)."""
    flat = flatten(config)
    return repr(sorted((k, repr(v)) for k, v in flat.items() if _comparable(k) and k != ignore))


def _only_seeds_within(configs: list[dict], key: str) -> bool:
    """Whether grouping by ``key`` puts together only runs that differ in nothing but the seed."""
    groups: dict[str, set[str]] = {}
    for c in configs:
        groups.setdefault(repr(flatten(c).get(key)), set()).add(config_identity(c, ignore=key))
    return all(len(ids) == 1 for ids in groups.values())


GROUP_FIRST = ("arm", "model.attention", "value_lr_mult", "variant")   # study axes, in order of preference


def default_grouping(configs: list[dict], folders: list) -> str:
    """The grouping Compare starts with.  A study axis (``GROUP_FIRST``) or, in one study folder,
    the only differing key, but only where each of its groups holds seeds of one config: a key that
    merely happens to match (two unrelated models both on ``sdpa``) must not pool them into one
    band.  Else seeds of one config pooled when some runs are seeds, else each run on its own."""
    keys = differing_keys(configs)
    for k in GROUP_FIRST:
        if k in keys and _only_seeds_within(configs, k):
            return k
    if len(keys) == 1 and len(set(map(str, folders))) == 1:
        return keys[0]
    identities = [config_identity(c) for c in configs]
    return SAME_CONFIG if len(set(identities)) < len(identities) else NO_GROUP


def n_drops(band: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(step, n before, n from there on) wherever fewer runs reach a step than reached the one
    before it: the band's mean jumps there, and the plot must say so."""
    n = band["n"].to_numpy()
    steps = band.index.to_numpy()
    return [(int(steps[i]), int(n[i - 1]), int(n[i])) for i in range(1, len(n)) if n[i] < n[i - 1]]


def band(curves: list[pd.Series]) -> pd.DataFrame:
    """Mean ± std across runs of curves indexed by step; ``n`` = runs with a value at that step
    (steps where some runs stopped early are averaged over the runs that reached them)."""
    df = pd.concat(curves, axis=1, join="outer").sort_index()
    return pd.DataFrame({"mean": df.mean(axis=1), "std": mean_std(df.to_numpy(float), axis=1)[1],
                         "n": df.count(axis=1)}, index=df.index)


def ema(s: pd.Series, weight: float) -> pd.Series:
    return s if weight <= 0 else s.ewm(alpha=1 - weight).mean()


def even_subset(n: int, k: int) -> np.ndarray:
    """``k`` evenly spaced indices of ``range(n)``, always including the first and last."""
    if n <= k:
        return np.arange(n)
    return np.unique(np.round(np.linspace(0, n - 1, k)).astype(int))
