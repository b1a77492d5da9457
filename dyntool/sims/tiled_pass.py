"""The sticky-chain engine's tiled pass: one forward (and, when asked, backward) of every run's
single attention head over the sequence in query tiles, so no N × N matrix is ever held: the
scores of a tile, the readout and the loss, the accumulated gradients, the recorded matrices
(:mod:`dyntool.sims.step_state`).  :mod:`dyntool.sims.single_head` trains with it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dyntool import masks

Weights = Any        # dyntool.sims.single_head.Weights (imported there, above this module)

NO_SHIFT_BOUND = 30.0   # |s| ≤ 30 ⇒ exp(s) ≤ 1e13 and row sums ≤ 1e17: safe in float32


@dataclass
class Ctx:
    """Per-step tensors shared by all tiles."""
    X: torch.Tensor     # (R, N, d_x)
    X1: torch.Tensor    # (R, N, d_x+1): X with a ones column, so e @ X1 also yields row sums
    Y: torch.Tensor     # (R, N) int64
    W: Weights
    qh: torch.Tensor    # (R, N, d_k) queries pre-scaled by 1/√d_k
    kt: torch.Tensor    # (R, d_k, N) keys, transposed once
    vt: torch.Tensor    # (R, d_v, N)
    causal: bool
    shift: bool


def make_ctx(X, X1, Y, W: Weights, causal: bool) -> Ctx:
    d_k = W.W_Q.shape[-1]
    qh = (X @ W.W_Q) / math.sqrt(d_k)
    k = X @ W.W_K
    bound = float(qh.norm(dim=-1).amax()) * float(k.norm(dim=-1).amax())
    shift = not bound <= NO_SHIFT_BOUND           # also True for NaN/inf
    W = type(W)(**W.as_dict())   # snapshot: _update rebinds W's fields, a held StepState keeps these
    return Ctx(X, X1, Y, W, qh, k.transpose(1, 2).contiguous(),
                (X @ W.W_V).transpose(1, 2).contiguous(), causal, shift)


def _exp_scores(c: Ctx, i0: int, i1: int, out: torch.Tensor, tri: torch.Tensor) -> torch.Tensor:
    """Unnormalised attention e = exp(s - shift) for query rows [i0, i1), masked entries 0."""
    ke = out.shape[-1]
    torch.bmm(c.qh[:, i0:i1], c.kt[:, :, :ke], out=out)              # (R, t, ke)
    diag = out[:, :, i0:i1] if c.causal else None
    if c.shift:
        if diag is not None:
            diag.masked_fill_(tri, float("-inf"))
        out.sub_(out.amax(dim=-1, keepdim=True))
        return out.exp_()
    out.exp_()
    if diag is not None:
        diag.masked_fill_(tri, 0.0)
    return out


def _readout(c: Ctx, H: torch.Tensor, i0: int, i1: int, acc: dict, N: int):
    """Per-row head output, probabilities and U = ∂L/∂G; accumulates loss/entropy/accuracy."""
    G = H @ c.W.W_V                                                   # (R, t, d_v)
    logp = torch.log_softmax(G @ c.W.W_O, dim=-1)                     # (R, t, C)
    P = logp.exp()
    y = c.Y[:, i0:i1, None]                                           # (R, t, 1)
    acc["loss"] -= logp.gather(-1, y).sum((1, 2))
    acc["entropy"] -= (P * torch.log(P + 1e-10)).sum((1, 2))
    acc["correct"] += (logp.argmax(-1, keepdim=True) == y).sum((1, 2))
    dZ = P.scatter_add(-1, y, torch.full(y.shape, -1.0, dtype=P.dtype)) / N   # (P - Y)/N
    return G, P, dZ, dZ @ c.W.W_O.transpose(1, 2)                     # U: (R, t, d_v)


def _new_acc(c: Ctx, grads: bool, hth: bool) -> dict:
    R, _, d_x = c.X.shape
    acc = {k: torch.zeros(R, dtype=torch.float64) for k in ("loss", "entropy", "correct")}
    if grads:
        acc.update(M=torch.zeros(R, d_x, d_x, dtype=c.X.dtype), W_V=torch.zeros_like(c.W.W_V),
                   W_O=torch.zeros_like(c.W.W_O))
    if hth:
        acc["HtH"] = torch.zeros(R, d_x, d_x, dtype=c.X.dtype)
    return acc


def _sweep(c: Ctx, starts: list[int], tile: int, grads: bool, collect: bool, hth: bool) -> tuple:
    """Forward (+ backward) over the query tiles beginning at ``starts``; one worker's share."""
    R, N, _ = c.X.shape
    acc, kept = _new_acc(c, grads, hth), {}
    buf_e = torch.empty(R * tile * N, dtype=c.X.dtype)   # reused views: no big allocation per tile
    buf_b = torch.empty(R * tile * N, dtype=c.X.dtype) if grads else None
    tri_full = ~masks.causal().dense(tile)[0]      # the keys a diagonal tile's queries must not see
    for i0 in starts:
        i1 = min(i0 + tile, N)
        t, ke = i1 - i0, (i1 if c.causal else N)
        e = _exp_scores(c, i0, i1, buf_e[: R * t * ke].view(R, t, ke), tri_full[:t, :t])
        H1 = torch.bmm(e, c.X1[:, :ke])                               # (R, t, d_x+1)
        l = H1[..., -1:]                                              # (R, t, 1) row sums
        H = H1[..., :-1] / l                                          # (R, t, d_x) = (αX) rows
        G, P, dZ, U = _readout(c, H, i0, i1, acc, N)
        if collect:
            kept[i0] = (G, P, U)
        if hth:
            acc["HtH"] += H.transpose(1, 2) @ H
        if not grads:
            continue
        acc["W_O"] += G.transpose(1, 2) @ dZ
        acc["W_V"] += H.transpose(1, 2) @ U
        Bm = torch.bmm(U / l, c.vt[:, :, :ke], out=buf_b[: R * t * ke].view(R, t, ke))
        Bm.mul_(e)                                                    # e ⊙ (U/l) Vᵀ
        c_t = (U * G).sum(-1, keepdim=True)                           # (R, t, 1) E_α[b] = u·g
        dSX = torch.bmm(Bm, c.X[:, :ke]) - c_t * H                   # (R, t, d_x) = (dS X) rows
        acc["M"] += c.X[:, i0:i1].transpose(1, 2) @ dSX
    return acc, kept


def tiled_pass(c: Ctx, tile: int, grads: bool, collect: bool = False, hth: bool = False, executor=None) -> dict:
    """One forward (and optionally backward) sweep over all query tiles.

    Returns sums over positions: loss, entropy, correct (R,); with ``grads`` the four weight
    gradients of the MEAN loss; with ``collect`` full G (R,N,d_v), P (R,N,C), U (R,N,d_v);
    with ``hth`` Σ_i h_i h_iᵀ of h_i = (αX)_i (R,d_x,d_x) for the closed-form value step.
    With a thread ``executor`` the tiles are dealt round-robin to its workers (balances the causal
    triangle) and the partial sums are added: one join per step instead of an OpenMP barrier per
    op, which keeps 2 cores busy even when other processes compete for them.
    """
    starts = list(range(0, c.X.shape[1], tile))
    n = 1 if executor is None else min(executor.n_workers, len(starts))
    if n == 1:
        parts = [_sweep(c, starts, tile, grads, collect, hth)]
    else:
        futs = [executor.submit(_sweep, c, starts[w::n], tile, grads, collect, hth) for w in range(n)]
        parts = [f.result() for f in futs]
    acc = parts[0][0]
    for other, _ in parts[1:]:
        for k, v in other.items():
            acc[k] += v
    if grads:
        s = 1.0 / math.sqrt(c.W.W_Q.shape[-1])
        acc["W_Q"] = acc["M"] @ c.W.W_K * s
        acc["W_K"] = acc["M"].transpose(1, 2) @ c.W.W_Q * s
    if collect:
        kept = {i0: v for _, part in parts for i0, v in part.items()}
        for j, k in enumerate(("G", "P", "U")):
            acc[k] = torch.cat([kept[i0][j] for i0 in starts], dim=1)
    return acc
