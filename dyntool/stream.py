"""The full tier streamed: the selected heads of a layer together, in query-row blocks, nothing T × T kept.

:meth:`dyntool.capture.Capture.compute` returns every head's T × T matrices at once (fine at
T = 64, ~2 GiB for one head at T = 8192).  :func:`stream` computes the same quantities from the
same capture (its q, k, v, U, mask, scale and modifiers, all O(T·d)) for the heads of a
:class:`~dyntool.record.selection.Selection`, block of query rows by block:

- a layer's selected heads go through a block together, as many as ``max_block_mib`` holds at the
  block's rows (:func:`heads_per_block`; all of them at the sizes a training run records on a GPU,
  one when a head alone needs several blocks; on a CPU only while the block is small), with a head
  axis in front: (G, S, rows, Tk).  Why: one head at a time cost nh times the launches and host
  reads of one block of nh heads, and on a GPU a recorded step was launch-bound;
- the key range of every block is read off the mask once per layer (one host transfer), not per
  head or per block;
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
from .cheap_stats import block_rows, compute_dtype, key_ends
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
# score entries of one (G, S, rows, N) block beyond which a CPU gains nothing from more heads in it:
# a bigger block stops paying once an op's work dwarfs its dispatch (~10 µs) and starts to cost once
# its temporaries leave the cache (2-core EPYC, S = 4: 4 heads of T = 64 together 0.6× the time of
# one at a time, 4 heads of T = 256 1.2×).  A GPU is held to the budget only: there launches count
CPU_BLOCK_ENTRIES = 2**18


def rows_per_block(S: int, N: int, itemsize: int, max_block_mib: float, multiple: int = 1) -> int:
    """Query rows per block of one head (a multiple of ``multiple``, e.g. the pooling block);
    0 = the budget does not hold one."""
    rows = block_rows(S, 1, N, N, itemsize, max_block_mib, live=LIVE)
    return min(N, rows // multiple * multiple) if rows >= multiple else 0


def heads_per_block(S: int, N: int, rows: int, itemsize: int, max_block_mib: float | None,
                    cpu: bool = False) -> int:
    """Heads computed together in blocks of ``rows`` query rows: as many as ``max_block_mib``
    holds (on a CPU, no more than :data:`CPU_BLOCK_ENTRIES` entries), at least one (``rows`` was
    sized for one); None = one head at a time."""
    if max_block_mib is None:
        return 1
    g = int(max_block_mib * 2**20 // (LIVE * S * rows * N * itemsize))
    return max(1, min(g, CPU_BLOCK_ENTRIES // (S * rows * N)) if cpu else g)


def size(cap: Capture) -> int:
    """N: the length every site is stored at (the largest T or Tk)."""
    return max(max(sl.q.shape[-2], sl.k.shape[-2]) for sl in cap.slots.values())


@torch.no_grad()
def stream(cap: Capture, sel: Selection, emit: Emit, *, rows: int, crop: tuple[int, int] | None = None,
           matrices=names.MATRICES, pool: int = 0, dtype: torch.dtype | None = None,
           max_block_mib: float | None = None) -> dict[str, torch.Tensor]:
    """Compute the selected heads in blocks of ``rows`` query rows, as many heads of a layer in
    one block as ``max_block_mib`` holds (:func:`heads_per_block`; None = one at a time).

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
        dt = _dtype(slot, dtype)
        hs = list(sel.heads[li])
        G = heads_per_block(slot.q.shape[0], N, rows, dt.itemsize, max_block_mib, slot.q.device.type == "cpu")
        blocks = _blocks(N, rows, lo, hi, pool)
        reads = _block_reads(slot, blocks)                  # one host read per layer, not per head
        heads = []
        for g0 in range(0, len(hs), G):
            res = _heads(cap, slot, hs[g0:g0 + G], N, blocks, reads, lo, hi, pool, matrices,
                         lambda gi, r0, r1, m, li=li, g0=g0: emit(li, g0 + gi, r0, r1, m), dt)
            heads += [{n: x[g:g + 1] for n, x in res.items()} for g in range(len(hs[g0:g0 + G]))]
        per_site.append(heads + [None] * (sel.slots - len(hs)))
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
                    emit(li, si, max(r0, lo), min(r1, hi), _pad_block(matrices, (S, min(r1, hi) - max(r0, lo), N),
                                                                      out["queries"].dtype, out["queries"].device))
    return out


def _blocks(N: int, rows: int, lo: int, hi: int, pool: int):
    """Row blocks covering [0, N): aligned to ``lo`` (so writes fill whole chunks of the crop),
    or to 0 when pooled tiles must not straddle blocks."""
    starts = list(range(0, N, rows)) if pool else \
        sorted(set(range(lo, hi, rows)) | set(range(0, lo, rows)) | set(range(hi, N, rows)))
    return [(a, min(b, N)) for a, b in zip(starts, starts[1:] + [N])]


def _block_reads(slot, blocks) -> tuple[list[int], list[bool] | None]:
    """For each block: one past the last key its rows see (:func:`dyntool.cheap_stats.key_ends`
    at one-row granularity, maxed over the block; a uniform row reads every key), and whether it
    holds a uniform row (None: the site has none).  The mask of every head at once, read once per
    layer: a block without a uniform row is then computed without ``head_quantities``' test for
    them (a host read)."""
    T, Tk = slot.q.shape[-2], slot.k.shape[-2]
    ends = key_ends(slot.allowed, slot.uniform_rows, T, Tk, 1)                     # per query row
    kends = [max(ends[r0:min(r1, T)], default=1) for r0, r1 in blocks]
    if slot.uniform_rows is None:
        return kends, None
    rows = slot.uniform_rows.reshape(-1, T).any(0).tolist()                        # (T,)
    return kends, [any(rows[r0:min(r1, T)]) for r0, r1 in blocks]


def _pad_block(matrices, shape: tuple, dt, device) -> dict[str, torch.Tensor]:
    return {m: torch.full(shape, PAD[m], dtype=dt, device=device) for m in matrices}


def _dtype(slot, dtype) -> torch.dtype:
    return dtype or compute_dtype(slot.q.dtype)


def _taker(hs: list[int]):
    """Heads ``hs`` along axis 1: a view when they are consecutive (a selection such as ``L0H*``),
    else one ``index_select`` (advanced indexing ``t[:, hs]`` cost ~40 µs a call on a CPU)."""
    if hs == list(range(hs[0], hs[0] + len(hs))):
        return lambda t: t.narrow(1, hs[0], len(hs))
    idx: dict = {}

    def take(t):
        if t.device not in idx:             # on a GPU through pinned memory: a copy, never a sync
            i = torch.tensor(hs, device="cpu")          # staged on the host, then pinned
            idx[t.device] = i if t.device.type == "cpu" else i.pin_memory().to(t.device, non_blocking=True)
        return t.index_select(1, idx[t.device])
    return take


def _heads(cap: Capture, slot, hs: list[int], N: int, blocks, reads, lo: int, hi: int, pool: int, matrices,
           emit, dt) -> dict[str, torch.Tensor]:
    """Heads ``hs`` of one site, as ``Capture._layer`` computes every head, in row blocks; every
    tensor has the G = len(hs) heads in front: (G, S, ...).  ``emit(g, r0, r1, {name: (S, rows, N)})``."""
    G = len(hs)
    take = _taker(hs)
    # (S|1, nh|1, ...) → (G|1, S|1, ...): the heads of the group, or the one slice a shared tensor has
    pick = lambda t: None if t is None else (take(t) if t.shape[1] > 1 else t[:, :1]).transpose(0, 1)  # noqa: E731
    q, k, v = (pick(t).to(dt) for t in (slot.q, slot.k, slot.v))        # (G, S, T|Tk, d)
    u = pick(slot.u).to(dt) / cap.grad_scale
    allowed, uniform, bias = pick(slot.allowed), pick(slot.uniform_rows), pick(slot.bias)
    bias = None if bias is None else bias.to(dt)
    sinks = pick(slot.sinks)                                             # (G, 1, 1, 1)
    S, T, Tk = q.shape[1], q.shape[2], k.shape[2]
    f = dict(dtype=dt, device=q.device)                # every buffer where the captured tensors are (a GPU)
    acc = {"value_grad": torch.zeros_like(v), "key_grad": torch.zeros_like(k),
           "column_usage": torch.zeros(G, S, Tk, **f)}
    vec: dict[str, torch.Tensor] = {}
    pooled = {m: [] for m in matrices if pool and m in names.POOLED}
    computed = tuple(matrices) + (("scores",) if pooled and "scores" not in matrices else ())
    lmax = torch.zeros(G, **f)
    sumsq = torch.zeros(G, **f)
    count = torch.zeros(G, **f)                        # on the device: no sync per block
    resid = torch.zeros(2, G, **f) if slot.ds is not None else None
    kends, has_uni = reads                             # keys no row of a block sees are skipped
    for bi, ((r0, r1), kend) in enumerate(zip(blocks, kends)):
        a1 = min(r1, T)                                # rows past the site's T are padding
        mats = _pad_block(computed, (G, S, r1 - r0, N), dt, q.device) if (r0 < hi and r1 > lo) or pooled else None
        if r0 < a1:
            al = allowed[..., r0:a1, :]
            uni = uniform[..., r0:a1, :] if has_uni is not None and has_uni[bi] else None
            bb = None if bias is None else (bias[..., r0:a1, :kend] if bias.shape[-2] > 1 else bias[..., :kend])
            qs = head_quantities(q[..., r0:a1, :], k[..., :kend, :], v[..., :kend, :], u[..., r0:a1, :],
                                 al[..., :kend], slot.scale, bias=bb, softcap=slot.softcap,
                                 sinks=sinks, uniform_rows=uni)          # (G, S, rows, kend) matrices
            for n in ROW_VECTORS:
                if n in qs:
                    vec.setdefault(n, []).append(qs[n])
            acc["column_usage"][..., :kend] += qs["column_usage"]
            for n in ("value_grad", "key_grad"):        # keys past kend get nothing from this block
                acc[n][..., :kend, :] += qs[n]
            lmax = torch.maximum(lmax, qs["logit_max"])
            n_seen = al[..., :kend].expand(G, S, a1 - r0, kend).sum(dim=(1, 2, 3)).to(dt)   # (G,)
            sumsq += qs["logit_norm"].square() * n_seen.clamp_min(1)
            count += n_seen
            if resid is not None:
                ds_auto = take(slot.ds[..., r0:a1, :kend]).to(dt).transpose(0, 1) / cap.grad_scale
                seen_all = al[..., :kend] if uni is None else al[..., :kend] | uni
                resid[0] += (ds_auto - qs["score_grad"]).masked_fill(~seen_all, 0.0).square().sum(dim=(1, 2, 3))
                resid[1] += ds_auto.masked_fill(~seen_all, 0.0).square().sum(dim=(1, 2, 3))
            if mats is not None:
                for m in computed:
                    mats[m][:, :, : a1 - r0, :kend] = qs[m]
            del qs
        if mats is not None:
            vis = torch.isfinite(mats["scores"]).float() if pooled else None   # masked: NaN scores
            for m in pooled:                           # in float32, as the dense path pools
                pooled[m].append(pool_blocks(mats[m].float(), pool, vis))
            if r0 < hi and r1 > lo:
                c0, c1 = max(r0, lo), min(r1, hi)
                for g in range(G):
                    emit(g, c0, c1, {m: mats[m][g, :, c0 - r0: c1 - r0] for m in matrices})
    out = {"upstream": u, "values": v, "queries": q, "keys": k, "value_norm": v.norm(dim=-1), **acc,
           **{n: torch.cat(xs, dim=2) for n, xs in vec.items()},
           "logit_max": lmax, "logit_norm": (sumsq / count.clamp_min(1)).sqrt()}
    if resid is not None:
        out["routing_residual"] = resid[0].sqrt() / resid[1].sqrt().clamp_min(1e-300)
    if slot.dq is not None:
        out["query_grad"] = pick(slot.dq).to(dt) / cap.grad_scale
    if slot.dk is not None:
        out["key_grad"] = pick(expand_kv(slot.dk, slot.q.shape[1])).to(dt) / cap.grad_scale
    out = {n: pad_to(n, x, N) for n, x in out.items()}
    for m, parts in pooled.items():
        out[names.POOLED[m]] = torch.cat(parts, dim=2)
    return out
