"""What every program of the fused attention shares: which tiles need a mask, which entries are
visible, and a tile's scores in log2 units.

Scores live in log2 units (z = s·log₂e) so that α = 2^{z − m} is one FFMA and one MUFU.EX2 per
entry, the scale and log₂e folded into one constant (``qk_scale``), as FlashAttention does.  A masked
entry gets the finite score :data:`NEG` (not −inf): 2^{NEG − m} is exactly 0 for any m a row can
reach, and the entropy's p·(z − m) is 0·finite = 0, so no ``where`` guards a product.  The running
row maximum starts at :data:`M_INIT`, above NEG and below any real score, so a row with no visible
key so far keeps p = 0 everywhere (l = 0) without a −inf test.

Tiles are aligned to the tile grid and split three ways (FlexAttention's and the Triton tutorial's
scheme): the *full* tiles, where every row of the block sees every key of the tile, run without a
mask (the hot loop); the others (the causal diagonal, a window's edges, padding, a key mask, the
ends of T) build the mask.  ``s = c·tanh(τ q·k / c) + slope·(j − i')`` (soft-cap first, then ALiBi, as
:func:`dyntool.quantities.score_parts`); ``i' = i + Tk − T`` is the query's position among the keys
(a causal query sees keys j ≤ i'; a window of w keys, the query's own included, keeps i' − j < w,
as :func:`dyntool.observe.causal_allowed`).  Index arguments broadcast, so a query-major tile
passes (rows[:, None], cols[None, :]) and a key-major one (rows[None, :], cols[:, None]).
"""
from __future__ import annotations

import triton
import triton.language as tl

# constexpr: the only globals a kernel may read
LOG2E = tl.constexpr(1.4426950408889634)
NEG = tl.constexpr(-3.0e30)                # a masked entry's score (log2 units)
M_INIT = tl.constexpr(-1.0e30)             # the running maximum before any visible key


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
def visible(ii, jj, T, Tk, lo, hi, window, km_row,
            CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_KM: tl.constexpr):
    """Query rows ``ii`` × key columns ``jj`` (broadcast) → bool: the entry is a real, visible key."""
    ipos = ii + (Tk - T)
    ok = (ii < T) & (jj >= lo) & (jj < hi)                         # hi ≤ Tk: padding by length
    if CAUSAL:
        ok = ok & (jj <= ipos)
    if HAS_WINDOW:
        ok = ok & (ipos - jj < window)
    if HAS_KM:                                                     # a bool key mask (B, Tk)
        km = tl.load(km_row + jj, mask=jj < Tk, other=0)
        ok = ok & (km != 0)
    return ok


@triton.jit
def load_rows(ptrs, rows, n_rows, dmask, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """A (rows, D_PAD) tile: bounds-checked in a masked tile, unchecked in a full one (every row is
    in range there) but for a head dim padded to a power of two."""
    if MASKED:
        return tl.load(ptrs, mask=(rows[:, None] < n_rows) & dmask[None, :], other=0.0)
    elif EVEN_D:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=dmask[None, :], other=0.0)


@triton.jit
def add_rows(ptrs, x, rows, n_rows, dmask, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """``tl.atomic_add`` of a (rows, D_PAD) fp32 tile, masked as :func:`load_rows` reads one."""
    if MASKED:
        tl.atomic_add(ptrs, x, mask=(rows[:, None] < n_rows) & dmask[None, :], sem="relaxed")
    elif EVEN_D:
        tl.atomic_add(ptrs, x, sem="relaxed")
    else:
        tl.atomic_add(ptrs, x, mask=dmask[None, :], sem="relaxed")


@triton.jit
def log2_scores(qk, ii, jj, T, Tk, scale, softcap, slope, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """q·k (fp32) → z = s·log₂e, where soft-cap or ALiBi make s more than τ q·k."""
    s = qk * scale
    if HAS_SOFTCAP:
        s = softcap * tanh(s / softcap)
    if HAS_ALIBI:
        s = s + slope * (jj - (ii + (Tk - T))).to(tl.float32)
    return s * LOG2E


@triton.jit
def key_tiles(q0, T, Tk, lo, hi, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_KM: tl.constexpr):
    """The key tiles of the query block [q0, q0 + BLOCK_M), on the BLOCK_N grid: all of them are
    [start, end); the full ones are [fs, fe) (the masked ones: [start, fs) and [fe, end))."""
    off = Tk - T
    end = hi
    start = lo
    f_lo = lo                                  # full: every row of the block sees the whole tile
    f_hi = tl.minimum(hi, Tk)
    if CAUSAL:
        end = tl.minimum(end, q0 + BLOCK_M + off)
        f_hi = tl.minimum(f_hi, q0 + off + 1)
    if HAS_WINDOW:
        start = tl.maximum(start, q0 + off - window + 1)
        f_lo = tl.maximum(f_lo, q0 + BLOCK_M + off - window)
    start = tl.maximum(start, 0) // BLOCK_N * BLOCK_N
    fs = (tl.maximum(f_lo, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    fe = tl.maximum(f_hi, 0) // BLOCK_N * BLOCK_N
    if HAS_KM:                                 # any key may be masked: no tile is full
        fs = end
    fs = tl.minimum(tl.maximum(fs, start), end)
    fe = tl.minimum(tl.maximum(fe, fs), end)
    return start, fs, fe, end


@triton.jit
def query_tiles(k0, T, Tk, lo, hi, window, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_KM: tl.constexpr):
    """The query tiles that see some key of the block [k0, k0 + BLOCK_N), on the BLOCK_M grid:
    [start, end), the full ones (every row sees every key of the block) [fs, fe)."""
    off = Tk - T
    start = 0
    end = T
    fs = 0
    fe = T
    if CAUSAL:
        start = tl.maximum(0, k0 - off)
        fs = k0 + BLOCK_N - 1 - off
    if HAS_WINDOW:
        end = tl.minimum(end, k0 + BLOCK_N - 1 + window - off)
        fe = tl.minimum(fe, k0 + window - off)
    start = start // BLOCK_M * BLOCK_M
    end = tl.where((k0 >= hi) | (k0 + BLOCK_N <= lo), start, end)   # a padded-away key block
    fs = (tl.maximum(fs, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    fe = tl.maximum(fe, 0) // BLOCK_M * BLOCK_M
    fs = tl.where((k0 < lo) | (k0 + BLOCK_N > hi) | (k0 + BLOCK_N > Tk), end, fs)   # a partial key block
    if HAS_KM:                                 # any key may be masked: no tile is full
        fs = end
    fs = tl.minimum(tl.maximum(fs, start), end)
    fe = tl.minimum(tl.maximum(fe, fs), end)
    return start, fs, fe, end


@triton.jit
def masked_tile(t, start, fs, fe, STEP: tl.constexpr):
    """The t-th masked tile's first index: [start, fs) then [fe, ...), one loop for both."""
    n_before = (fs - start + STEP - 1) // STEP              # fs is on the grid, or = end
    return tl.where(t < n_before, start + t * STEP, fe + (t - n_before) * STEP)


@triton.jit
def n_masked(start, fs, fe, end, STEP: tl.constexpr):
    return (fs - start + STEP - 1) // STEP + (end - fe + STEP - 1) // STEP
