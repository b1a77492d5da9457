"""Batched closed-form trainer for a single attention head (arXiv 2512.22473: model, projection-matrix gradients, sticky Markov-chain task).

R independent runs (e.g. seeds × arms) train at once; every tensor has a leading run axis.
Model per run: ``q = x W_Q``, ``k = x W_K``, ``v = x W_V``, ``s = q kᵀ/√d_k`` (causal mask keeps the
diagonal), ``α = softmax(s)``, ``g = α v``, ``logits = g W_O``, mean cross-entropy.

Why it is fast (≈10× the per-run autograd loop on 2 CPU cores at T = 2000):

* Query tiles: rows [i0, i1) only ever touch keys [0, i1) under the causal mask, so the upper
  triangle is never computed, and each (R, tile, keys) block stays in cache.
* Nothing is normalised: with e = exp(s) and l = rowsum(e), α = e/l, so 1/l is folded into the
  (tile, d) side: G = (e X) W_V / l, and dS = e ⊙ (Ũ Vᵀ) − c̃ ⊙ e with Ũ = U/l, c̃ = (u·g)/l.
* Matmuls through X instead of per-position gradients: αX (the row sums come free from a
  ones column) gives both G = (αX) W_V and ∂L/∂W_V = (αX)ᵀ U; with M = Xᵀ dS X,
  ∂L/∂W_Q = M W_K/√d_k and ∂L/∂W_K = Mᵀ W_Q/√d_k.  So dQ, dK, dV (N-sized) are never formed
  in training; :class:`~dyntool.sims.step_state.StepState` rebuilds them (``attn``, ``compat``,
  ``advantage``, ``score_grad``, ...) on request for recorded steps.
* No max-shift when a Cauchy–Schwarz bound shows |s| ≤ 30 (exp cannot overflow); else rows are
  shifted by their exact max.

``mode`` per run: plain GD with per-parameter learning rates (SGD: all 0.01; the paper's EM-like
arm: W_V 0.1, others 0.01), or ``"em_closed_form"`` — an EXTENSION, not the paper's method (see
:func:`_closed_form_value`).
"""
from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Callable, Iterable

import torch

from dyntool.errors import NonFiniteLossError
from dyntool.run_writer import critical_section
from dyntool.sims.step_state import StepState
from dyntool.sims.tiled_pass import make_ctx, tiled_pass

PARAMS = ("W_Q", "W_K", "W_V", "W_O")
# Below this many score entries per step (R·N·keys) one worker is faster: the ops are tiny.
_SMALL_PROBLEM = 2_000_000


@contextlib.contextmanager
def _workers(n: int | None, small: bool):
    """Run the tile sweeps on Python threads, each with single-threaded torch ops.

    With OpenMP intra-op threads every small op ends in a barrier; on a busy 2-core machine a
    descheduled thread stalls the other (timings: docs/performance.md).  Torch
    releases the GIL inside ops, so W Python workers give W-way parallelism with one join per step.
    """
    prev = torch.get_num_threads()
    n = n or (1 if small else prev)
    torch.set_num_threads(1)
    executor = ThreadPoolExecutor(max_workers=n) if n > 1 else None
    if executor is not None:
        executor.n_workers = n
    try:
        yield executor, prev
    finally:
        if executor is not None:
            executor.shutdown()
        torch.set_num_threads(prev)


class NonFiniteLoss(NonFiniteLossError):
    """A run's loss became NaN/inf; ``losses`` holds the (R, step) curves recorded before it."""

    def __init__(self, step: int, run_index: int, losses: torch.Tensor | None = None):
        self.run_index = run_index
        self.losses = losses
        super().__init__(step, f"run {run_index}")


@dataclass
class Weights:
    W_Q: torch.Tensor  # (R, d_x, d_k)
    W_K: torch.Tensor  # (R, d_x, d_k)
    W_V: torch.Tensor  # (R, d_x, d_v)
    W_O: torch.Tensor  # (R, d_v, C)

    def clone(self) -> "Weights":
        return Weights(*(getattr(self, f.name).clone() for f in fields(self)))

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n) for n in PARAMS}


def init_weights(seeds: Iterable[int], d_x=20, d_k=10, d_v=15, n_classes=8, std=0.1,
                 dtype=torch.float32) -> Weights:
    """Per seed: ``torch.manual_seed(seed)`` then randn W_Q, W_K, W_V, W_O (in that order) × std."""
    mats = []
    for seed in seeds:
        torch.manual_seed(seed)
        mats.append([torch.randn(*s) * std for s in ((d_x, d_k), (d_x, d_k), (d_x, d_v), (d_v, n_classes))])
    return Weights(*(torch.stack([m[p] for m in mats]).to(dtype) for p in range(4)))


# arm -> which of (W_Q, W_K, W_V, W_O) get ``lr × mult``; the rest keep ``lr``.
ARM_SCALED = {
    "sgd": (), "em_like": ("W_V",), "em_closed_form": ("W_V",),   # the paper's two arms (+ extension)
    "readout": ("W_O",), "routing": ("W_Q", "W_K"), "all": PARAMS,  # controls: same ×m elsewhere
}


def arm_lrs(arm: str, lr: float = 0.01, value_mult: float = 10.0) -> tuple[float, float, float, float]:
    """(lr_q, lr_k, lr_v, lr_o) of an arm: ``sgd``, ``em_like`` (W_V ×m), ``em_closed_form`` (lr_v
    unused), and the controls ``readout`` (W_O ×m), ``routing`` (W_Q, W_K ×m), ``all`` (every ×m)."""
    if arm not in ARM_SCALED:
        raise ValueError(f"unknown arm {arm!r}")
    return tuple(lr * value_mult if n in ARM_SCALED[arm] else lr for n in PARAMS)


# ----------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    losses: torch.Tensor          # (R, n_steps) float64; losses[:, k] = loss after k updates
    weights: Weights              # final weights (R-batched)
    final: dict                   # loss / entropy / accuracy, each (R,) float64, after the last update
    final_eval: dict | None = None   # the same on the held-out sequences (when evaluated)
    stopped_at: int | None = None    # stopped (``stop`` or a signal) with this many updates taken: final is None
    lrs: torch.Tensor | None = None  # (R, 4) the learning rates as they are now (a diverged run's are 0)
    dead: torch.Tensor | None = None  # (R,) bool: diverged (tolerated) runs


def _closed_form_value(W_V, gWV, HtH, N: int, kappa: float, ridge: float):
    """EXTENSION (arXiv 2512.22473, two-timescale EM view, INFERRED ``em_closed_form``), not the paper's method.

    With α frozen for the step and h_i = (αX)_i, g_i = h_i W_V.  Move every context along its
    error signal, g*_i = g_i − κ·N·u_i (N·u_i = W_Oᵀ(p_i − e_{y_i}) is O(1) per position), and
    solve the ridge least squares  min_W (1/N)‖H W − G*‖² + λ‖W − W_V‖²,  λ = ridge·tr(HᵀH/N)/d_x.
    Closed form: W = W_V − κ (HᵀH/N + λI)⁻¹ ∂L/∂W_V, i.e. a Gauss–Newton-preconditioned value
    step; solved in float64 for stability.  κ = 0 leaves W_V unchanged.
    """
    A = HtH.double() / N
    lam = ridge * A.diagonal(dim1=1, dim2=2).sum(-1) / A.shape[-1]    # (R,)
    A = A + lam[:, None, None] * torch.eye(A.shape[-1], dtype=A.dtype)
    return W_V - kappa * torch.linalg.solve(A, gWV.double()).to(W_V.dtype)


def _wants(record_steps, step: int) -> bool:
    if record_steps is None:
        return False
    return record_steps(step) if callable(record_steps) else step in record_steps


def _final_metrics(acc: dict, N: int) -> dict:
    return {"loss": acc["loss"] / N, "entropy": acc["entropy"] / N, "accuracy": acc["correct"] / N}


def train(x: torch.Tensor, y: torch.Tensor, weights: Weights, lrs, n_steps: int, *,
          causal: bool = True, modes: str | Iterable[str] = "gd", kappa: float = 0.1,
          ridge: float = 1e-3, on_step: Callable | None = None,
          record_steps: set[int] | Callable[[int], bool] | None = None, tile: int = 32,
          check_finite: bool | torch.Tensor = True, workers: int | None = None,
          on_metrics: Callable | None = None, eval_x: torch.Tensor | None = None,
          eval_y: torch.Tensor | None = None, eval_steps: set[int] | Callable[[int], bool] | None = None,
          on_eval: Callable | None = None, start: int = 0, resume: TrainResult | None = None,
          stop: Callable[[int], bool] | None = None) -> TrainResult:
    """Full-batch training of R runs at once.

    x (R, N, d_x) float, y (R, N) int64, ``weights`` R-batched (copied, not mutated), ``lrs``
    (R, 4) as (lr_q, lr_k, lr_v, lr_o).  ``modes``: "gd" or "em_closed_form", one for all runs
    or one per run.  ``on_step(step, StepState)`` is called for steps chosen by ``record_steps``
    (a set or a predicate), with the state BEFORE that step's update; step == n_steps gives the
    final state.  ``on_metrics(step, {loss, entropy, accuracy})`` ((R,) each, before the update)
    is called on every step and costs nothing extra (live logging without collecting state).
    Raises :class:`NonFiniteLoss` on the first NaN/inf loss; ``check_finite`` may instead be an
    (R,) bool tensor: runs marked False may diverge (their losses become NaN from then on and their
    weights are zeroed so they cost nothing; used for learning-rate grids).
    Held-out evaluation: with ``eval_x`` (R, N', d_x) / ``eval_y`` (R, N'), a forward-only pass on
    them runs at the steps chosen by ``eval_steps`` (default every step) and on the final state, and
    ``on_eval(step, {loss, entropy, accuracy})`` receives the metrics (before that step's update);
    ``TrainResult.final_eval`` holds the final ones.  ``workers``: tile
    sweeps in parallel Python threads (default: torch's thread count, 1 for small problems);
    torch's intra-op threads are 1 while training (restored for ``on_step`` and at the end).
    Stops and checkpoints: ``stop(step)`` true before a step returns a result with ``stopped_at``
    (no final metrics); a SIGINT/SIGTERM (held until the step ends) raises KeyboardInterrupt with
    that result as ``.stopped``.  ``weights`` at ``start`` and such a result (``resume``: its losses,
    learning rates and diverged runs) continue the run as if it had not stopped.
    """
    R, N, _ = x.shape
    dt = x.dtype
    W = weights.clone()
    for n in PARAMS:
        setattr(W, n, getattr(W, n).to(dt))
    lrs = torch.as_tensor(resume.lrs if resume is not None else lrs, dtype=dt).reshape(R, 4).clone()   # _kill may zero rows
    modes = [modes] * R if isinstance(modes, str) else list(modes)
    cf = torch.tensor([m == "em_closed_form" for m in modes])
    if not all(m in ("gd", "em_closed_form") for m in modes):
        raise ValueError(f"modes must be 'gd' or 'em_closed_form', got {modes}")
    with _workers(workers, R * N * N < _SMALL_PROBLEM) as (executor, threads):
        ev = None
        if eval_x is not None:
            ev = (eval_x.to(dt), eval_y, eval_steps if eval_steps is not None else (lambda s: True), on_eval)
        return _loop(x, y, W, lrs, cf, n_steps, causal, kappa, ridge, on_step, record_steps, tile,
                     check_finite, executor, threads, on_metrics, ev, start, resume, stop)


def _evaluate(ev, W, causal, tile, executor) -> dict:
    """Forward-only metrics of the current weights on the held-out sequences (no gradients)."""
    xe, ye = ev[0], ev[1]
    X1 = torch.cat([xe, torch.ones(*xe.shape[:2], 1, dtype=xe.dtype)], dim=-1)
    return _final_metrics(tiled_pass(make_ctx(xe, X1, ye, W, causal), tile, False, executor=executor), xe.shape[1])


def evaluate(W: Weights, x: torch.Tensor, y: torch.Tensor, causal: bool = True, tile: int = 32) -> dict:
    """Forward-only loss / entropy / accuracy ((R,) float64 each) of weights ``W`` on ``x``, ``y``."""
    R, N, _ = x.shape
    with _workers(None, R * N * N < _SMALL_PROBLEM) as (executor, _):
        return _evaluate((x.to(W.W_Q.dtype), y), W, causal, tile, executor)


def head_outputs(W: Weights, x: torch.Tensor, causal: bool = True, tile: int = 32, executor=None) -> torch.Tensor:
    """Head outputs g_i = (α V)_i (R, N, d_v) of weights ``W`` on inputs ``x`` (R, N, d_x), forward only
    (e.g. on held-out positions for the manifold metrics).  ``executor``: worker threads to borrow (a
    hook's ``StepState.executor``), else an executor of its own as in training."""
    X1 = torch.cat([x, torch.ones(*x.shape[:2], 1, dtype=x.dtype)], dim=-1)
    y = torch.zeros(x.shape[:2], dtype=torch.int64)           # labels unused for G
    ctx = make_ctx(x, X1, y, W, causal)
    R, N, _ = x.shape
    if executor is None:                                       # same threading as training
        with _workers(None, R * N * N < _SMALL_PROBLEM) as (own, _):
            return tiled_pass(ctx, tile, False, collect=True, executor=own)["G"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                                   # borrowed workers: one torch thread each
    try:
        return tiled_pass(ctx, tile, False, collect=True, executor=executor)["G"]
    finally:
        torch.set_num_threads(threads)


def _loop(x, y, W, lrs, cf, n_steps, causal, kappa, ridge, on_step, record_steps, tile, check_finite,
          executor, threads, on_metrics=None, ev=None, start=0, resume=None, stop=None):
    R, N, _ = x.shape
    X1 = torch.cat([x, torch.ones(R, N, 1, dtype=x.dtype)], dim=-1)
    losses = torch.empty(R, n_steps, dtype=torch.float64)
    tolerate = (~check_finite.bool() if isinstance(check_finite, torch.Tensor)
                else torch.full((R,), not check_finite))
    dead = torch.zeros(R, dtype=torch.bool)
    if resume is not None:
        losses[:, :start] = resume.losses[:, :start]
        dead = resume.dead.clone()
    final_eval, done = None, start

    def stopped(at: int) -> TrainResult:
        return TrainResult(losses[:, :at].clone(), W, None, None, at, lrs, dead)
    try:
        for step in range(start, n_steps + 1):
            if stop is not None and step < n_steps and stop(step):
                return stopped(step)
            with critical_section():            # a SIGTERM/SIGINT lands between steps
                ctx = make_ctx(x, X1, y, W, causal)
                rec = on_step is not None and _wants(record_steps, step)
                acc = tiled_pass(ctx, tile, step < n_steps or rec, rec, step < n_steps and bool(cf.any()), executor)
                loss = acc["loss"] / N
                bad = ~torch.isfinite(loss) | dead
                if (bad & ~tolerate).any():
                    raise NonFiniteLoss(step, int((bad & ~tolerate).nonzero()[0]), losses[:, :step].clone())
                if bad.any():
                    dead |= bad
                    _kill(W, acc, lrs, dead)
                    loss = loss.masked_fill(dead, float("nan"))
                if ev is not None and (step == n_steps or _wants(ev[2], step)):
                    m = _evaluate(ev, W, causal, tile, executor)
                    m = {k: v.masked_fill(dead, float("nan")) for k, v in m.items()}
                    if step == n_steps:
                        final_eval = m
                    if ev[3] is not None:
                        ev[3](step, m)
                if rec:   # the hook runs under the caller's torch thread count
                    torch.set_num_threads(threads)
                    try:
                        on_step(step, StepState(step, ctx, acc, loss, executor))
                    finally:
                        torch.set_num_threads(1)
                fm = _final_metrics(acc, N)
                if dead.any():
                    fm = {k: v.masked_fill(dead, float("nan")) for k, v in fm.items()}
                if on_metrics is not None:      # after on_step, so a logger can merge what it computed
                    on_metrics(step, fm)
                if step == n_steps:
                    return TrainResult(losses, W, fm, final_eval, None, lrs, dead)
                losses[:, step] = loss
                _update(W, acc, lrs, cf, N, kappa, ridge)
                done = step + 1
    except KeyboardInterrupt as e:
        e.stopped = stopped(done)
        raise


def _kill(W: Weights, acc: dict, lrs, dead):
    """Diverged runs (tolerated): zero weights, gradients and learning rates, so they stay finite
    (a zero head costs the same as any other and keeps the max-shift bound of the others)."""
    lrs[dead] = 0.0
    for n in PARAMS:
        getattr(W, n)[dead] = 0.0
        if n in acc:
            acc[n][dead] = 0.0


def _update(W: Weights, acc: dict, lrs, cf, N: int, kappa: float, ridge: float):
    old_v = W.W_V
    for p, n in enumerate(PARAMS):
        setattr(W, n, getattr(W, n) - lrs[:, p, None, None] * acc[n])
    if cf.any():
        closed = _closed_form_value(old_v, acc["W_V"], acc["HtH"], N, kappa, ridge)
        W.W_V = torch.where(cf[:, None, None], closed, W.W_V)
