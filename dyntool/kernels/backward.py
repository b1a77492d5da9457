"""The fused attention's backward: α recomputed from the forward's lse, never stored.

Two programs, FlashAttention-2's deterministic split (no program accumulates into another's rows),
each with an unmasked loop over its full tiles (``# hot loop``) and a masked one (:mod:`.tiles`):

- ``attn_bwd_dq`` (per query block, its key tiles): first D_i = rowsum(dO_i ∘ O_i) = E_α[b]_i for
  its own rows (stored for the dK/dV program, launched after it), then dP = dO Vᵀ, dS = α ∘ (dP − D)
  (the routing law), dQ; the partial sums Σ_i D_i, Σ_i ‖dO_i‖², Σ dS ∘ (dP − D) (= Σ_i Var_α[b]_i),
  Σ dS², and the sink's gradient −Σ_i e^{σ − lse_i} D_i;
- ``attn_bwd_dkdv`` (per key block of one kv head, the query tiles of every query head in its group),
  key-major as the Triton tutorial: the tiles are Sᵀ = K Qᵀ, so Pᵀ and dSᵀ feed dV += Pᵀ dO and
  dK += dSᵀ Q straight from registers (no transpose of a register tile) and the column usage
  c_j = Σ_i α_ij is a row sum; dK, dV summed over the group in registers (deterministic: no
  atomics); per query head its block's max c, Σ c log c, Σ c, and ‖dV_h‖² (the value update αᵀU of
  that query head alone, before the group's sum).

With the atomic dQ policy (``op.dq_policy``: FlashAttention-2's 5 matmul units instead of 7) the dq
program runs ``PRE_ONLY`` (D_i and the row sums, no loop) and the dK/dV program also computes
dQ_i += dS_i K for its tile and adds it into an fp32 dQ with ``tl.atomic_add``, carrying the two
score sums the dq program had; only dQ's rounding then depends on the programs' order.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .stats_names import DKV_SLOTS, DQ_SLOTS
from .tiles import (LOG2E, NEG, add_rows, fp32_scalars, key_tiles, load_rows, log2_scores, masked_tile, n_masked,
                    query_tiles, tanh, visible)

N_DQ_PROGRAM, N_DKV_PROGRAM = len(DQ_SLOTS), len(DKV_SLOTS)   # what one program of each writes
# The dq program's two sums are kept per program, not per row: each tile's products are summed in
# SUM_ROWS groups whose members a thread holds itself (``can_reorder``), so no tile pays the shuffles
# of a row sum.  256 was the census's best of 32..4096 at 64 × 64 tiles (tiles are ≥ 16 × 16).
SUM_ROWS = tl.constexpr(256)
_DQ_SLOTS, _DKV_SLOTS = tl.constexpr(N_DQ_PROGRAM), tl.constexpr(N_DKV_PROGRAM)   # the same, for the kernels
# each slot's offset, looked up by its name (the kernels see constexpr globals only)
_Q_EB, _Q_U2, _Q_VAR, _Q_DS2, _Q_DSINK = (tl.constexpr(DQ_SLOTS.index(n)) for n in ("eb", "u2", "var", "ds2", "dsink"))
_KV_COLMAX, _KV_CLOGC, _KV_CSUM, _KV_DV2, _KV_VAR, _KV_DS2 = (
    tl.constexpr(DKV_SLOTS.index(n)) for n in ("colmax", "c_log_c", "c_sum", "dv2", "var", "ds2"))


@triton.jit
def _score_sums(var, ds2, ds, centred, SCORES: tl.constexpr):
    """Add a tile's Σ dS (dP − D) and Σ dS² (its SCORES entries) into the SUM_ROWS-part sums."""
    var += tl.sum(tl.reshape(ds * centred, [SUM_ROWS, SCORES // SUM_ROWS], can_reorder=True), 1)
    ds2 += tl.sum(tl.reshape(ds * ds, [SUM_ROWS, SCORES // SUM_ROWS], can_reorder=True), 1)
    return var, ds2


@triton.jit
def _dq_tile(dq, var, ds2, q, do, lse2, dd, k_ptrs, v_ptrs, j0, offs_m, offs_n, dmask, km_row,
             T, Tk, lo, hi, window, scale, qk_scale, softcap, slope, skt, svt, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr,
             MASKED: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
             HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr, STATS: tl.constexpr,
             PRECISION: tl.constexpr):
    cols = j0 + offs_n
    k = load_rows(k_ptrs + j0 * skt, cols, Tk, dmask, MASKED, EVEN_D)
    v = load_rows(v_ptrs + j0 * svt, cols, Tk, dmask, MASKED, EVEN_D)
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)                     # (BLOCK_M, BLOCK_N)
    if MASKED or HAS_SOFTCAP or HAS_ALIBI:
        z = log2_scores(qk, offs_m[:, None], cols[None, :], T, Tk, scale, softcap, slope, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            valid = visible(offs_m[:, None], cols[None, :], T, Tk, lo, hi, window, km_row, CAUSAL, HAS_WINDOW, HAS_KM)
            z = tl.where(valid, z, NEG)
        p = tl.exp2(z - lse2[:, None])
    else:
        p = tl.exp2(qk * qk_scale - lse2[:, None])                # one FFMA and one MUFU per score
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)       # b_ij = u_i·v_j
    centred = dp - dd[:, None]                                    # b − E_α[b]
    ds = p * centred                                              # ∂L/∂s: the routing law
    if STATS:
        # only the program's totals are kept: each thread sums its own scores (no shuffle per tile)
        var, ds2 = _score_sums(var, ds2, ds, centred, BLOCK_M * BLOCK_N)
    if HAS_SOFTCAP:
        th = tanh(qk * scale / softcap)
        ds = ds * (1.0 - th * th)                                 # back through c·tanh(l / c)
    dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    return dq, var, ds2


@triton.jit
def attn_bwd_dq(Q, K, V, O, DO, LSE, DD, DQ, ST, LO, HI, KM, SINK, SLOPE, WIN,
                sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, sdb, sdh, sdt,
                sdqb, sdqh, sdqt, skmb, H, G, T, Tk, D, scale, softcap,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, EVEN_D: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr, HAS_SINK: tl.constexpr,
                STATS: tl.constexpr, PRECISION: tl.constexpr, PRE_ONLY: tl.constexpr):
    """``PRE_ONLY`` (the atomic-dQ policy): D_i and the row sums only; the dK/dV programs add dQ."""
    scale, softcap = fp32_scalars(scale, softcap)
    qk_scale = scale * LOG2E
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // G
    q0 = pid_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    dmask = offs_d < D
    rows = offs_m < T
    qmask = rows[:, None] & dmask[None, :]
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=qmask, other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=qmask, other=0.0)
    o = tl.load(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], mask=qmask, other=0.0)
    dof = do.to(tl.float32)
    dd = tl.sum(o.to(tl.float32) * dof, axis=1)                   # D_i = E_α[b]_i
    tl.store(DD + bh * T + offs_m, dd, mask=rows)
    lse2 = tl.load(LSE + bh * T + offs_m, mask=rows, other=float("inf"))     # log2 units
    lo = tl.load(LO + b)
    hi = tl.load(HI + b)
    window = 0
    if HAS_WINDOW:
        window = tl.load(WIN + h)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPE + h).to(tl.float32)
    k_ptrs = K + b * skb + hk * skh + offs_n[:, None] * skt + offs_d[None, :]
    v_ptrs = V + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :]
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    var = tl.zeros([SUM_ROWS], dtype=tl.float32)                  # Σ dS (dP − D), in SUM_ROWS parts
    ds2 = tl.zeros([SUM_ROWS], dtype=tl.float32)
    km_row = KM + b * skmb
    if not PRE_ONLY:
        start, fs, fe, end = key_tiles(q0, T, Tk, lo, hi, window, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW, HAS_KM)
        for j0 in range(fs, fe, BLOCK_N):                         # hot loop
            dq, var, ds2 = _dq_tile(dq, var, ds2, q, do, lse2, dd, k_ptrs, v_ptrs, j0, offs_m, offs_n, dmask,
                                    km_row, T, Tk, lo, hi, window, scale, qk_scale, softcap, slope, skt, svt, BLOCK_M,
                                    BLOCK_N, False, EVEN_D,
                                    CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM, STATS, PRECISION)
        for t in range(0, n_masked(start, fs, fe, end, BLOCK_N)):
            dq, var, ds2 = _dq_tile(dq, var, ds2, q, do, lse2, dd, k_ptrs, v_ptrs,
                                    masked_tile(t, start, fs, fe, BLOCK_N), offs_m, offs_n, dmask, km_row, T, Tk, lo,
                                    hi, window, scale, qk_scale, softcap, slope, skt, svt, BLOCK_M, BLOCK_N, True,
                                    EVEN_D, CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM, STATS, PRECISION)
        tl.store(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :],
                 (dq * scale).to(DQ.dtype.element_ty), mask=qmask)
    if STATS or HAS_SINK:
        st = ST + (bh * tl.num_programs(0) + pid_m) * _DQ_SLOTS
        if STATS:                                                 # (PRE_ONLY: var, ds2 are 0 here)
            tl.store(st + _Q_EB, tl.sum(dd, axis=0))
            tl.store(st + _Q_U2, tl.sum(tl.sum(dof * dof, axis=1), axis=0))
            tl.store(st + _Q_VAR, tl.sum(var, axis=0))
            tl.store(st + _Q_DS2, tl.sum(ds2, axis=0))
        if HAS_SINK:                                              # ∂L/∂σ = −Σ_i p_σ,i D_i
            sigma2 = tl.load(SINK + h).to(tl.float32) * LOG2E
            tl.store(st + _Q_DSINK, -tl.sum(tl.where(rows, tl.exp2(sigma2 - lse2) * dd, 0.0), axis=0))
        else:                                                     # every slot written (torch.empty)
            tl.store(st + _Q_DSINK, 0.0)


@triton.jit
def _dkdv_tile(dk, dv, col, var, ds2, k, v, i0, q_ptrs, do_ptrs, dq_ptrs, LSE_h, DD_h, offs_m, offs_n, dmask,
               km_row, T, Tk, lo, hi, window, scale, qk_scale, softcap, slope, sqt, sdt, sdqt,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               MASKED: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr, STATS: tl.constexpr,
               PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    rows = i0 + offs_m
    q = load_rows(q_ptrs + i0 * sqt, rows, T, dmask, MASKED, EVEN_D)                     # (BLOCK_M, D_PAD)
    do = load_rows(do_ptrs + i0 * sdt, rows, T, dmask, MASKED, EVEN_D)
    if MASKED:
        lse2 = tl.load(LSE_h + rows, mask=rows < T, other=float("inf"))
        dd = tl.load(DD_h + rows, mask=rows < T, other=0.0)
    else:
        lse2 = tl.load(LSE_h + rows)
        dd = tl.load(DD_h + rows)
    # (BLOCK_N, BLOCK_M): keys × queries; the loaded tiles' transposes are how the tensor cores read
    # them from shared memory, not a move of registers
    qkT = tl.dot(k, tl.trans(q), input_precision=PRECISION)
    if MASKED or HAS_SOFTCAP or HAS_ALIBI:
        z = log2_scores(qkT, rows[None, :], offs_n[:, None], T, Tk, scale, softcap, slope, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            valid = visible(rows[None, :], offs_n[:, None], T, Tk, lo, hi, window, km_row, CAUSAL, HAS_WINDOW, HAS_KM)
            z = tl.where(valid, z, NEG)
        pT = tl.exp2(z - lse2[None, :])
    else:
        pT = tl.exp2(qkT * qk_scale - lse2[None, :])
    dv += tl.dot(pT.to(do.dtype), do, input_precision=PRECISION)
    dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    centredT = dpT - dd[None, :]
    dsT = pT * centredT
    if ATOMIC_DQ and STATS:                   # the dq program's two score sums, carried here instead
        var, ds2 = _score_sums(var, ds2, dsT, centredT, BLOCK_M * BLOCK_N)
    if HAS_SOFTCAP:
        th = tanh(qkT * scale / softcap)
        dsT = dsT * (1.0 - th * th)
    dk += tl.dot(dsT.to(q.dtype), q, input_precision=PRECISION)
    if ATOMIC_DQ:                             # FlashAttention-2's 5 units: dQ_i += dS_i K, in fp32
        dq = tl.dot(tl.trans(dsT.to(k.dtype)), k, input_precision=PRECISION) * scale    # (BLOCK_M, D_PAD)
        add_rows(dq_ptrs + i0 * sdqt, dq, rows, T, dmask, MASKED, EVEN_D)
    if STATS:
        col += tl.sum(pT, axis=1)                                 # c_j = Σ_i α_ij: a row of Pᵀ
    return dk, dv, col, var, ds2


@triton.jit
def _dkdv_head(dk, dv, k, v, k0, b, h, Q, DO, DQ, LSE, DD, WIN, SLOPE, km_row, offs_m, offs_n, offs_d, dmask,
               sqb, sqh, sqt, sdb, sdh, sdt, sdqb, sdqh, sdqt, H, T, Tk, lo, hi, scale, qk_scale, softcap,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr,
               HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
               HAS_KM: tl.constexpr, STATS: tl.constexpr, PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """One query head's contribution to the key block: dK (added), dV_h, its column usage and (with
    the atomic-dQ policy) its dQ, added to the query rows, and its two score sums."""
    bh = b * H + h
    window = 0
    if HAS_WINDOW:
        window = tl.load(WIN + h)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPE + h).to(tl.float32)
    q_ptrs = Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :]
    do_ptrs = DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :]
    dq_ptrs = DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqt + offs_d[None, :]
    col = tl.zeros([BLOCK_N], dtype=tl.float32)
    var = tl.zeros([SUM_ROWS], dtype=tl.float32)
    ds2 = tl.zeros([SUM_ROWS], dtype=tl.float32)
    start, fs, fe, end = query_tiles(k0, T, Tk, lo, hi, window, BLOCK_N, BLOCK_M, CAUSAL, HAS_WINDOW, HAS_KM)
    for i0 in range(fs, fe, BLOCK_M):                             # hot loop
        dk, dv, col, var, ds2 = _dkdv_tile(
            dk, dv, col, var, ds2, k, v, i0, q_ptrs, do_ptrs, dq_ptrs, LSE + bh * T, DD + bh * T, offs_m, offs_n,
            dmask, km_row, T, Tk, lo, hi, window, scale, qk_scale, softcap, slope, sqt, sdt, sdqt, BLOCK_M, BLOCK_N,
            False, EVEN_D, CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM, STATS, PRECISION, ATOMIC_DQ)
    for t in range(0, n_masked(start, fs, fe, end, BLOCK_M)):
        dk, dv, col, var, ds2 = _dkdv_tile(
            dk, dv, col, var, ds2, k, v, masked_tile(t, start, fs, fe, BLOCK_M), q_ptrs, do_ptrs, dq_ptrs,
            LSE + bh * T, DD + bh * T, offs_m, offs_n, dmask, km_row, T, Tk, lo, hi, window, scale, qk_scale, softcap,
            slope, sqt, sdt, sdqt, BLOCK_M, BLOCK_N, True, EVEN_D, CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM,
            STATS, PRECISION, ATOMIC_DQ)
    return dk, dv, col, var, ds2


@triton.jit
def _column_stats(ST, bh, pid_n, col, dv_h, cols, var, ds2):
    st = ST + (bh * tl.num_programs(0) + pid_n) * _DKV_SLOTS
    tl.store(st + _KV_COLMAX, tl.max(tl.where(cols, col, 0.0), axis=0))
    tl.store(st + _KV_CLOGC, tl.sum(tl.where(col > 0, col * tl.log(tl.where(col > 0, col, 1.0)), 0.0), axis=0))
    tl.store(st + _KV_CSUM, tl.sum(col, axis=0))
    tl.store(st + _KV_DV2, tl.sum(tl.sum(dv_h * dv_h, axis=1), axis=0))
    tl.store(st + _KV_VAR, tl.sum(var, axis=0))                  # 0 unless the atomic-dQ policy
    tl.store(st + _KV_DS2, tl.sum(ds2, axis=0))


@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, LSE, DD, DK, DV, DQ, ST, LO, HI, KM, SLOPE, WIN,
                  sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                  sdkb, sdkh, sdkt, sdvb, sdvh, sdvt, sdqb, sdqh, sdqt, skmb, H, G, T, Tk, D, scale, softcap,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, EVEN_D: tl.constexpr,
                  GROUPED: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                  HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr,
                  STATS: tl.constexpr, PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    scale, softcap = fp32_scalars(scale, softcap)
    qk_scale = scale * LOG2E
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    Hk = H // G
    b = bhk // Hk
    hk = bhk % Hk
    k0 = pid_n * BLOCK_N
    offs_n = k0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    dmask = offs_d < D
    cols = offs_n < Tk
    kvmask = cols[:, None] & dmask[None, :]
    k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skt + offs_d[None, :], mask=kvmask, other=0.0)
    v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :], mask=kvmask, other=0.0)
    lo = tl.load(LO + b)
    hi = tl.load(HI + b)
    km_row = KM + b * skmb
    dk = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    if GROUPED:                                                   # the query heads of this kv head
        for g in range(G):
            h = hk * G + g
            dv_h = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
            dk, dv_h, col, var, ds2 = _dkdv_head(
                dk, dv_h, k, v, k0, b, h, Q, DO, DQ, LSE, DD, WIN, SLOPE, km_row, offs_m, offs_n, offs_d, dmask,
                sqb, sqh, sqt, sdb, sdh, sdt, sdqb, sdqh, sdqt, H, T, Tk, lo, hi, scale, qk_scale, softcap,
                BLOCK_M, BLOCK_N, EVEN_D, CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM, STATS, PRECISION,
                ATOMIC_DQ)
            dv += dv_h
            if STATS:
                _column_stats(ST, b * H + h, pid_n, col, dv_h, cols, var, ds2)
    else:                                                         # one query head: dV is its own
        dk, dv, col, var, ds2 = _dkdv_head(
            dk, dv, k, v, k0, b, hk, Q, DO, DQ, LSE, DD, WIN, SLOPE, km_row, offs_m, offs_n, offs_d, dmask,
            sqb, sqh, sqt, sdb, sdh, sdt, sdqb, sdqh, sdqt, H, T, Tk, lo, hi, scale, qk_scale, softcap,
            BLOCK_M, BLOCK_N, EVEN_D, CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM, STATS, PRECISION,
            ATOMIC_DQ)
        if STATS:
            _column_stats(ST, b * H + hk, pid_n, col, dv, cols, var, ds2)
    tl.store(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkt + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=kvmask)
    tl.store(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvt + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=kvmask)
