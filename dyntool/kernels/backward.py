"""The fused attention's backward: α recomputed from the forward's lse, never stored.

Three kernels (FlashAttention-2's split, so no program accumulates into another's rows):

- ``attn_bwd_pre`` (per query block): D_i = rowsum(dO_i ∘ O_i) = E_α[b]_i, and the partial sums
  Σ_i D_i and Σ_i ‖dO_i‖²;
- ``attn_bwd_dq`` (per query block, all its key blocks): dP = dO Vᵀ, dS = α ∘ (dP − D) (the
  routing law), dQ; the partial sums Σ dS ∘ (dP − D) (= Σ_i Var_α[b]_i), Σ dS², and the sink's
  gradient −Σ_i e^{σ − lse_i} D_i;
- ``attn_bwd_dkdv`` (per key block of one kv head, all query blocks of every query head in its
  group): dK, dV summed over the group in registers (deterministic: no atomics), and per query
  head the column usage c_j = Σ_i α_ij of the block, its max, Σ c log c, Σ c, and ‖dV_h‖² of the
  block (the value update αᵀU of that query head alone, before the group's sum).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .tiles import fp32_scalars, key_range, query_range, score_tile, tanh

N_PRE_STATS = 2            # Σ D, Σ ‖dO‖²
N_DQ_STATS = 3             # Σ dS (dP − D), Σ dS², dσ
N_DKV_STATS = 4            # max c, Σ c log c, Σ c, ‖dV_h‖²


@triton.jit
def attn_bwd_pre(O, DO, DD, ST, sob, soh, sot, sdb, sdh, sdt, H, T, D,
                 BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, STATS: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    msk = (offs_m[:, None] < T) & (offs_d[None, :] < D)
    o = tl.load(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], mask=msk, other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=msk, other=0.0)
    o = o.to(tl.float32)
    do = do.to(tl.float32)
    d = tl.sum(o * do, axis=1)
    tl.store(DD + bh * T + offs_m, d, mask=offs_m < T)
    if STATS:
        st = ST + (bh * tl.num_programs(0) + pid_m) * 2
        tl.store(st + 0, tl.sum(d, axis=0))
        tl.store(st + 1, tl.sum(tl.sum(do * do, axis=1), axis=0))


@triton.jit
def attn_bwd_dq(Q, K, V, DO, LSE, DD, DQ, ST, LO, HI, KM, SINK, SLOPE, WIN,
                sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, skmb,
                H, G, T, Tk, D, scale, softcap,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr, HAS_SINK: tl.constexpr,
                STATS: tl.constexpr, PRECISION: tl.constexpr):
    scale, softcap = fp32_scalars(scale, softcap)
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // G
    q0 = pid_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    dmask = offs_d < D
    rows = offs_m < T
    qmask = rows[:, None] & dmask[None, :]
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=qmask, other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=qmask, other=0.0)
    lse = tl.load(LSE + bh * T + offs_m, mask=rows, other=float("inf"))
    dd = tl.load(DD + bh * T + offs_m, mask=rows, other=0.0)
    lo = tl.load(LO + b)
    hi = tl.load(HI + b)
    window = 0
    if HAS_WINDOW:
        window = tl.load(WIN + h)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPE + h).to(tl.float32)
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    var = tl.zeros([BLOCK_M], dtype=tl.float32)
    ds2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    km_row = KM + b * skmb
    start, end = key_range(q0, BLOCK_M, T, Tk, lo, hi, window, CAUSAL, HAS_WINDOW)
    for j0 in range(start, end, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        kvmask = (offs_n[:, None] < Tk) & dmask[None, :]
        k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skt + offs_d[None, :], mask=kvmask, other=0.0)
        v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :], mask=kvmask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        logits, s, valid = score_tile(qk, offs_m, offs_n, T, Tk, lo, hi, window, scale, softcap, slope,
                                      km_row, CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM)
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # b_ij = u_i·v_j
        centred = dp - dd[:, None]                                # b − E_α[b]
        ds = p * centred                                          # ∂L/∂s: the routing law
        if STATS:
            var += tl.sum(ds * centred, axis=1)
            ds2 += tl.sum(ds * ds, axis=1)
        if HAS_SOFTCAP:
            th = tanh(logits / softcap)
            ds = ds * (1.0 - th * th)                             # back through c·tanh(l / c)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + bh * T * D + offs_m[:, None] * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=qmask)
    if STATS or HAS_SINK:
        st = ST + (bh * tl.num_programs(0) + pid_m) * 3
        if STATS:
            tl.store(st + 0, tl.sum(var, axis=0))
            tl.store(st + 1, tl.sum(ds2, axis=0))
        if HAS_SINK:                                              # ∂L/∂σ = −Σ_i p_σ,i D_i
            sigma = tl.load(SINK + h).to(tl.float32)
            tl.store(st + 2, -tl.sum(tl.where(rows, tl.exp(sigma - lse) * dd, 0.0), axis=0))


@triton.jit
def attn_bwd_dkdv(Q, K, V, DO, LSE, DD, DK, DV, ST, LO, HI, KM, SLOPE, WIN,
                  sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, skmb,
                  H, G, T, Tk, D, scale, softcap,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                  CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                  HAS_ALIBI: tl.constexpr, HAS_KM: tl.constexpr,
                  STATS: tl.constexpr, PRECISION: tl.constexpr):
    scale, softcap = fp32_scalars(scale, softcap)
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    Hk = H // G
    b = bhk // Hk
    hk = bhk % Hk
    k0 = pid_n * BLOCK_N
    offs_n = k0 + tl.arange(0, BLOCK_N)
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
    for g in range(G):                                            # the query heads of this kv head
        h = hk * G + g
        bh = b * H + h
        window = 0
        if HAS_WINDOW:
            window = tl.load(WIN + h)
        start, end = query_range(k0, BLOCK_N, T, Tk, lo, hi, window, CAUSAL, HAS_WINDOW)
        slope = 0.0
        if HAS_ALIBI:
            slope = tl.load(SLOPE + h).to(tl.float32)
        dv_h = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
        col = tl.zeros([BLOCK_N], dtype=tl.float32)
        for i0 in range(start, end, BLOCK_M):
            offs_m = i0 + tl.arange(0, BLOCK_M)
            rows = offs_m < T
            qmask = rows[:, None] & dmask[None, :]
            q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=qmask, other=0.0)
            do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=qmask, other=0.0)
            lse = tl.load(LSE + bh * T + offs_m, mask=rows, other=float("inf"))
            dd = tl.load(DD + bh * T + offs_m, mask=rows, other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            logits, s, valid = score_tile(qk, offs_m, offs_n, T, Tk, lo, hi, window, scale, softcap, slope,
                                          km_row, CAUSAL, HAS_WINDOW, HAS_SOFTCAP, HAS_ALIBI, HAS_KM)
            p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)   # (BLOCK_M, BLOCK_N)
            dv_h += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - dd[:, None])
            if HAS_SOFTCAP:
                th = tanh(logits / softcap)
                ds = ds * (1.0 - th * th)
            dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
            if STATS:
                col += tl.sum(p, axis=0)
        dv += dv_h
        if STATS:
            st = ST + (bh * tl.num_programs(0) + pid_n) * 4
            tl.store(st + 0, tl.max(tl.where(cols, col, 0.0), axis=0))
            tl.store(st + 1, tl.sum(tl.where(col > 0, col * tl.log(tl.where(col > 0, col, 1.0)), 0.0), axis=0))
            tl.store(st + 2, tl.sum(col, axis=0))
            tl.store(st + 3, tl.sum(tl.sum(dv_h * dv_h, axis=1), axis=0))
    tl.store(DK + bhk * Tk * D + offs_n[:, None] * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=kvmask)
    tl.store(DV + bhk * Tk * D + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kvmask)
