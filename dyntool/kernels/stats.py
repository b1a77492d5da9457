"""The fused kernel's partial sums → the cheap tier's per-head sums (:class:`dyntool.cheap_stats.Sums`).

The kernels write one partial per program (no float atomics: the same inputs give the same bits);
here they are reduced in a fixed order, in the Sums' dtype.  Per (b, h) the column entropy comes
from the key blocks' Σ c and Σ c log c without a second pass: H(c / C) = log C − Σ c log c / C.
U = dO / grad_scale, so the sums of one power of U divide by grad_scale, of two by its square.
"""
from __future__ import annotations

import torch

from . import backward as bw
from . import forward as fw


def head_sums(fst: torch.Tensor, bst: torch.Tensor, nkb: int, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """``fst`` (B, H, nQB, 4) forward partials, ``bst`` the token's gradient (flat backward
    partials) → {Sums field: (H,)} summed (or maxed) over the batch, at grad_scale 1."""
    B, H, nqb, _ = fst.shape
    f = fst.to(dtype)
    per = bst.to(dtype).reshape(B, H, -1)
    n_dq = nqb * bw.N_DQ_PROGRAM
    dqp = per[..., :n_dq].reshape(B, H, nqb, bw.N_DQ_PROGRAM)
    pre, dqs = dqp[..., :bw.N_PRE_STATS], dqp[..., bw.N_PRE_STATS:]
    dkv = per[..., n_dq:].reshape(B, H, nkb, bw.N_DKV_STATS)
    c_sum, clogc = dkv[..., 2].sum(-1), dkv[..., 1].sum(-1)                   # (B, H)
    safe = c_sum.clamp_min(torch.finfo(dtype).tiny)
    colent = torch.where(c_sum > 0, safe.log() - clogc / safe, torch.zeros_like(c_sum))
    assert fw.N_FWD_STATS == 4
    return {
        "ent": f[..., 0].sum(dim=(0, 2)), "score_max": f[..., 1].amax(dim=(0, 2)),
        "logit_max": f[..., 2].amax(dim=(0, 2)), "sink": f[..., 3].sum(dim=(0, 2)),
        "eb": pre[..., 0].sum(dim=(0, 2)), "u2": pre[..., 1].sum(dim=(0, 2)),
        "var": dqs[..., 0].sum(dim=(0, 2)), "ds2": dqs[..., 1].sum(dim=(0, 2)),
        "colmax": dkv[..., 0].amax(-1).sum(0), "colent": colent.sum(0), "dv2": dkv[..., 3].sum(dim=(0, 2)),
    }


def add_to(sums, parts: dict[str, torch.Tensor], B: int, T: int, grad_scale: float = 1.0,
           has_sinks: bool = False) -> None:
    """Add one forward/backward's ``head_sums`` to a :class:`~dyntool.cheap_stats.Sums`."""
    g = float(grad_scale)
    power = {"eb": 1, "var": 2, "ds2": 2, "u2": 2, "dv2": 2}
    for name in ("ent", "eb", "var", "ds2", "u2", "dv2", "colmax", "colent", "sink"):
        x = parts[name].to(sums.ent.dtype)
        setattr(sums, name, getattr(sums, name) + x / g ** power.get(name, 0))
    sums.score_max = torch.maximum(sums.score_max, parts["score_max"].to(sums.ent.dtype))
    sums.logit_max = torch.maximum(sums.logit_max, parts["logit_max"].to(sums.ent.dtype))
    sums.rows += B * T
    sums.seqs += B
    sums.has_sinks = sums.has_sinks or has_sinks
