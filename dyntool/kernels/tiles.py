"""What every program of the fused attention shares: one (BLOCK_M, BLOCK_N) tile's scores and mask.

The forward, the dQ program and the dK/dV program all call :func:`score_tile` on the same
(query rows, key columns) tile, so the three can never disagree on which entries are visible or
on the score a visible entry gets: ``s = c·tanh(τ q·k / c) + slope·(j − i')`` (soft-cap first,
then ALiBi, as :func:`dyntool.quantities.score_parts`), ``-inf`` where masked.  ``i' = i + Tk − T``
is the query's position among the keys (a causal query sees keys j ≤ i'; a window of w keys,
the query's own included, keeps i' − j < w, as :func:`dyntool.observe.causal_allowed`).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tanh(x):
    # exp of -2|x| never overflows; tl has no tanh that the interpreter and every GPU share
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def fp32_scalars(scale, softcap):
    """The float arguments in fp32, whoever launched the kernel: torch.compile (inductor) hands a
    user-defined kernel Python floats typed fp64, which would make the scores fp64 and a loop-carried
    fp32 accumulator change type (a compile error on the GPU; the interpreter never sees it)."""
    return tl.cast(scale, tl.float32), tl.cast(softcap, tl.float32)


@triton.jit
def score_tile(qk, offs_m, offs_n, T, Tk, lo, hi, window, scale, softcap, slope, km_row,
               CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr):
    """``qk`` (BLOCK_M, BLOCK_N) = q·k in fp32 → (raw logits τ q·k, scores, visible)."""
    logits = qk * scale
    ipos = offs_m[:, None] + (Tk - T)                              # the query's key position
    jj = offs_n[None, :]
    valid = (offs_m[:, None] < T) & (jj >= lo) & (jj < hi)       # hi ≤ Tk: padding by length
    if CAUSAL:
        valid = valid & (jj <= ipos)
    if HAS_WINDOW:
        valid = valid & (ipos - jj < window)
    if HAS_KM:                                                     # a bool key mask (B, Tk)
        km = tl.load(km_row + offs_n, mask=offs_n < Tk, other=0)
        valid = valid & (km[None, :] != 0)
    s = logits
    if HAS_SOFTCAP:
        s = softcap * tanh(logits / softcap)
    if HAS_ALIBI:
        s = s + slope * (jj - ipos).to(tl.float32)
    s = tl.where(valid, s, float("-inf"))
    return logits, s, valid


@triton.jit
def key_range(q0, BLOCK_M: tl.constexpr, T, Tk, lo, hi, window,
              CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """The keys [start, end) any row of the query block [q0, q0 + BLOCK_M) can see."""
    start = lo
    end = hi
    if CAUSAL:
        end = tl.minimum(end, q0 + BLOCK_M + (Tk - T))
    if HAS_WINDOW:
        start = tl.maximum(start, q0 + (Tk - T) - window + 1)
    return start, end


@triton.jit
def query_range(k0, BLOCK_N: tl.constexpr, T, Tk, lo, hi, window,
                CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """The query rows [start, end) that can see some key of the block [k0, k0 + BLOCK_N)."""
    start = 0
    end = T
    if CAUSAL:
        start = tl.maximum(0, k0 - (Tk - T))
    if HAS_WINDOW:
        end = tl.minimum(end, k0 + BLOCK_N - 1 + window - (Tk - T))
    end = tl.where((k0 >= hi) | (k0 + BLOCK_N <= lo), start, end)   # a padded-away key block
    return start, end
