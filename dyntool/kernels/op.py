"""The fused attention as ``torch.library`` custom ops (``triton_op`` + ``wrap_triton``), with autograd.

``dyntool::attn_fwd`` returns (out, lse·log₂e, the forward statistics' per-head sums);
``dyntool::attn_bwd`` returns (dq, dk, dv, dσ, the backward statistics' per-head sums): the kernels'
per-program partials are reduced inside the ops (:mod:`.stats`), in the graph of a compiled step.  Both are functional (no argument is
mutated), so a compiled step can trace them on a GPU (under the interpreter, where
``wrap_triton`` cannot be traced, they are opaque ``custom_op``s: ``_op``).  The backward's statistics leave autograd as the *gradient of a token*: a
zero tensor passed to the forward with ``requires_grad``; after ``backward()`` its ``.grad`` holds
the per-head sums (a fresh token per forward, so nothing is summed across calls that should not).

Layout: q (B, H, T, D), k/v (B, H_kv, Tk, D), any strides with a contiguous last dimension.
Key padding: per-batch visible key range [lo, hi) and/or a (B, Tk) key mask (int8, 1 = key).
"""
from __future__ import annotations

import dataclasses
import math
import os

import torch
import triton
from torch.library import triton_op, wrap_triton

from ..errors import ConfigError
from . import backward as bw
from . import forward as fw
from . import stats as kstats


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


TUNING_ENV = "DYNTOOL_KERNEL_TILES"


def tuning(spec: str | None) -> tuple[int, int, int | None, int | None] | None:
    """``"BLOCK_M,BLOCK_N[,WARPS[,STAGES]]"`` → a tuple (None: the defaults).  For the tuning bench
    (bench/gpu_kernel_tune.py), read once at import: a compiled step must not read the environment,
    and every call must agree on the tiles (the statistics' partials are laid out per tile)."""
    if not spec:
        return None
    try:
        vals = [int(x) for x in spec.split(",")]
    except ValueError:
        vals = []
    pow2 = lambda x: x >= 1 and x & (x - 1) == 0                    # noqa: E731
    if not 2 <= len(vals) <= 4 or not all(pow2(x) for x in vals[:3]) or min(vals[:2]) < 16 or min(vals) < 1:
        raise ConfigError(TUNING_ENV, f"{spec!r} is not BLOCK_M,BLOCK_N[,WARPS[,STAGES]] (tiles powers of 2 "
                                      ">= 16, warps a power of 2, stages >= 1)")
    return (*vals, *[None] * (4 - len(vals)))


TUNED = tuning(os.environ.get(TUNING_ENV))

DQ_ENV = "DYNTOOL_KERNEL_DQ"
DQ_POLICIES = ("split", "atomic")


def dq_policy(spec: str | None) -> str:
    """How the backward makes dQ: ``split`` (default: FlashAttention-2's deterministic split, a dQ
    program per query block recomputing S and dP: 7 matmul units) or ``atomic`` (FA2's 5 units: the
    dK/dV programs add dS·K into an fp32 dQ with ``tl.atomic_add``; dQ's low bits then depend on the
    order the programs run, the statistics stay deterministic).  ``DYNTOOL_KERNEL_DQ`` sets the
    process default, read once at import as the tiles are; ``attention(dq=...)`` per call."""
    spec = (spec or "split").strip()
    if spec not in DQ_POLICIES:
        raise ConfigError(DQ_ENV, f"{spec!r} is not one of {', '.join(DQ_POLICIES)}")
    return spec


DQ_DEFAULT = dq_policy(os.environ.get(DQ_ENV))


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Each program's tiles.  ``m`` query rows per forward and dQ program and ``kv`` keys per dK/dV
    program fix the statistics' partial layout (one per program), so neither depends on the head
    dimension; ``n`` keys per forward/dQ tile and ``kv_m`` query rows per dK/dV tile may (the
    tutorial's asymmetric tiles: at d = 128, 64 × 32 keep the fp32 accumulators in registers, see
    docs/performance.md's census)."""
    m: int
    n: int
    kv: int
    kv_m: int
    warps: int | None = None
    stages: int | None = None
    kv_warps: int | None = None           # the dK/dV program's, where they differ
    kv_stages: int | None = None

    def dkdv(self) -> "Tiles":
        """These tiles with the dK/dV program's warps and stages (what its launch takes)."""
        return dataclasses.replace(self, warps=self.kv_warps or self.warps, stages=self.kv_stages or self.stages)


def tiles(D: int, gpu: bool | None = None, dq: str = "split") -> Tiles:
    """16 everywhere under the interpreter (tl.dot's smallest tile, fastest there); on a GPU 64 × 64
    with 4 warps and 3 stages up to d = 64, 64 × 32 beyond (checked by the census: no spills, ≥ 2
    blocks per SM); or ``DYNTOOL_KERNEL_TILES`` (BLOCK_M,BLOCK_N for every program).  ``gpu``: the
    tiles of a GPU run (True) or of the interpreter (False) whatever this process runs (the census).
    The atomic dQ policy's dK/dV program also holds a dQ tile: 64 keys × 32 queries with 2 stages up
    to d = 64, 128 × 32 with 8 warps beyond, the census's settings without spills (its 64 × 64 spills)."""
    if TUNED:
        return Tiles(TUNED[0], TUNED[1], TUNED[1], TUNED[0], TUNED[2], TUNED[3])
    if (not gpu) if gpu is not None else interpreted():
        return Tiles(16, 16, 16, 16)
    if dq == "atomic":
        return Tiles(64, 64, 64, 32, 4, 3, 4, 2) if D <= 64 else Tiles(64, 32, 128, 32, 4, 3, 8, 3)
    return Tiles(64, 64, 64, 64, 4, 3) if D <= 64 else Tiles(64, 32, 64, 32, 4, 3)


def blocks(D: int) -> tuple[int, int, int]:
    """(query rows per forward/dQ program, keys per dK/dV program, D_PAD): the partials' layout."""
    t = tiles(D)
    return t.m, t.kv, max(16, triton.next_power_of_2(D))


def n_blocks(q: torch.Tensor, k: torch.Tensor) -> tuple[int, int]:
    bm, bn, _ = blocks(q.shape[-1])
    return triton.cdiv(q.shape[2], bm), triton.cdiv(k.shape[2], bn)


def bwd_stats_size(q: torch.Tensor, k: torch.Tensor) -> int:
    """Length of the backward's per-head sums (and of the token): H · 7."""
    return stats_numel(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def stats_numel(B: int, H: int, T: int, Tk: int) -> int:
    """:func:`bwd_stats_size` from the shapes (a token made before a compiled step: no q, k yet);
    the sums are per head, reduced inside the op, so only H matters."""
    return H * len(kstats.BACKWARD_SUMS)


def _flags(q, km, slopes, win, causal, softcap, stats):
    return dict(CAUSAL=causal, HAS_WINDOW=win is not None, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=slopes is not None,
                HAS_KM=km is not None, STATS=stats, EVEN_D=triton.next_power_of_2(q.shape[-1]) == q.shape[-1] >= 16,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32")


def _launch(kernel, grid, t: Tiles, *args, **kw):
    """``wrap_triton(kernel)[grid](...)``.  Under the interpreter ``wrap_triton`` hands back the
    plain kernel, which cannot run on the fake tensors torch.compile traces with: there the launch
    is skipped (the outputs' shapes are all tracing needs), so compiled code traces on the CPU too."""
    if interpreted():
        from torch._subclasses.fake_tensor import is_fake
        if any(isinstance(a, torch.Tensor) and is_fake(a) for a in args):
            return
    else:
        kw["num_warps"] = t.warps or 4
        if t.stages:
            kw["num_stages"] = t.stages
    wrap_triton(kernel)[grid](*args, **kw)


def _op(name: str):
    """``triton_op`` on a GPU (torch.compile traces into it and sees each launch).  Under the
    interpreter the launches are invisible to tracing, so the op is an opaque ``custom_op`` there,
    with its own body as the fake implementation (launches skipped on fake tensors)."""
    if not interpreted():
        return triton_op(name, mutates_args={})

    def define(fn):
        op = torch.library.custom_op(name, mutates_args=())(fn)
        op.register_fake(fn)
        return op
    return define


def like_layout(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An empty tensor shaped as ``t`` whose memory runs in the order of ``t``'s strides: q as a view
    of GPT's (B, T, 3C) projection gets its gradient in (B, T, H, D) memory, so the backward of the
    model's transpose and split copies nothing before their concatenation."""
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))
    return torch.empty([t.shape[d] for d in order], dtype=dtype or t.dtype, device=t.device).permute(
        [order.index(d) for d in range(t.dim())])


def _strides(*ts):
    return [s for t in ts for s in (t.stride(0), t.stride(1), t.stride(2))]


@_op("dyntool::attn_fwd")
def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
             km: torch.Tensor | None, sinks: torch.Tensor | None, slopes: torch.Tensor | None,
             win: torch.Tensor | None, token: torch.Tensor | None, causal: bool, scale: float, softcap: float,
             stats: bool, seqs: int, atomic_dq: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, H, T, D = q.shape
    G, Tk = H // k.shape[1], k.shape[2]
    t = tiles(D)
    d_pad = max(16, triton.next_power_of_2(D))
    nqb = triton.cdiv(T, t.m)
    out = torch.empty(B, T, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)  # (B, H, T, D) view of
    # (B, T, H, D) memory: the model's `y.transpose(1, 2).contiguous()` is then no copy
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    st = torch.empty(B, H, nqb, fw.N_FWD_STATS if stats else 0, dtype=torch.float32, device=q.device)
    dummy = lse                     # a pointer for the absent optional inputs (never read)
    _launch(fw.attn_fwd, (nqb, B * H), t,
        q, k, v, out, lse, st if stats else dummy, lo, hi, dummy if km is None else km,
        dummy if sinks is None else sinks, dummy if slopes is None else slopes, dummy if win is None else win,
        *_strides(q, k, v, out), 0 if km is None else km.stride(0),
        H, G, T, Tk, D, scale, softcap,
        BLOCK_M=t.m, BLOCK_N=t.n, D_PAD=d_pad, HAS_SINK=sinks is not None,
        **_flags(q, km, slopes, win, causal, softcap, stats))
    return out, lse, (kstats.forward_sums(st, seqs) if stats else st)


@_op("dyntool::attn_bwd")
def attn_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
             lse: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, km: torch.Tensor | None,
             sinks: torch.Tensor | None, slopes: torch.Tensor | None, win: torch.Tensor | None,
             causal: bool, scale: float, softcap: float, stats: bool, seqs: int, atomic_dq: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    B, H, T, D = q.shape
    Hk, Tk = k.shape[1], k.shape[2]
    G = H // Hk
    t = tiles(D, dq="atomic" if atomic_dq else "split")
    d_pad = max(16, triton.next_power_of_2(D))
    nqb, nkb = triton.cdiv(T, t.m), triton.cdiv(Tk, t.kv)
    dev = q.device
    dd = torch.empty(B, H, T, dtype=torch.float32, device=dev)                   # D_i, written by dq
    dqs = torch.empty(B, H, nqb, bw.N_DQ_PROGRAM, dtype=torch.float32, device=dev)
    dkvs = torch.empty(B, H, nkb, bw.N_DKV_PROGRAM, dtype=torch.float32, device=dev)
    dk, dv = like_layout(k), like_layout(v)
    # the atomic policy adds into an fp32 dQ (zeroed: every program adds), cast once at the end
    dq = like_layout(q, torch.float32).zero_() if atomic_dq else like_layout(q)
    flags = _flags(q, km, slopes, win, causal, softcap, stats)
    common = (H, G, T, Tk, D, scale, softcap)
    winp = dd if win is None else win
    kmp = dd if km is None else km
    kms = 0 if km is None else km.stride(0)
    _launch(bw.attn_bwd_dq, (nqb, B * H), t,
        q, k, v, o, do, lse, dd, dq, dqs, lo, hi, kmp, dd if sinks is None else sinks,
        dd if slopes is None else slopes, winp, *_strides(q, k, v, o, do, dq), kms, *common,
        BLOCK_M=t.m, BLOCK_N=t.n, D_PAD=d_pad, HAS_SINK=sinks is not None, PRE_ONLY=atomic_dq, **flags)
    _launch(bw.attn_bwd_dkdv, (nkb, B * Hk), t.dkdv(),
        q, k, v, do, lse, dd, dk, dv, dq, dkvs, lo, hi, kmp, dd if slopes is None else slopes, winp,
        *_strides(q, k, v, do, dk, dv, dq), kms, *common, BLOCK_M=t.kv_m, BLOCK_N=t.kv, D_PAD=d_pad, GROUPED=G > 1,
        ATOMIC_DQ=atomic_dq, **flags)
    if atomic_dq:
        dq = dq.to(q.dtype)                 # keeps the memory order (a dense tensor's strides)
    if sinks is not None:
        dsink = dqs[..., kstats.DQ_SLOTS.index("dsink")].sum(dim=(0, 2)).to(sinks.dtype)   # (H,), fixed order
    else:                                   # nothing to reduce or fill: autograd hands out None
        dsink = dqs.new_empty(0)
    if not stats:
        return dq, dk, dv, dsink, dqs.new_empty(0)
    return dq, dk, dv, dsink, kstats.backward_sums(dqs, dkvs, seqs).flatten()


def _setup(ctx, inputs, output):
    q, k, v, lo, hi, km, sinks, slopes, win, token, causal, scale, softcap, stats, seqs, atomic_dq = inputs
    out, lse, _ = output
    ctx.save_for_backward(q, k, v, out, lse, lo, hi, km, sinks, slopes, win)
    ctx.args = (causal, scale, softcap, stats and token is not None, seqs, atomic_dq)


def _backward(ctx, dout, dlse, dst):
    q, k, v, out, lse, lo, hi, km, sinks, slopes, win = ctx.saved_tensors
    causal, scale, softcap, stats, seqs, atomic_dq = ctx.args
    dq, dk, dv, dsink, sums = attn_bwd(q, k, v, out, dout, lse, lo, hi, km, sinks, slopes, win,
                                       causal, scale, softcap, stats, seqs, atomic_dq)
    return (dq, dk, dv, None, None, None, dsink if sinks is not None else None, None, None,
            sums if stats else None, None, None, None, None, None, None)


attn_fwd.register_autograd(_backward, setup_context=_setup)


_WINDOWS: dict = {}


def _windows(ws: tuple, device) -> torch.Tensor:
    """The per-head windows on the device, made once (a host-to-device copy every step would wait
    on the host; one per (windows, device) is reused)."""
    if torch.compiler.is_compiling():               # a constant of the graph there
        return torch.tensor(ws, dtype=torch.int32, device=device)
    key = (ws, str(device))
    if key not in _WINDOWS:
        if len(_WINDOWS) > 64:
            _WINDOWS.clear()
        _WINDOWS[key] = torch.tensor(ws, dtype=torch.int32, device=device)
    return _WINDOWS[key]


def attention(q, k, v, *, causal: bool = True, scale: float | None = None, window=None,
              softcap: float | None = None, alibi_slopes=None, sinks=None, key_lengths=None,
              padding_side: str = "right", key_mask=None, token=None, stats: bool = False, seqs: int = 0,
              dq: str | None = None):
    """The fused attention.  Returns ``(out, lse·log₂e, forward sums)`` (B, H, T, D), (B, H, T), (H, 4)
    (:data:`.stats.FORWARD_SUMS`; with ``stats=False`` an empty tensor).

    ``key_lengths`` (B,): how many keys of each sequence are real, at the end (``padding_side =
    "left"``) or the start (``"right"``); ``key_mask`` (B, Tk) bool: any set of real keys.
    ``window``: keys per query, the query's own included (causal attention), an int or a list of
    ints, one per query head (0 = no window for that head: LS attention's global heads).
    ``token``: see the module's docstring (the backward's statistics, (H·7,)).  ``seqs``: only the
    first ``seqs`` sequences enter the statistics (0: all).  ``dq``: the backward's dQ policy
    (:func:`dq_policy`; None: ``DYNTOOL_KERNEL_DQ`` or ``split``).  Rows with no visible key give 0
    (SDPA's semantics)."""
    B, _, _, D = q.shape
    Tk = k.shape[2]
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    dev = q.device
    if key_lengths is None:
        lo = torch.zeros(B, dtype=torch.int32, device=dev)
        hi = torch.full((B,), Tk, dtype=torch.int32, device=dev)
    else:
        n = torch.as_tensor(key_lengths, device=dev).to(torch.int32).reshape(-1)
        if n.numel() not in (1, B):
            raise ValueError(f"key_lengths has {n.numel()} entries for a batch of {B}")
        n = n.expand(B)
        lo = (Tk - n) if padding_side == "left" else torch.zeros_like(n)
        hi = torch.full_like(n, Tk) if padding_side == "left" else n
        lo, hi = lo.contiguous(), hi.contiguous()
    km = None if key_mask is None else key_mask.to(device=dev, dtype=torch.int8).expand(B, Tk).contiguous()
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if not scale > 0:                                   # the kernel's row maxima assume τ > 0
        raise ValueError(f"fused attention: scale must be > 0, got {scale}")
    win = None                      # from Python ints: nothing data-dependent for torch.compile
    ws = [int(w) for w in window] if isinstance(window, (list, tuple)) else [int(window or 0)] * q.shape[1]
    if len(ws) != q.shape[1]:
        raise ValueError(f"window has {len(ws)} entries for {q.shape[1]} query heads")
    if any(w > 0 for w in ws):
        win = _windows(tuple(w if w > 0 else q.shape[2] + Tk + 1 for w in ws), dev)
    if interpreted() and q.dtype == torch.bfloat16:     # numpy has no bfloat16: garbage, not an error
        raise ValueError("fused attention: the Triton interpreter has no bfloat16 (use float32/float16 on the CPU)")
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"fused attention: {q.dtype} inputs (float32, float16, bfloat16 only)")
    if not q.dtype == k.dtype == v.dtype:               # the kernel's tl.dot takes one dtype
        raise ValueError(f"fused attention: q, k, v in one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"fused attention: {name} needs a contiguous last dimension")
    atomic = (DQ_DEFAULT if dq is None else dq_policy(dq)) == "atomic"
    return attn_fwd(q, k, v, lo, hi, km, sinks, alibi_slopes, win, token, bool(causal),
                    scale, float(softcap or 0.0), bool(stats), int(seqs), atomic)
