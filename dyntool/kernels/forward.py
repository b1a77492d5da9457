"""The fused attention's forward (FlashAttention-2 tiling): one program per (query block, b·h).

Online softmax over key blocks with fp32 accumulators; the output, the row log-sum-exp (what the
backward recomputes α from) and, when ``STATS``, four per-program partial statistics:

- ``Σ_i H_i`` with the entropy in its stable form H_i = (l'_i / l_i) log l_i + t_i / l_i,
  t_i = Σ_j e^{s_ij − m_i} (m_i − s_ij) rescaled like l when m grows (lse − Σ p s would cancel in
  fp32 on peaked rows); l' excludes the sink's term, so H is the real keys' part of the row, as
  ``torch.special.entr(α).sum`` of the eager path;
- ``max s_ij`` and ``max |τ q·k|`` over visible entries; ``Σ_i`` sink mass ``e^{σ − lse_i}``.

A sink enters as the row's starting state (m = σ, its term e^{σ − m} added at the end), so a row
with no visible key has output 0 and sink mass 1, as :func:`dyntool.quantities.masked_softmax`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .tiles import fp32_scalars, key_range, score_tile

N_FWD_STATS = 4            # entropy sum, score max, |logit| max, sink-mass sum


@triton.jit
def attn_fwd(Q, K, V, O, LSE, ST, LO, HI, KM, SINK, SLOPE, WIN,
             sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, skmb,
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
    hk = h // G                                                   # GQA: h reads kv head h // G
    q0 = pid_m * BLOCK_M
    offs_m = q0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    dmask = offs_d < D                                            # head dim padded to a power of 2
    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :],
                mask=(offs_m[:, None] < T) & dmask[None, :], other=0.0)
    lo = tl.load(LO + b)
    hi = tl.load(HI + b)
    window = 0
    if HAS_WINDOW:                                                # keys per query, per head
        window = tl.load(WIN + h)
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPE + h).to(tl.float32)
    sigma = 0.0
    if HAS_SINK:
        sigma = tl.load(SINK + h).to(tl.float32)
        m = tl.zeros([BLOCK_M], dtype=tl.float32) + sigma
    else:
        m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_real = tl.zeros([BLOCK_M], dtype=tl.float32)
    t_ent = tl.zeros([BLOCK_M], dtype=tl.float32)
    smax = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    lmax = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
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
        if STATS:
            lmax = tl.maximum(lmax, tl.max(tl.where(valid, tl.abs(logits), 0.0), axis=1))
            smax = tl.maximum(smax, tl.max(s, axis=1))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)      # an all-masked row so far
        alpha = tl.exp(m - m_use)
        p = tl.exp(s - m_use[:, None])                            # 0 where masked
        if STATS:
            # t holds Σ e^{s−m}(m − s): moving m to m_new scales it by α and adds (m_new − m) l'
            shift = tl.where(m == float("-inf"), 0.0, m_use - m)
            t_ent = alpha * (t_ent + shift * l_real) + tl.sum(p * tl.where(valid, m_use[:, None] - s, 0.0), 1)
        l_real = alpha * l_real + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    m_fin = tl.where(m == float("-inf"), 0.0, m)
    l_all = l_real
    if HAS_SINK:
        l_all = l_real + tl.exp(sigma - m_fin)
    nonempty = l_all > 0
    inv = tl.where(nonempty, 1.0 / tl.where(nonempty, l_all, 1.0), 0.0)
    out = acc * inv[:, None]                                      # rows with no key: 0
    rows = offs_m < T
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None] & dmask[None, :])
    log_l = tl.log(tl.where(nonempty, l_all, 1.0))
    lse = tl.where(nonempty, m_fin + log_l, float("inf"))        # +inf: α = e^{s − lse} = 0
    tl.store(LSE + bh * T + offs_m, lse, mask=rows)
    if STATS:
        ent = tl.where(rows & nonempty, l_real * inv * log_l + t_ent * inv, 0.0)
        st = ST + (bh * tl.num_programs(0) + pid_m) * 4
        tl.store(st + 0, tl.sum(ent, axis=0))
        tl.store(st + 1, tl.max(tl.where(rows, smax, float("-inf")), axis=0))
        tl.store(st + 2, tl.max(tl.where(rows, lmax, 0.0), axis=0))
        sink = 0.0
        if HAS_SINK:
            sink = tl.sum(tl.where(rows, tl.exp(sigma - m_fin) * inv, 0.0), axis=0)
        tl.store(st + 3, sink)
