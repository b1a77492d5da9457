"""The cheap tier's statistics, computed in query-row blocks: no T × T matrix is ever kept.

Every statistic is a per-head reduction of a full-tier quantity of :mod:`dyntool.quantities`
(the tests check each against ``Capture.compute()`` in float64).  Per head, over the S observed
sequences and their T query rows (``Σ_s,i`` = over sequences and queries):

=====================  ===============================================================
``score_max``          ``max s_ij`` over allowed entries: the largest score the softmax sees
                       (after soft-cap and bias; the raw ``max |τ q·k|`` is ``logit_max``)
``logit_max``          ``max |τ q_i·k_j|`` over allowed entries (as the full tier's)
``attn_entropy``       ``Σ_s,i H_i / (S T)``: mean attention entropy (nats)
``expected_compat``    ``Σ_s,i E_α[b]_i / (S T)`` with ``E_α[b]_i = Σ_j α_ij b_ij (= u_i·o_i)``
``compat_var``         ``Σ_s,i Var_α[b]_i / (S T)``, ``Var_α[b]_i = Σ_j α_ij (b_ij − E_α[b]_i)²``
``score_grad_norm``    ``sqrt(Σ_s ‖∂L/∂S‖²_F / S)``: per-sequence Frobenius norm, RMS over the batch
``upstream_norm``      ``sqrt(Σ_s ‖U‖²_F / S)``
``value_grad_norm``    ``sqrt(Σ_s ‖Σ_i α_ij u_i‖²_F / S)``: the value update ``dV = αᵀ U``
``column_max``         ``Σ_s max_j c_j / (S T)`` with column usage ``c_j = Σ_i α_ij``
``column_entropy``     ``Σ_s H(c / Σ_j c_j) / S``: how spread the keys' usage is (nats)
``sink_mass``          ``Σ_s,i (1 − Σ_j α_ij) / (S T)`` (models with attention sinks only)
=====================  ===============================================================

Layout: grouped-query attention is computed without repeating k and v: queries are viewed as
(B, n_kv, g, T, d) against keys (B, n_kv, 1, Tk, d), so a head's statistics cost what its
own attention costs.  Row blocks are sized from a memory budget (``max_block_mib``); with a causal
mask a block only reads the keys its rows can see.

Precision: the inputs come in their own dtype (bf16/fp16 under autocast) and each block's slice is
cast to the compute dtype (:func:`compute_dtype`: float32, float64 kept) as it is read, so the
statistics are the ones of the up-cast inputs while no up-cast copy of q, k, v or U is ever made
(at B = 8, 16 heads, T = 8192, d = 64 each copy was 256 MiB held through the backward).
"""
from __future__ import annotations

import dataclasses

import torch

from .quantities import compute_dtype, masked_softmax, score_parts

# the live (B, n_kv, g, rows, Tk) temporaries of one row block (logits, scores, α, B, dS, …)
_LIVE_BLOCKS = 6


def grouped(t: torch.Tensor | None, n_kv: int, nh: int) -> torch.Tensor | None:
    """(B|1, nh|1, ...) → (B|1, n_kv|1, g|1, ...): query head h = kv head h // g, member h % g."""
    if t is None:
        return None
    if t.shape[1] == nh and nh != 1:
        return t.unflatten(1, (n_kv, nh // n_kv))
    return t.unsqueeze(2)                           # shared by every head: broadcast


CPU_BLOCK_MIB = 64.0        # cache-sized blocks: larger ones ran no faster on 2-16 cores
GPU_BLOCK_MIB_MAX = 2048.0


def block_budget_mib(max_block_mib: float, device) -> float:
    """``record.max_block_mib`` for ``device``: a set value as it is; 0 (the default) sized for the
    device: 64 MiB on the CPU, on a GPU 1/32 of its memory up to 2 GiB (2 GiB on an H100).  Why: a
    block's work is a few launches whatever its size, so the 64 MiB that suit a CPU cache left the
    eager cheap tier launch-bound on an H100 (4051 ms per step at T = 2048 against 1018 ms with
    larger blocks, docs/performance.md)."""
    if max_block_mib > 0:
        return float(max_block_mib)
    dev = torch.device(device)
    if dev.type != "cuda":
        return CPU_BLOCK_MIB
    total = torch.cuda.get_device_properties(dev).total_memory / 2**20
    return float(min(GPU_BLOCK_MIB_MAX, max(CPU_BLOCK_MIB, total / 32)))


def block_rows(B: int, nh: int, T: int, Tk: int, itemsize: int, max_block_mib: float,
               live: int = _LIVE_BLOCKS, row_bytes: int = 0) -> int:
    """Query rows per block so that the block's ``live`` (B, nh, rows, Tk) temporaries of
    ``itemsize`` bytes (the compute dtype's, not the inputs') plus ``row_bytes`` more per row fit
    ``max_block_mib``; 0 = not even one.  (The full tier streamed passes its own count.)"""
    per_row = live * B * nh * Tk * itemsize + row_bytes
    return min(T, int(max_block_mib * 2**20 // per_row)) if max_block_mib > 0 else 0


def host_reads(device: torch.device) -> bool:
    """Whether the eager cheap tier may read the mask on the host to skip work: on the CPU (a read
    is free), not on a GPU (each would be a sync per site and step, stalling the launch queue)."""
    return device.type == "cpu"


def uniform_rows(v: torch.Tensor, out: torch.Tensor, allowed: torch.Tensor, sinks: torch.Tensor | None,
                 n_head: int) -> torch.Tensor | None:
    """Rows with no visible key that the attention made uniform over all keys (an additive-mask
    softmax) rather than 0 (SDPA): read off the output, as :func:`dyntool.selfcheck.verify` does,
    but for the empty rows only (no T × T work).  ``v`` (B, n_kv, Tk, d), ``out`` (B, nh, T, d),
    ``allowed`` (B|1, nh|1, T, Tk), ``sinks`` (nh,) or None.  Returns (B, nh, T, 1) bool or None."""
    empty = ~allowed.any(-1, keepdim=True)                          # (B|1, nh|1, T, 1)
    read = host_reads(v.device)                 # on a GPU no host test (a sync per site and step):
    if read and not bool(empty.any()):          # the mask comes back, all False when no row is
        return None
    Tk = v.shape[-2]
    vsum = v.sum(-2, keepdim=True).repeat_interleave(n_head // v.shape[1], dim=1)   # (B, nh, 1, d)
    denom = torch.full((1, n_head, 1, 1), float(Tk), dtype=v.dtype, device=v.device)
    if sinks is not None:                       # all-zero scores plus the sink's logit
        denom = denom + sinks.to(v.dtype).exp().reshape(1, -1, 1, 1)
    o_u = vsum / denom
    err_zero = out.norm(dim=-1, keepdim=True)
    err_unif = (out - o_u).norm(dim=-1, keepdim=True)
    rows = empty & (err_unif < err_zero)
    return rows if not read or bool(rows.any()) else None


def key_ends(allowed: torch.Tensor, uniform: torch.Tensor | None, T: int, Tk: int, rows: int) -> list[int]:
    """For each block of ``rows`` query rows, one past the last key any of its rows sees (every key
    when a block holds a uniform row, which reads them all), read from the mask in one host
    transfer per call, i.e. once per layer and step, instead of three syncs per block (a
    ``nonzero``, an ``int`` and an ``any``, which on a GPU made the cheap tier launch-bound)."""
    vis = allowed.reshape(-1, allowed.shape[-2], Tk).any(0)                  # (T|1, Tk)
    last = torch.where(vis.any(-1), Tk - 1 - vis.flip(-1).int().argmax(-1), 0)   # (T|1,)
    if uniform is not None:
        last = torch.maximum(last.expand(T), uniform.reshape(-1, T).any(0).long() * (Tk - 1))
    nblk = -(-T // rows)
    pad = torch.zeros(nblk * rows, dtype=last.dtype, device=last.device)
    pad[:T] = last.expand(T)
    return [int(x) + 1 for x in pad.reshape(nblk, rows).amax(-1).tolist()]     # the one host read


@dataclasses.dataclass(frozen=True)
class SumSpec:
    """How one running sum becomes its statistic (every path reads this table: :meth:`Sums.finish`,
    the fused kernel's per-head sums, the flight recorder's all-sites block)."""
    stat: str          # the statistic it becomes (its metric base, dyntool.record.metric_names)
    per: str           # averaged over "rows" (query rows) or "seqs" (sequences)
    u_power: int       # factors of U in each term: divided by grad_scale ** u_power (U = dO / scale)
    root: bool         # a norm: the square root of the per-sequence sum of squares


SUMS = {
    "ent": SumSpec("attn_entropy", "rows", 0, False),
    "eb": SumSpec("expected_compat", "rows", 1, False),
    "var": SumSpec("compat_var", "rows", 2, False),
    "ds2": SumSpec("score_grad_norm", "seqs", 2, True),
    "u2": SumSpec("upstream_norm", "seqs", 2, True),
    "dv2": SumSpec("value_grad_norm", "seqs", 2, True),
    "colmax": SumSpec("column_max", "rows", 0, False),
    "colent": SumSpec("column_entropy", "seqs", 0, False),
    "sink": SumSpec("sink_mass", "rows", 0, False),     # sink models only
}


class Sums:
    """Running per-head sums of one site (nh,), on the device; finished by :meth:`finish`."""

    FIELDS = ("rows", "seqs", *SUMS)

    def __init__(self, nh: int, dtype, device):
        z = lambda: torch.zeros(nh, dtype=dtype, device=device)       # noqa: E731
        for f in self.FIELDS:
            setattr(self, f, z())
        self.score_max = torch.full((nh,), float("-inf"), dtype=dtype, device=device)
        self.logit_max = torch.zeros(nh, dtype=dtype, device=device)
        self.has_sinks = False

    def finish(self) -> dict[str, torch.Tensor]:
        count = {"rows": self.rows.clamp_min(1), "seqs": self.seqs.clamp_min(1)}
        out = {"score_max": self.score_max, "logit_max": self.logit_max}
        for name, spec in SUMS.items():
            if name == "sink" and not self.has_sinks:
                continue
            x = getattr(self, name) / count[spec.per]
            out[spec.stat] = x.sqrt() if spec.root else x
        return out


@torch.no_grad()
def given_maxima(logits, scores, allowed) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logit_max, score_max)`` per head (nh,) of one forward whose α the model handed over:
    ``logits`` τ q kᵀ and ``scores`` the softmax's input, each (B, nh, T, Tk), over the ``allowed``
    entries.  Reduced in the forward, so neither tensor is kept until the backward."""
    lm = logits.abs().masked_fill(~allowed, 0.0).amax(dim=(0, 2, 3))
    sm = scores.to(logits.dtype).masked_fill(~allowed, float("-inf")).amax(dim=(0, 2, 3))
    return lm, sm


@torch.no_grad()
def accumulate(sums: Sums, q, k, v, o, u, allowed, scale: float, *, bias=None, softcap=None, sinks=None,
               uniform=None, max_block_mib: float = 0.0, grad_scale: float = 1.0, alpha=None,
               maxima=None) -> None:
    """Add one forward's statistics to ``sums``.  ``q`` (B, nh, T, d_k), ``k``/``v`` (B, n_kv, Tk, d),
    ``o``/``u`` (B, nh, T, d_v) (U is divided by ``grad_scale``, the loss factor; ``o`` is not read:
    the empty-row decision, ``uniform``, was made from it), ``allowed`` (B|1, nh|1, T, Tk), ``bias``
    broadcastable to (B, nh, T, Tk), ``sinks`` (nh,), ``uniform`` (B, nh, T, 1) or None.  Tensors
    in any float dtype: each block's slice is cast to :func:`compute_dtype` of ``q``'s as it is
    read (the same arithmetic as up-casting first, no whole copy).  ``alpha`` (B, nh, T, Tk): the
    model's own attention weights (the dataflow adapter has them), used as they are instead of
    recomputed from q, k and the score modifiers; its ``maxima`` (:func:`given_maxima`) come with it."""
    B, nh, T, _ = q.shape
    n_kv, Tk = k.shape[1], k.shape[-2]
    dt = compute_dtype(q.dtype)
    max_block_mib = block_budget_mib(max_block_mib, q.device)
    # a block's temporaries are compute-dtype whatever the inputs' itemsize (sizing them by a bf16
    # input's 2 bytes made blocks twice the budget); per row it also holds its q and U rows cast
    # (U divided), and a per-row bias's row cast when it is not in the compute dtype; the keys and
    # values are cast once for the call (the budget holds them whole: a block could read them all)
    kv_mib = 0.0 if k.dtype == v.dtype == dt else (k.numel() + v.numel()) * dt.itemsize / 2**20
    row_bytes = B * nh * (q.shape[-1] + u.shape[-1]) * dt.itemsize
    if bias is not None and bias.dtype != dt and bias.dim() >= 2 and bias.shape[-2] > 1:
        row_bytes += bias[..., 0, :].numel() * dt.itemsize             # (B|1, nh|1, 1, Tk) per row
    rows = block_rows(B, nh, T, Tk, dt.itemsize, max_block_mib - kv_mib, row_bytes=row_bytes)
    if rows < 1:
        raise ValueError(f"record.max_block_mib={max_block_mib} is too small for one query row "
                         f"({B}×{nh}×{Tk} scores)")
    gq, gu = (grouped(t, n_kv, nh) for t in (q, u))                   # (B, n_kv, g, T, d)
    gk, gv = k.to(dt).unsqueeze(2), v.to(dt).unsqueeze(2)             # (B, n_kv, 1, Tk, d), cast once
    gal, gbias, guni = grouped(allowed, n_kv, nh), grouped(bias, n_kv, nh), grouped(uniform, n_kv, nh)
    galpha = grouped(alpha, n_kv, nh)
    if gbias is not None and gbias.dim() < 5:
        gbias = gbias.reshape((1,) * (5 - gbias.dim()) + tuple(gbias.shape))
    gsink = None if sinks is None else sinks.to(dt).reshape(1, n_kv, nh // n_kv, 1, 1)
    col = torch.zeros(B, n_kv, nh // n_kv, Tk, dtype=dt, device=q.device)   # c_j
    dv = torch.zeros(B, n_kv, nh // n_kv, Tk, v.shape[-1], dtype=dt, device=q.device)  # αᵀU per query head
    flat = lambda t: t.reshape(nh)          # noqa: E731  per-head reductions (n_kv, g) → (nh,)
    # keys no row of a block sees are skipped, read from the mask on the host: on a GPU that read
    # would be a sync per site and step, so there each block takes every key (masked ones weigh 0;
    # with a GPU's block budget most steps are one or two blocks anyway)
    ends = key_ends(allowed, uniform, T, Tk, rows) if host_reads(q.device) else [Tk] * (-(-T // rows))
    for a0, kend in zip(range(0, T, rows), ends):
        a1 = min(a0 + rows, T)
        al = gal[..., a0:a1, :]
        uni = None if guni is None else guni[..., a0:a1, :]
        al = al[..., :kend]
        bb = None
        if gbias is not None:               # a bias with one row broadcasts over the queries
            bb = (gbias[..., a0:a1, :kend] if gbias.shape[-2] > 1 else gbias[..., :kend]).to(dt)
        # this block's inputs in the compute dtype (no copy when they are in it already)
        ub = gu[..., a0:a1, :].to(dt) / grad_scale                          # (B, n_kv, g, rows, d_v)
        vb = gv[..., :kend, :]                                              # (B, n_kv, 1, kend, d_v)
        if galpha is not None:          # the model's own α: nothing to recompute (maxima came with it)
            a, sink_mass = galpha[..., a0:a1, :kend].to(dt), None
        else:
            logits, s = score_parts(gq[..., a0:a1, :].to(dt), gk[..., :kend, :], scale, softcap, bb)
            seen = al
            if uni is not None:                        # uniform rows: every key, equal scores (a block
                al = al | uni                          # without one is unchanged: uni is all False)
                s = s.masked_fill(uni, 0.0)
            # (B, n_kv, g, rows, kend) from here on
            sums.logit_max = torch.maximum(sums.logit_max, flat(
                logits.abs().masked_fill_(~seen, 0.0).amax(dim=(0, 3, 4))))
            sums.score_max = torch.maximum(sums.score_max, flat(
                s.masked_fill(~seen, float("-inf")).amax(dim=(0, 3, 4))))
            del logits
            a, sink_mass = masked_softmax(s, al, gsink)
            del s
        sums.ent += flat(torch.special.entr(a).sum(dim=(0, 3, 4)))
        b = torch.matmul(ub, vb.transpose(-1, -2)).masked_fill_(~al, 0.0)
        e = (a * b).sum(-1, keepdim=True)                                   # E_α[b]  (…, rows, 1)
        b -= e                                                              # b − E_α[b]
        ds = a * b                                                          # ∂L/∂S (routing law)
        sums.eb += flat(e.sum(dim=(0, 3, 4)))
        sums.var += flat((ds * b).sum(dim=(0, 3, 4)))
        sums.ds2 += flat(ds.square().sum(dim=(0, 3, 4)))
        del b, ds
        dv[..., :kend, :] += torch.matmul(a.transpose(-1, -2), ub)
        col[..., :kend] += a.sum(-2)
        sums.u2 += flat(ub.square().sum(dim=(0, 3, 4)))
        if sink_mass is not None:
            sums.sink += flat(sink_mass.sum(dim=(0, 3)))
            sums.has_sinks = True
    if maxima is not None:
        sums.logit_max = torch.maximum(sums.logit_max, maxima[0].to(dt))
        sums.score_max = torch.maximum(sums.score_max, maxima[1].to(dt))
    sums.rows += B * T
    sums.seqs += B
    sums.dv2 += flat(dv.square().sum(dim=(0, 3, 4)))
    sums.colmax += flat(col.amax(-1).sum(0))
    p = col / col.sum(-1, keepdim=True).clamp_min(torch.finfo(col.dtype).tiny)
    sums.colent += flat(torch.special.entr(p).sum(-1).sum(0))
