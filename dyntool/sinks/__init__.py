"""Scalar sinks: per-step scalars of a run to TensorBoard or Weights & Biases.

A sink has ``log(step, scalars)`` and ``close()``.  :func:`export_scalars` replays a finished
(or running) run into a sink; :class:`SinkCallback` feeds one live from the training loop::

    from dyntool.sinks import SinkCallback, TensorBoardSink
    callbacks.append(SinkCallback(TensorBoardSink("tb/my-run")))

What goes out: every numeric metric column (``loss``, ``val_loss``, ``logit_max/L{l}H{h}``,
``attn_entropy/L{l}H{h}``, ``grad_norm/...``, a simulation's ``entropy`` ...) under its own
name, and, where the record holds them and the metrics do not, the recorded per-head
``logit_max`` and mean ``attn_entropy`` as ``record/logit_max/L{l}H{h}`` and
``record/attn_entropy/L{l}H{h}`` at the recorded steps.  Non-finite values are skipped.
"""
from __future__ import annotations

import math

import numpy as np

from ..export import select_steps
from ..record import metric_names as mn
from .tensorboard import TensorBoardSink
from .wandb import WandbSink

__all__ = ["TensorBoardSink", "WandbSink", "SinkCallback", "export_scalars", "scalars"]
RECORD_PREFIX = "record/"


def scalars(row: dict) -> dict[str, float]:
    """The finite numeric entries of a metrics row, ``step`` excluded."""
    out = {}
    for k, v in row.items():
        if k == "step" or isinstance(v, (bool, np.bool_)) or v is None:
            continue
        if isinstance(v, (int, float, np.integer, np.floating)) and math.isfinite(float(v)):
            out[str(k)] = float(v)
    return out


def _recorded_per_head(run, steps: str | None):
    """(step, {tag: value}) from the recorded logit_max (step, L, H) and attn_entropy
    (step, L, H, seq, query: mean over seq and query), read one step at a time."""
    st = run.store
    if st is None or "step" not in st.names():
        return
    cols = set(run.metrics.columns)
    wanted = [n for n in (mn.LOGIT_MAX, mn.ATTN_ENTROPY) if n in st.names()
              and not any(mn.parse(str(c)) and mn.parse(str(c)).base == n for c in cols)]
    if not wanted:
        return
    step = np.asarray(st["step"][:], dtype=np.int64)
    idx = np.arange(len(step))
    if steps is not None:
        idx = select_steps(step, steps, strict=False)
    for i in idx:
        row = {}
        for n in wanted:
            a = np.asarray(st[n][int(i)], dtype=np.float64)
            a = a.reshape(a.shape[0], a.shape[1], -1).mean(-1) if a.ndim > 2 else a     # (L, H)
            for (l, h), v in np.ndenumerate(a):
                if math.isfinite(v):
                    row[RECORD_PREFIX + mn.head(n, l, h)] = float(v)
        yield int(step[i]), row


def export_scalars(run, sink, steps: str | None = None) -> int:
    """Send the run's per-step scalars to ``sink``; returns how many values were written."""
    n = 0
    df = run.metrics
    if len(df) and "step" in df:
        if steps is not None:
            df = df.iloc[select_steps(df["step"].to_numpy(np.int64), steps, strict=False)]
        for row in df.to_dict("records"):
            vals = scalars(row)
            if vals:
                sink.log(int(row["step"]), vals)
                n += len(vals)
    for s, vals in _recorded_per_head(run, steps) or ():
        if vals:
            sink.log(s, vals)
            n += len(vals)
    return n


def SinkCallback(sink):
    """A training :class:`~dyntool.train.trainer.Callback` that logs each step's metrics to
    ``sink`` live (rank 0 only, as the other writers) and closes it at the end."""
    from ..train.trainer import Callback   # deferred: keeps torch off `dyntool export` (replaying a run)

    class _SinkCallback(Callback):
        def on_step_end(self, step: int, metrics: dict) -> None:
            vals = scalars(metrics)
            if vals:
                sink.log(step, vals)

        def on_train_end(self, final: dict) -> None:
            sink.close()

    cb = _SinkCallback()
    cb.sink = sink
    return cb
