"""Progress: a tqdm bar on a terminal, plain log lines when stderr is a file or a pipe.

A job whose output goes to a log (``scripts/main.sh > log``, CI, nohup) still says how far it is:
one line every ``DYNTOOL_PROGRESS_SECONDS`` (default 30) with count, percentage, rate, elapsed
and ETA, plus whatever the caller set with ``set_postfix`` (e.g. loss, tokens/s), and a last line
when it closes.  ``disable=True`` (``--quiet``) prints nothing either way.

:class:`TrainProgress` is the training-loop callback built on it: step, loss, tokens/s, ETA.
"""
from __future__ import annotations

import os
import sys
import time

from tqdm.auto import tqdm


def _log_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get("DYNTOOL_PROGRESS_SECONDS", "30")))
    except ValueError:
        return 30.0


def _hms(s: float) -> str:
    s = int(max(0, s))
    h, m = divmod(s, 3600)
    m, s = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class LogProgress:
    """The subset of tqdm's interface dyntool uses, written as log lines."""

    def __init__(self, iterable=None, desc: str = "", total: int | None = None, unit: str = "it",
                 every: float = 30.0, stream=None, initial: int = 0, **_):
        self.iterable, self.desc, self.unit, self.every = iterable, desc, unit, every
        self.stream = stream if stream is not None else sys.stderr
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n, self.start_n = total, initial, initial
        self.postfix = ""
        self.t0 = self.last = time.monotonic()
        self.closed = False
        self.printed_n = None            # n of the last line written (no duplicate line at close)
        self.excluded = 0.0              # seconds left out of the rate (evaluations)

    def __iter__(self):
        try:
            for x in self.iterable:
                yield x
                self.update(1)
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()
        return False

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **kw) -> None:
        items = {**(ordered_dict or {}), **kw}
        self.set_postfix_str(", ".join(f"{k}={v}" for k, v in items.items()))

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._line()

    def line(self) -> str:
        el = time.monotonic() - self.t0
        done = self.n - self.start_n
        busy = el - self.excluded
        rate = done / busy if busy > 0 else 0.0
        head = f"{self.desc}: " if self.desc else ""
        if self.total:
            pct = 100.0 * self.n / self.total
            eta = (self.total - self.n) / rate if rate > 0 else float("nan")
            where = f"{self.n}/{self.total} ({pct:.0f}%)"
            tail = f"elapsed {_hms(el)}, ETA {_hms(eta) if eta == eta else '?'}"
            if self.excluded:
                tail += f" (evaluation {_hms(self.excluded)} not in the rate)"
        else:
            where, tail = f"{self.n}", f"elapsed {_hms(el)}"
        post = f"  {self.postfix}" if self.postfix else ""
        return f"{head}{where}  {rate:.3g} {self.unit}/s  {tail}{post}"

    def _line(self) -> None:
        self.printed_n = self.n
        print(self.line(), file=self.stream, flush=True)

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` (e.g. an evaluation) out of the rate and the ETA."""
        self.excluded += seconds

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.n > self.start_n and self.printed_n != self.n:
                self._line()


def progress(iterable=None, desc: str = "", total: int | None = None, disable: bool = False, **kw):
    """tqdm on a terminal; :class:`LogProgress` lines when stderr is not a terminal."""
    if not disable and not sys.stderr.isatty():
        return LogProgress(iterable, desc=desc, total=total, every=_log_seconds(), **kw)
    return tqdm(iterable, desc=desc, total=total, disable=disable, dynamic_ncols=True, leave=False, **kw)


def exclude(bar, seconds: float) -> None:
    """Leave ``seconds`` out of a bar's rate and ETA (tqdm or :class:`LogProgress`)."""
    if isinstance(bar, LogProgress):
        bar.exclude(seconds)
    elif getattr(bar, "start_t", None) is not None:
        bar.start_t += seconds


class TrainProgress:
    """Training callback: a bar (or log lines) over steps with loss, tokens/s and ETA.

    Duck-typed to :class:`dyntool.train.trainer.Callback` (no import: this module stays light)."""

    def __init__(self, label: str = ""):
        self.label, self.bar = label, None

    def on_train_start(self, trainer) -> None:
        cfg = trainer.cfg.train
        stop = min(cfg.stop_at or cfg.max_steps, cfg.max_steps)
        self.bar = progress(total=stop, desc=f"{self.label}train", unit="step", initial=trainer.step)

    def on_step_start(self, step: int) -> None: ...

    def micro_step_context(self, step: int, micro: int):
        from contextlib import nullcontext
        return nullcontext()

    def wants_eager(self, step: int) -> bool:
        return False

    def on_eval(self, step: int, metrics: dict) -> None: ...

    def on_step_end(self, step: int, metrics: dict) -> None:
        if self.bar is None:
            return
        post = {"loss": f"{metrics['loss']:.4f}", "tok/s": f"{metrics.get('tokens_per_s', 0):.0f}"}
        if "val_loss" in metrics:
            post["val"] = f"{metrics['val_loss']:.4f}"
        self.bar.set_postfix(post, refresh=False)
        if metrics.get("eval_time"):         # the evaluation shows its own bar; not in the step rate
            exclude(self.bar, metrics["eval_time"])
        self.bar.update(1)

    def on_steps_done(self) -> None:
        self.on_train_end({})

    def on_train_end(self, final: dict) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
