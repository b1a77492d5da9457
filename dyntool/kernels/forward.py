"""The fused attention's forward (FlashAttention-2 tiling): one program per (query block, b·h).

Online softmax over key tiles in log2 units (:mod:`.tiles`), fp32 accumulators; the full tiles run
in an unmasked loop (``# hot loop``), the diagonal, window edges and padding in a masked one.  It
writes the output, the row log-sum-exp in log2 units (lse·log₂e, what the backward recomputes α
from: the same rounding of the scores on both sides) and,
when ``STATS``, four per-program partial statistics at a few instructions per score:

- ``Σ_i H_i``: H_i = (l'_i / l_i) ln l_i − (Σ_j p_ij x_ij) / (l_i log₂e), x = z − m the exponent
  already computed for p = 2^x (one FFMA per score: the product's sum), rescaled like l when m grows
  (lse − Σ α s would cancel in fp32 on peaked rows); l' excludes the sink's term, so H is the real
  keys' part of the row, as ``torch.special.entr(α).sum`` of the eager path;
- ``max s_ij`` (a per-row max of the row maxima the softmax takes anyway) and ``max |τ q·k|`` (one
  more min per score) over visible entries; ``Σ_i`` sink mass ``e^{σ − lse_i}``.

A sink enters as the row's starting state (m = σ, its term 2^{σ − m} added at the end), so a row
with no visible key has output 0 and sink mass 1, as :func:`dyntool.quantities.masked_softmax`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .stats_names import FORWARD_SUMS
from .tiles import (LOG2E, M_INIT, NEG, fp32_scalars, key_tiles, load_rows, log2_scores, masked_tile, n_masked,
                    visible)

N_FWD_STATS = len(FORWARD_SUMS)   # entropy sum, score max, |logit| max, sink-mass sum
_SLOTS = tl.constexpr(N_FWD_STATS)
_ENT, _SMAX, _LMAX, _SINK = (tl.constexpr(FORWARD_SUMS.index(n)) for n in ("ent", "score_max", "logit_max", "sink"))


@triton.jit
def _tile(acc, m, l, tx, smax, lmax, q, k_ptrs, v_ptrs, j0, offs_m, offs_n, dmask, km_row,
          T, Tk, lo, hi, window, scale, qk_scale, softcap, slope, skt, svt,
          MASKED: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
          HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr, STATS: tl.constexpr,
          PRECISION: tl.constexpr):
    """One key tile of the online softmax; ``MASKED`` builds the tile's mask, else every entry is
    visible (and in bounds: no load needs a mask but the padded head dim's)."""
    cols = j0 + offs_n
    k = load_rows(k_ptrs + j0 * skt, cols, Tk, dmask, MASKED, EVEN_D)
    v = load_rows(v_ptrs + j0 * svt, cols, Tk, dmask, MASKED, EVEN_D)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)                     # (BLOCK_M, BLOCK_N)
    if MASKED:
        valid = visible(offs_m[:, None], cols[None, :], T, Tk, lo, hi, window, km_row, CAUSAL, HAS_WINDOW, HAS_KM)
        if STATS:                                                  # |logit| max: a masked entry counts 0
            lmax = tl.maximum(lmax, tl.max(tl.where(valid, tl.abs(qk), 0.0), 1))
    elif STATS:
        lmax = tl.maximum(lmax, tl.max(tl.abs(qk), 1))             # one FMNMX with |·| per score
    if MASKED or HAS_SOFTCAP or HAS_ALIBI:
        z = log2_scores(qk, offs_m[:, None], cols[None, :], T, Tk, scale, softcap, slope, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            z = tl.where(valid, z, NEG)
        zmax = tl.max(z, 1)
        m_new = tl.maximum(m, zmax)
        x = z - m_new[:, None]
    else:                                                          # the common case: one FFMA per score
        zmax = tl.max(qk, 1) * qk_scale                            # qk_scale > 0 (op.attention)
        m_new = tl.maximum(m, zmax)
        x = qk * qk_scale - m_new[:, None]
    p = tl.exp2(x)
    alpha = tl.exp2(m - m_new)
    if STATS:
        smax = tl.maximum(smax, zmax)
        # tx = Σ p·x; moving m to m_new scales p by α and lowers every x by (m_new − m)
        tx = alpha * (tx - (m_new - m) * l) + tl.sum(p * x, 1)
    l = alpha * l + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l, tx, smax, lmax


@triton.jit
def attn_fwd(Q, K, V, O, LSE, ST, LO, HI, KM, SINK, SLOPE, WIN,
             sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, skmb,
             H, G, T, Tk, D, scale, softcap,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, EVEN_D: tl.constexpr,
             CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
             HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr, HAS_SINK: tl.constexpr,
             STATS: tl.constexpr, PRECISION: tl.constexpr):
    scale, softcap = fp32_scalars(scale, softcap)
    qk_scale = scale * LOG2E
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // G                                                   # GQA: h reads kv head h // G
    q0 = pid_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    dmask = offs_d < D                                            # head dim padded to a power of 2
    rows = offs_m < T
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
                mask=rows[:, None] & dmask[None, :], other=0.0)
    k_ptrs = K + b * skb + hk * skh + offs_n[:, None] * skt + offs_d[None, :]
    v_ptrs = V + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :]
    lo = tl.load(LO + b)
    hi = tl.load(HI + b)
    window = 0
    if HAS_WINDOW:                                                # keys per query, per head
        window = tl.load(WIN + h)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPE + h).to(tl.float32)
    sigma2 = 0.0
    if HAS_SINK:
        sigma2 = tl.load(SINK + h).to(tl.float32) * LOG2E
        m = tl.zeros([BLOCK_M], dtype=tl.float32) + sigma2
    else:
        m = tl.zeros([BLOCK_M], dtype=tl.float32) + M_INIT
    l = tl.zeros([BLOCK_M], dtype=tl.float32)                     # Σ p over the real keys
    tx = tl.zeros([BLOCK_M], dtype=tl.float32)
    smax = tl.zeros([BLOCK_M], dtype=tl.float32) + M_INIT
    lmax = tl.zeros([BLOCK_M], dtype=tl.float32)                 # max |q·k| (|τ q·k| / τ)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    km_row = KM + b * skmb
    start, fs, fe, end = key_tiles(q0, T, Tk, lo, hi, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW, HAS_KM)
    for j0 in range(fs, fe, BLOCK_N):                             # hot loop
        acc, m, l, tx, smax, lmax = _tile(
            acc, m, l, tx, smax, lmax, q, k_ptrs, v_ptrs, j0, offs_m, offs_n, dmask, km_row,
            T, Tk, lo, hi, window, scale, qk_scale, softcap, slope, skt, svt, False, EVEN_D,
            CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM, STATS, PRECISION)
    for t in range(0, n_masked(start, fs, fe, end, BLOCK_N)):
        acc, m, l, tx, smax, lmax = _tile(
            acc, m, l, tx, smax, lmax, q, k_ptrs, v_ptrs, masked_tile(t, start, fs, fe, BLOCK_N), offs_m,
            offs_n, dmask, km_row, T, Tk, lo, hi, window, scale, qk_scale, softcap, slope, skt, svt, True, EVEN_D,
            CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM, STATS, PRECISION)
    l_all = l
    if HAS_SINK:
        l_all = l + tl.exp2(sigma2 - m)
    nonempty = l_all > 0
    inv = tl.where(nonempty, 1.0 / tl.where(nonempty, l_all, 1.0), 0.0)
    out = acc * inv[:, None]                                      # rows with no key: 0
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] & dmask[None, :])
    log2_l = tl.log2(tl.where(nonempty, l_all, 1.0))
    log_l = log2_l / LOG2E
    # the log-sum-exp in log2 units, from the same z the backward recomputes: 2^{z − lse2} = α (+inf: 0)
    lse2 = tl.where(nonempty, m + log2_l, float("inf"))
    tl.store(LSE + bh * T + offs_m, lse2, mask=rows)
    if STATS:
        seen = rows & (l > 0)                                     # rows with a visible key
        ent = tl.where(rows & nonempty, (l * log_l - tx / LOG2E) * inv, 0.0)
        st = ST + (bh * tl.num_programs(0) + pid_m) * _SLOTS
        tl.store(st + _ENT, tl.sum(ent, axis=0))
        tl.store(st + _SMAX, tl.max(tl.where(seen, smax / LOG2E, float("-inf")), axis=0))
        tl.store(st + _LMAX, tl.max(tl.where(rows, lmax, 0.0), axis=0) * scale)
        sink = 0.0
        if HAS_SINK:
            sink = tl.sum(tl.where(rows, tl.exp2(sigma2 - m) * inv, 0.0), axis=0)
        tl.store(st + _SINK, sink)
