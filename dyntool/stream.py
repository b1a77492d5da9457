"""The full tier streamed: one selected head at a time, in query-row blocks, nothing T × T kept.

:meth:`dyntool.capture.Capture.compute` returns every head's T × T matrices at once (fine at
T = 64, ~2 GiB for one head at T = 8192).  :func:`stream` computes the same quantities from the
same capture (its q, k, v, U, mask, scale and modifiers, all O(T·d)) for the heads of a
:class:`~dyntool.record.selection.Selection`, block of query rows by block:

- each block goes through :func:`dyntool.quantities.head_quantities` itself, so every per-row
  value (α, S, B, A, ∂L/∂S, E_α[b], entropies, dQ, sink mass) is the dense formula on those rows;
- what sums over query rows (dV = αᵀU, dK, column usage, the RMS logit, the routing residual)
  is summed over the blocks; ``logit_max`` is the max over the blocks;
- the matrices of a block are handed to ``emit`` (the recorder writes them into the zarr array,
  chunked along query rows) and dropped, so the peak is one block's temporaries, set by
  ``max_block_mib`` (:func:`rows_per_block`), whatever T is;
- a causal block reads only the keys its rows can see; what it does not compute is what the
  dense result holds there (0 in α/B/A/∂L/∂S, NaN scores), filled in before ``emit``.

Sites of different (T, Tk) (encoder–decoders) are padded to one size N exactly as ``compute()``
pads them; empty head slots of a selection (see :mod:`dyntool.record.selection`) are padding too.
The tests check every array against ``Capture.compute()`` in float64.
"""
from __future__ import annotations

from typing import Callable

import torch

from .capture import Capture, CaptureError, pad_to, site_where
from .cheap_stats import block_rows, key_ends
from .observe import expand_kv
from .quantities import head_quantities
from .record import names
from .record.pooling import pool_blocks
from .record.selection import Selection

# the (S, rows, Tk) temporaries of one block: head_quantities' (~13 at its peak) plus the padded
# copies handed to the writer
LIVE = 18
PAD = {"attn": 0.0, "compat": 0.0, "advantage": 0.0, "score_grad": 0.0, "scores": float("nan")}
ROW_VECTORS = ("expected_compat", "attn_entropy", "attn_entropy_norm", "sink_mass", "query_grad")
COLUMN_SUMS = ("value_grad", "key_grad", "column_usage")

Emit = Callable[[int, int, int, int, dict], None]


def rows_per_block(S: int, N: int, itemsize: int, max_block_mib: float, multiple: int = 1) -> int:
    """Query rows per block (a multiple of ``multiple``, e.g. the pooling block); 0 = the budget
    does not hold one."""
    rows = block_rows(S, 1, N, N, itemsize, max_block_mib, live=LIVE)
    return min(N, rows // multiple * multiple) if rows >= multiple else 0


def size(cap: Capture) -> int:
    """N: the length every site is stored at (the largest T or Tk)."""
    return max(max(sl.q.shape[-2], sl.k.shape[-2]) for sl in cap.slots.values())


@torch.no_grad()
def stream(cap: Capture, sel: Selection, emit: Emit, *, rows: int, crop: tuple[int, int] | None = None,
           matrices=names.MATRICES, pool: int = 0, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Compute the selected heads in blocks of ``rows`` query rows.

    ``emit(layer_index, slot, r0, r1, {name: (S, r1 − r0, N)})`` receives every block of the
    matrices in ``matrices`` whose rows [r0, r1) meet ``crop`` (default all; blocks are aligned
    to the crop's start unless ``pool`` asks for blocks aligned to 0).  Returns everything else,
    laid out (layer index, slot, S, ...) like ``compute()``'s (layer, head, S, ...), plus
    ``NAME_pooled`` overviews of the matrices in ``names.POOLED`` when ``pool > 0``."""
    N = size(cap)
    lo, hi = crop or (0, N)
    per_site = []
    for li, layer in enumerate(sel.layers):
        site = cap.sites[layer]
        slot = cap.slots.get(site)
        if slot is None or slot.u is None:
            raise CaptureError(f"{site_where(site)}: nothing captured for it (attention did not run, or backward "
                               "ran outside the Capture)")
        heads = []
        for si in range(sel.slots):
            if si < len(sel.heads[li]):
                h = sel.heads[li][si]
                heads.append(_head(cap, slot, h, N, rows, lo, hi, pool, matrices,
                                   lambda r0, r1, m, li=li, si=si: emit(li, si, r0, r1, m), dtype))
            else:
                heads.append(None)
        per_site.append(heads)
    ref = next(h for heads in per_site for h in heads if h is not None)
    out = {}
    for name, x in ref.items():
        filler = torch.full_like(x, float("nan"))
        out[name] = torch.stack([torch.cat([filler if h is None else h[name] for h in heads])
                                 for heads in per_site])
    S = ref["queries"].shape[1]
    for li in range(len(sel.layers)):           # empty slots: padding blocks, once per block
        for si in range(len(sel.heads[li]), sel.slots):
            for r0, r1 in _blocks(N, rows, lo, hi, pool):
                if r0 < hi and r1 > lo:
                    emit(li, si, max(r0, lo), min(r1, hi), _pad_block(matrices, S, min(r1, hi) - max(r0, lo), N,
                                                                      out["queries"].dtype, out["queries"].device))
    return out


def _blocks(N: int, rows: int, lo: int, hi: int, pool: int):
    """Row blocks covering [0, N): aligned to ``lo`` (so writes fill whole chunks of the crop),
    or to 0 when pooled tiles must not straddle blocks."""
    starts = list(range(0, N, rows)) if pool else \
        sorted(set(range(lo, hi, rows)) | set(range(0, lo, rows)) | set(range(hi, N, rows)))
    return [(a, min(b, N)) for a, b in zip(starts, starts[1:] + [N])]


def _key_ends(allowed, uniform, T: int, Tk: int, blocks) -> list[int]:
    """One past the last key each block's rows see (one host read per head, not one per block):
    :func:`dyntool.cheap_stats.key_ends` at one-row granularity, maxed over each block."""
    ends = key_ends(allowed, uniform, T, Tk, 1)                  # per query row
    return [max(ends[r0:min(r1, T)], default=1) for r0, r1 in blocks]


def _pad_block(matrices, S: int, n: int, N: int, dt, device) -> dict[str, torch.Tensor]:
    return {m: torch.full((S, n, N), PAD[m], dtype=dt, device=device) for m in matrices}


def _head(cap: Capture, slot, h: int, N: int, rows: int, lo: int, hi: int, pool: int, matrices, emit,
          dtype) -> dict[str, torch.Tensor]:
    """One head of one site, as ``Capture._layer`` computes it for every head, in row blocks."""
    dt = dtype or (torch.float64 if slot.q.dtype == torch.float64 else torch.float32)
    pick = lambda t: None if t is None else t[:, h if t.shape[1] > 1 else 0].unsqueeze(0)   # noqa: E731
    q, k, v = (pick(t).to(dt) for t in (slot.q, slot.k, slot.v))        # (1, S, T|Tk, d)
    u = pick(slot.u).to(dt) / cap.grad_scale
    allowed, uniform, bias = pick(slot.allowed), pick(slot.uniform_rows), pick(slot.bias)
    bias = None if bias is None else bias.to(dt)
    sinks = pick(slot.sinks)
    S, T, Tk = q.shape[1], q.shape[2], k.shape[2]
    f = dict(dtype=dt, device=q.device)                # every buffer where the captured tensors are (a GPU)
    acc = {"value_grad": torch.zeros_like(v), "key_grad": torch.zeros_like(k),
           "column_usage": torch.zeros(1, S, Tk, **f)}
    vec: dict[str, torch.Tensor] = {}
    pooled = {m: [] for m in matrices if pool and m in names.POOLED}
    computed = tuple(matrices) + (("scores",) if pooled and "scores" not in matrices else ())
    lmax = torch.zeros(1, **f)
    sumsq = torch.zeros(1, **f)
    count = torch.zeros(1, **f)                        # on the device: no sync per block
    resid = torch.zeros(2, **f) if slot.ds is not None else None
    blocks = _blocks(N, rows, lo, hi, pool)
    kends = _key_ends(allowed, uniform, T, Tk, blocks)  # keys no row of a block sees are skipped
    for (r0, r1), kend in zip(blocks, kends):
        a1 = min(r1, T)                                # rows past the site's T are padding
        mats = _pad_block(computed, S, r1 - r0, N, dt, q.device) if (r0 < hi and r1 > lo) or pooled else None
        if r0 < a1:
            al = allowed[..., r0:a1, :]
            uni = None if uniform is None else uniform[..., r0:a1, :]
            bb = None if bias is None else (bias[..., r0:a1, :kend] if bias.shape[-2] > 1 else bias[..., :kend])
            qs = head_quantities(q[..., r0:a1, :], k[..., :kend, :], v[..., :kend, :], u[..., r0:a1, :],
                                 al[..., :kend], slot.scale, bias=bb, softcap=slot.softcap,
                                 sinks=sinks, uniform_rows=uni)
            for n in ROW_VECTORS:
                if n in qs:
                    vec.setdefault(n, []).append(qs[n])
            acc["column_usage"][..., :kend] += qs["column_usage"]
            for n in ("value_grad", "key_grad"):        # keys past kend get nothing from this block
                acc[n][..., :kend, :] += qs[n]
            lmax = torch.maximum(lmax, qs["logit_max"])
            n_seen = al[..., :kend].expand(1, S, a1 - r0, kend).sum().to(dt)
            sumsq += qs["logit_norm"].square() * n_seen.clamp_min(1)
            count += n_seen
            if resid is not None:
                ds_auto = slot.ds[:, h, r0:a1, :kend].to(dt).unsqueeze(0) / cap.grad_scale
                seen_all = al[..., :kend] if uni is None else al[..., :kend] | uni
                resid[0] += (ds_auto - qs["score_grad"]).masked_fill(~seen_all, 0.0).square().sum()
                resid[1] += ds_auto.masked_fill(~seen_all, 0.0).square().sum()
            if mats is not None:
                for m in computed:
                    mats[m][:, : a1 - r0, :kend] = qs[m][0]
            del qs
        if mats is not None:
            vis = torch.isfinite(mats["scores"]).float() if pooled else None   # masked: NaN scores
            for m in pooled:                           # in float32, as the dense path pools
                pooled[m].append(pool_blocks(mats[m].float(), pool, vis))
            if r0 < hi and r1 > lo:
                c0, c1 = max(r0, lo), min(r1, hi)
                emit(c0, c1, {m: mats[m][:, c0 - r0: c1 - r0] for m in matrices})
    out = {"upstream": u, "values": v, "queries": q, "keys": k, "value_norm": v.norm(dim=-1), **acc,
           **{n: torch.cat(xs, dim=2) for n, xs in vec.items()},
           "logit_max": lmax, "logit_norm": (sumsq / count.clamp_min(1)).sqrt()}
    if resid is not None:
        out["routing_residual"] = resid[0:1].sqrt() / resid[1:2].sqrt().clamp_min(1e-300)
    if slot.dq is not None:
        out["query_grad"] = pick(slot.dq).to(dt) / cap.grad_scale
    if slot.dk is not None:
        out["key_grad"] = expand_kv(slot.dk, slot.q.shape[1])[:, h].unsqueeze(0).to(dt) / cap.grad_scale
    out = {n: pad_to(n, x, N) for n, x in out.items()}
    for m, parts in pooled.items():
        out[names.POOLED[m]] = torch.cat(parts, dim=1).unsqueeze(0)
    return out
