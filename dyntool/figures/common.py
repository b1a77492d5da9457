"""Helpers shared by the figure modules: reading runs and studies, aligning curves, JS divergence."""
from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from .. import stats
from ..location import URLPath
from ..run import study_summary
from ..storage import open_backend
from .registry import FigureSkip

LOG8 = math.log(8)


def need(cond, msg: str) -> None:
    if not cond:
        raise FigureSkip(msg)


# -- studies -----------------------------------------------------------------------------------

def where(run) -> Path | URLPath:
    """A run's folder as a path object (a local :class:`Path` or an object-store :class:`URLPath`)."""
    return run.path if isinstance(run.path, (Path, URLPath)) else Path(run.path)


@lru_cache(maxsize=64)
def _read_summary(folder: str, signature: tuple) -> dict:
    return study_summary(folder)            # cached per file version: figures ask once per run


def summary_of(run) -> dict:
    """The ``summary.json`` of the study directory holding ``run`` ({} if none or unreadable), read
    by :func:`dyntool.run.study_summary` for a local folder and object storage alike, again only
    when its backend's signature of it changes."""
    folder = where(run).parent
    return _read_summary(str(folder), open_backend(folder).signature(("summary.json",)))


def by_parent(runs: list) -> dict[Path, list]:
    """Runs grouped by their directory (a study), in first-seen order."""
    out: dict[Path, list] = {}
    for r in runs:
        out.setdefault(where(r).parent, []).append(r)
    return out


def first_study(runs: list) -> list:
    """The runs of the first study (parent directory) among ``runs``."""
    return next(iter(by_parent(runs).values())) if runs else []


_SEED_ARM = re.compile(r"seed(-?\d+)-(.+)$")


def seed_arm(run) -> tuple[int, str]:
    """(seed, arm) of a sticky-study run: config keys, else the ``seed{S}-{arm}`` directory name.
    A value-LR sweep run (``seed{S}-em-x{m}``) keeps its directory suffix as its arm."""
    cfg = run.config or {}
    m = _SEED_ARM.match(where(run).name)
    seed = cfg.get("seed", int(m.group(1)) if m else 0)
    arm = cfg.get("arm", m.group(2) if m else "?")
    if m and m.group(2) != arm:
        arm = m.group(2)
    return int(seed), str(arm)


def is_sweep(run) -> bool:
    """A value-LR sweep run of a sticky study (``seed{S}-em-x{m}``): losses only, not an arm."""
    m = _SEED_ARM.match(where(run).name)
    return bool(m) and m.group(2) != (run.config or {}).get("arm", m.group(2))


def main_study(runs: list) -> list:
    """The runs of the first study, without its value-LR sweep runs."""
    return [r for r in first_study(runs) if not is_sweep(r)]


def arms_of(runs: list) -> dict[str, list]:
    """arm -> runs sorted by seed; arms in the order sgd, em(_like), em_closed_form, others."""
    out: dict[str, list] = {}
    for r in runs:
        out.setdefault(seed_arm(r)[1], []).append(r)
    order = {"sgd": 0, "em": 1, "em_like": 1, "em_closed_form": 2}
    return {a: sorted(out[a], key=lambda r: seed_arm(r)[0])
            for a in sorted(out, key=lambda a: (order.get(a, 9), a))}


def is_em(arm: str) -> bool:
    return arm in ("em", "em_like")


# -- metrics and arrays ------------------------------------------------------------------------

def metric(run, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of a logged metric, rows where it is missing dropped; non-finite kept as NaN."""
    df = run.metrics
    if name not in df.columns or "step" not in df.columns:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    sub = df[["step", name]].dropna(subset=[name])
    sub = sub.drop_duplicates("step", keep="last").sort_values("step")
    return sub["step"].to_numpy(np.int64), pd.to_numeric(sub[name], errors="coerce").to_numpy(float)


def has_metric(run, name: str) -> bool:
    return len(metric(run, name)[0]) > 0


def array(run, name: str):
    """A recorded array, or None when missing or empty."""
    st = run.store
    if st is None or name not in st.names():
        return None
    try:
        a = st[name]
    except Exception as e:          # a corrupted array: report it as missing
        run.problems.append(f"array {name} can't be read ({type(e).__name__})")
        return None
    return a if len(a) > 0 else None


def first_head(arr, idx) -> np.ndarray:
    """Layer 0, head 0, seq 0 of a per-head (step, layer, head, seq, ...) array at step index/indices
    ``idx``, as float64 (the sticky chain's single head)."""
    return np.asarray(arr[idx, 0, 0, 0], dtype=np.float64)


def diag(run, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A ``diag_*`` scalar: from metrics, else from the recorded array of that name."""
    s, v = metric(run, name)
    if len(s):
        return s, v
    a = array(run, name)
    if a is not None and a.ndim == 1:
        return run.steps[: len(a)], np.asarray(a[:], dtype=float)
    return np.zeros(0, dtype=np.int64), np.zeros(0)


def align(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Curves (steps, values) on the union of steps -> (steps, matrix (n_curves, n_steps), NaN-padded)."""
    steps = np.unique(np.concatenate([c[0] for c in curves])) if curves else np.zeros(0, np.int64)
    mat = np.full((len(curves), len(steps)), np.nan)
    for i, (s, v) in enumerate(curves):
        mat[i, np.searchsorted(steps, s)] = v
    return steps, mat


def mean_std(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample std (:func:`dyntool.stats.mean_std`) over axis 0, ignoring NaN."""
    return stats.mean_std(mat, axis=0)


class _quiet:
    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *a):
        return self._w.__exit__(*a)


# -- sticky-chain constants -------------------------------------------------------------------

def h_min(runs: list) -> float | None:
    """H(Y_t | Y_{t-1}) in nats: summary.json, else config/meta, else from the config's chain."""
    if not runs:
        return None
    s = summary_of(runs[0])
    for src in (s, runs[0].config or {}, runs[0].meta or {}):
        if isinstance(src.get("h_min"), (int, float)):
            return float(src["h_min"])
    try:
        from ..sims.sticky_data import h_min as _h, transition_matrix  # deferred: keeps torch off the figures
        cfg = runs[0].config or {}
        data = cfg.get("data", cfg)
        P = transition_matrix(int(data.get("n", data.get("n_symbols", 8))), float(data.get("rho", 0.3)),
                              str(data.get("construction", "script")))
        return float(_h(P))
    except Exception:      # unknown construction etc.: no line rather than a wrong one
        return None


def n_symbols(run) -> int:
    cfg = run.config or {}
    data = cfg.get("data", cfg)
    for k in ("n", "n_symbols", "n_classes", "vocab"):
        if isinstance(data.get(k), int):
            return int(data[k])
    return 8


# -- divergences -------------------------------------------------------------------------------


def normalise_rows(a: np.ndarray) -> np.ndarray:
    a = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0)
    s = a.sum(-1, keepdims=True)
    return np.divide(a, s, out=np.zeros_like(a), where=s > 0)


def offsets(arr) -> tuple[int, int]:
    at = arr.attrs if arr is not None else {}
    return int(at.get("query_offset", 0)), int(at.get("key_offset", 0))


def fmt_pm(mean: float, std: float, digits: int = 3) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}"
