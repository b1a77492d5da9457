"""One training step of the batched single-head engine, seen through dyntool's public names.

:class:`StepState` is what ``single_head.train(on_step=...)`` hands to a hook: the state BEFORE
that step's update, for R runs at once (leading axis R).  The engine never forms N×N matrices
while training; this class rebuilds them on request, a block of query rows at a time, with the
formulas of :mod:`dyntool.quantities` and under the names of :mod:`dyntool.record.names`
(``attn``, ``scores``, ``compat``, ``advantage``, ``score_grad``, ``upstream``, ...).

Why the rows come in chunks that only reach key ``q1``: under the causal mask, query rows
[q0, q1) see keys [0, q1) only, so the masked upper triangle is never computed (half the work
of a full N×N pass).  Everything to the right of ``q1`` is masked: 0 for the matrices,
NaN (−inf for scores) where a caller needs full width.
"""
from __future__ import annotations

import copy
import math
from typing import Iterator

import torch

from .. import quantities as Q
from ..record.pooling import pool_blocks

MATRIX_NAMES = ("attn", "compat", "advantage", "score_grad", "scores")
POOLED_NAMES = ("attn", "compat", "advantage", "score_grad")


class StepState:
    """Everything about one step BEFORE its update, per run r (leading axis R).

    Attributes: ``step``, ``loss`` (R,), ``x`` (R,N,d_x), ``y`` (R,N), ``weights`` (R-batched
    Weights), ``queries``/``keys`` (R,N,d_k), ``values`` (R,N,d_v), ``head_out`` g (R,N,d_v),
    ``probs`` (R,N,C) class probabilities, ``upstream`` u = ∂L/∂g (R,N,d_v), ``expected_compat``
    (R,N) = E_α[b] = u·g (the identity saves an N×N pass), ``grads`` {W_Q, W_K, W_V, W_O: (R,·,·)}
    weight gradients of the mean loss; ``executor`` the engine's idle worker threads (or None).
    N×N quantities: :meth:`row_block`, :meth:`chunks`,
    :meth:`pooled`, :meth:`positional`; never all rows at once unless asked.
    """

    def __init__(self, step: int, ctx, acc: dict, loss: torch.Tensor, executor=None):
        self.step, self.loss = step, loss
        # the engine's worker threads, idle while the hook runs (None: single-threaded).  Hooks split
        # per-run work over them rather than starting threads of their own: every new thread gets
        # its own malloc arena, and a study's peak memory grew with each recorded step
        # (docs/performance.md).
        self.executor = executor
        self.x, self.y, self.weights, self.causal = ctx.X, ctx.Y, ctx.W, ctx.causal
        self.d_k = ctx.qh.shape[-1]
        self.scale = 1.0 / math.sqrt(self.d_k)
        self._qh, self._kt, self._vt = ctx.qh, ctx.kt, ctx.vt  # engine layouts: q·τ, kᵀ, vᵀ
        self.queries = ctx.qh * math.sqrt(self.d_k)            # (R, N, d_k)
        self.keys = ctx.kt.transpose(1, 2)                     # (R, N, d_k)
        self.values = ctx.vt.transpose(1, 2)                   # (R, N, d_v)
        self.head_out, self.probs, self.upstream = acc["G"], acc["P"], acc["U"]
        self.expected_compat = (self.upstream * self.head_out).sum(-1)   # (R, N)
        self.grads = {n: acc[n] for n in ("W_Q", "W_K", "W_V", "W_O")}
        self.N = ctx.X.shape[1]

    def select(self, runs) -> "StepState":
        """The same step for a subset of runs (indices into the leading axis), e.g. to split the
        recorded-step work over threads."""
        idx = torch.as_tensor(list(runs), dtype=torch.long)
        out = copy.copy(self)
        for name in ("loss", "x", "y", "_qh", "_kt", "_vt", "queries", "keys", "values", "head_out", "probs",
                     "upstream", "expected_compat"):
            setattr(out, name, getattr(self, name).index_select(0, idx))
        out.grads = {n: g.index_select(0, idx) for n, g in self.grads.items()}
        out.weights = type(self.weights)(**{n: w.index_select(0, idx) for n, w in self.weights.as_dict().items()})
        return out

    def mask(self, q0: int, q1: int, k1: int | None = None) -> torch.Tensor:
        """(q1-q0, k1) bool, True where key j < k1 is visible to query i (default k1 = N)."""
        k1 = self.N if k1 is None else k1
        i = torch.arange(q0, q1)[:, None]
        j = torch.arange(k1)[None, :]
        return j <= i if self.causal else torch.ones(q1 - q0, k1, dtype=torch.bool)

    def key_end(self, q1: int) -> int:
        """Keys [0, key_end) hold every visible entry of query rows < q1."""
        return q1 if self.causal else self.N

    def row_block(self, q0: int, q1: int, names=MATRIX_NAMES, k1: int | None = None) -> dict:
        """Rows [q0, q1) × keys [0, k1) (default all N) of the named matrices, each (R, q1-q0, k1).

        ``scores`` S = τ q·k (−inf where masked), ``attn`` α = softmax(S), ``compat`` B = U Vᵀ,
        ``advantage`` A = E_α[b] − B, ``score_grad`` ∂L/∂S = α ⊙ (B − E_α[b]) = −α ⊙ A; masked
        entries of the last four are 0.  Same formulas as :mod:`dyntool.quantities` (its
        ``attention_weights``, ``advantage``, ``score_grad``), but the mask is applied in place and
        only to keys > q0: every key ≤ q0 is visible to every row of the block, so for a chunk
        that stops at k1 = q1 only a (w × w) triangle is touched instead of the whole (w × k1)
        block (the recorded step is memory-bound, so untouched entries are time saved).
        """
        k1 = self.N if k1 is None else k1
        m = self.mask(q0, q1, k1)
        s = torch.bmm(self._qh[:, q0:q1], self._kt[:, :, :k1])          # (R, w, k1) = τ q·k
        self._mask_in_place(s, m, q0, float("-inf"))
        out = {"scores": s, "attn": Q.attention_weights(s)}
        if {"compat", "advantage", "score_grad"} & set(names):
            b = torch.bmm(self.upstream[:, q0:q1], self._vt[:, :, :k1])   # (R, w, k1) = U Vᵀ
            self._mask_in_place(b, m, q0, 0.0)
            e = self.expected_compat[:, q0:q1]
            out["compat"] = b
            if "advantage" in names:
                out["advantage"] = Q.advantage(out["attn"], b, m, expected=e)
            if "score_grad" in names:
                out["score_grad"] = Q.score_grad(out["attn"], b, expected=e)
        return {n: out[n] for n in names}

    def _mask_in_place(self, t: torch.Tensor, visible: torch.Tensor, q0: int, fill: float) -> None:
        """Set the masked entries of rows [q0, q1) of ``t`` (R, w, k1) to ``fill``: keys > q0 only."""
        if self.causal and t.shape[-1] > q0 + 1:
            t[..., q0 + 1:].masked_fill_(~visible[:, q0 + 1:], fill)

    def chunks(self, rows: int, names=MATRIX_NAMES) -> Iterator[tuple[int, int, torch.Tensor, dict]]:
        """Yield ``(q0, q1, visible, block)`` over query rows in chunks of ``rows``, each block
        only as wide as its visible keys (``key_end(q1)``): the causal upper triangle is skipped."""
        for q0 in range(0, self.N, rows):
            q1 = min(q0 + rows, self.N)
            k1 = self.key_end(q1)
            yield q0, q1, self.mask(q0, q1, k1), self.row_block(q0, q1, names, k1)

    def pooled(self, block: int, names=POOLED_NAMES, rows_per_chunk: int = 256) -> dict:
        """Block means over b×b blocks of the full N×N matrices: each (R, ⌈N/b⌉, ⌈N/b⌉).

        The mean is over the VISIBLE entries of a block (fully masked blocks are NaN), by
        :func:`~dyntool.record.pooling.pool_blocks` one chunk of whole block rows at a time.
        """
        rows = max(1, rows_per_chunk // block) * block
        parts = {n: [] for n in names}
        for _, _, vis, rb in self.chunks(rows, names):
            for n in names:
                parts[n].append(pool_to_width(rb[n], block, vis, self.N))
        return {n: torch.cat(parts[n], dim=1) for n in names}

    def positional(self, rows_per_chunk: int = 256) -> dict:
        """Per-position gradients and attention stats (public names), tiled over query rows:
        ``query_grad``, ``key_grad`` (R,N,d_k), ``value_grad`` = αᵀU (R,N,d_v), ``column_usage``
        c_j = Σ_i α_ij (R,N), ``attn_entropy`` H_i (R,N)."""
        R, N = self.upstream.shape[:2]
        dQ, ent = [], []
        dK, dV = torch.zeros_like(self.keys), torch.zeros_like(self.values)
        usage = torch.zeros(R, N, dtype=self.x.dtype)
        for q0, q1, _, w in self.chunks(rows_per_chunk, ("attn", "score_grad")):
            a = w["attn"]
            dQ.append(accumulate_grads(dK, dV, a, w["score_grad"], self.queries, self.keys, self.upstream,
                                       q0, q1, self.scale))
            usage[:, :a.shape[-1]] += a.sum(1)
            ent.append(Q.entropy(a))
        return {"query_grad": torch.cat(dQ, 1), "key_grad": dK, "value_grad": dV,
                "column_usage": usage, "attn_entropy": torch.cat(ent, 1)}


def accumulate_grads(dK, dV, attn, score_grad, queries, keys, upstream, q0: int, q1: int, scale: float):
    """One chunk of query rows [q0, q1) (keys [0, k1)) of the per-position gradients: adds its share
    of ∂L/∂k_j = τ Σ_i dS_ij q_i and ∂L/∂v_j = Σ_i α_ij u_i into ``dK``, ``dV`` and returns its rows
    of ∂L/∂q_i = τ Σ_j dS_ij k_j."""
    k1 = attn.shape[-1]
    dK[:, :k1] += (score_grad.transpose(1, 2) @ queries[:, q0:q1]) * scale
    dV[:, :k1] += attn.transpose(1, 2) @ upstream[:, q0:q1]
    return (score_grad @ keys[:, :k1]) * scale


def pool_to_width(x: torch.Tensor, block: int, visible: torch.Tensor, width: int) -> torch.Tensor:
    """pool_blocks of a chunk that stops at its last visible key, widened to ``width`` keys:
    the blocks past it are fully masked, hence NaN.  ``x`` must be 0 where masked."""
    p = pool_blocks(x, block, visible, masked_zero=True)
    nk = math.ceil(width / block)
    if p.shape[-1] < nk:
        p = torch.nn.functional.pad(p, (0, nk - p.shape[-1]), value=float("nan"))
    return p
