"""Reading WikiText training runs for the LS and span figures."""
from __future__ import annotations

import math

import numpy as np

from ..record import metric_names as mn
from .common import align, array, by_parent, mean_std, metric

KIND = "train"
_LAYER = mn.regex(mn.LOGIT_MAX, "layer")
_HEAD = mn.regex(mn.LOGIT_MAX, "head")


def model_cfg(run) -> dict:
    return (run.config or {}).get("model", {}) or {}


def attention(run) -> str:
    return str(model_cfg(run).get("attention", "mhsa"))


def seed(run) -> int:
    s = (run.config or {}).get("seed")
    if isinstance(s, int):
        return s
    seeds = (run.meta or {}).get("seeds") or [0]
    return int(seeds[0])


def best_group(runs: list, score) -> list:
    """The study (parent directory) whose runs score highest (ties: first seen)."""
    groups = list(by_parent(runs).values())
    return max(groups, key=score) if groups else []


def logit_series(run) -> tuple[np.ndarray, np.ndarray]:
    """Model max|logit| per step: metric ``logit_max``, else the max of per-layer/head metrics,
    else the recorded ``logit_max`` array (recorded steps only)."""
    s, v = metric(run, mn.LOGIT_MAX)
    if len(s):
        return s, v
    cols = [c for c in run.metrics.columns if _LAYER.match(c) or _HEAD.match(c)]
    if cols:
        df = run.metrics[["step"] + cols].dropna(how="all", subset=cols)
        return df["step"].to_numpy(np.int64), df[cols].max(axis=1).to_numpy(float)
    a = array(run, "logit_max")
    if a is not None:
        x = np.asarray(a[:], dtype=float)
        return run.steps[: len(x)], x.reshape(len(x), -1).max(1)
    return np.zeros(0, np.int64), np.zeros(0)


def layer_logits(run) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """heads-group ("all" | "local" | "global") -> (steps, (n_layer, n_steps) max|logit|).

    An LS run's local / global maxima are taken over its per-head columns (``logit_max/L{l}H{h}``,
    heads < ``model.n_local`` local), else over the recorded ``logit_max`` array."""
    m = model_cfg(run)
    df = run.metrics
    n_local = int(m.get("n_local", 0)) if attention(run) == "ls" else 0
    heads = {}
    for c in df.columns:
        g = _HEAD.match(c)
        if g:
            heads.setdefault(int(g.group(1)), {})[int(g.group(2))] = c
    layers = {int(g.group(1)): c for c in df.columns if (g := _LAYER.match(c))}
    out = {}
    if heads and n_local > 0:
        L = sorted(heads)
        for grp, pick in (("local", lambda h: h < n_local), ("global", lambda h: h >= n_local)):
            sel = [[heads[l][h] for h in sorted(heads[l]) if pick(h)] for l in L]
            if all(sel):
                out[grp] = _matrix(df, sel)
    elif layers:
        out["all"] = _matrix(df, [layers[k] for k in sorted(layers)])
    elif heads:
        out["all"] = _matrix(df, [[heads[l][h] for h in sorted(heads[l])] for l in sorted(heads)])
    if not out:
        a = array(run, "logit_max")                          # (step, layer, head) at recorded steps
        if a is not None:
            x = np.asarray(a[:], dtype=float)
            st = run.steps[: len(x)]
            if n_local > 0 and x.shape[2] > n_local:
                out["local"] = (st, x[:, :, :n_local].max(2).T)
                out["global"] = (st, x[:, :, n_local:].max(2).T)
            else:
                out["all"] = (st, x.max(2).T)
    return out


def _matrix(df, cols) -> tuple[np.ndarray, np.ndarray]:
    """cols: one column per layer, or a list of columns per layer (max taken)."""
    flat = [c for x in cols for c in (x if isinstance(x, list) else [x])]
    sub = df[["step"] + flat].dropna(how="all", subset=flat)
    rows = [sub[x].max(axis=1) if isinstance(x, list) else sub[x] for x in cols]
    return sub["step"].to_numpy(np.int64), np.stack([r.to_numpy(float) for r in rows])


def final_val(run) -> tuple[float, float]:
    """(val loss, val ppl) at the end: meta.final, else the last logged val_loss."""
    fin = (run.meta or {}).get("final") or {}
    if isinstance(fin.get("valid_loss"), (int, float)):
        vl = float(fin["valid_loss"])
        return vl, float(fin.get("valid_ppl", math.exp(min(vl, 700))))
    s, v = metric(run, "val_loss")
    if len(s) and np.isfinite(v[-1]):
        return float(v[-1]), math.exp(min(float(v[-1]), 700))
    return float("nan"), float("nan")


def diverged(run) -> int | None:
    """Step at which a run's loss went non-finite (meta.failed_step, or the metrics), else None."""
    fs = (run.meta or {}).get("failed_step")
    if isinstance(fs, int):
        return fs
    s, v = metric(run, "loss")
    bad = np.nonzero(~np.isfinite(v))[0]
    if len(bad):
        return int(s[bad[0]])
    return _null_loss_step(run)


def _null_loss_step(run) -> int | None:
    """The first step whose row *has* a ``loss`` key holding null (how a non-finite loss is
    written: JSON has no NaN).  A row without the key (the HF Trainer's end-of-training summary,
    an evaluation row) says nothing about divergence, though the DataFrame shows NaN for both."""
    import json
    from pathlib import Path
    path = getattr(run, "path", None)
    f = Path(path) / "metrics.jsonl" if isinstance(path, (str, Path)) else None
    if f is None or not f.is_file():
        return None
    with f.open("rb") as fh:
        for raw in fh:
            if b'"loss"' not in raw:
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if isinstance(row, dict) and "loss" in row and row["loss"] is None and isinstance(row.get("step"), int):
                return int(row["step"])
    return None


def mean_curve(series: list[tuple[np.ndarray, np.ndarray]]):
    steps, mat = align(series)
    mu, sd = mean_std(mat)
    return steps, mu, sd


def smooth(y: np.ndarray, n: int) -> np.ndarray:
    """Centered moving average (NaN-aware), window n (odd)."""
    if n <= 1 or len(y) < n:
        return y
    k = np.ones(n)
    ok = np.isfinite(y)
    num = np.convolve(np.where(ok, y, 0.0), k, "same")
    den = np.convolve(ok.astype(float), k, "same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)
