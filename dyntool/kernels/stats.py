"""The fused kernel's partial sums → per-head sums, inside the op; → the cheap tier's
:class:`dyntool.cheap_stats.Sums`, in the flight recorder.

The kernels write one partial per program (no float atomics: the same inputs give the same bits);
:func:`forward_sums` and :func:`backward_sums` reduce them in a fixed order *inside* the custom ops,
so a compiled step fuses the reduction into its graph and hands out one (H, 4) and one (H, 7)
tensor per attention call.  Per (b, h) the column entropy comes from the key blocks' Σ c and
Σ c log c without a second pass: H(c / C) = log C − Σ c log c / C.  Only the first ``seqs``
sequences count (0: all), as ``FlightRecorder(seqs=...)`` asks.  U = dO / grad_scale, so the sums
of one power of U divide by grad_scale, of two by its square (:func:`add_to`).
"""
from __future__ import annotations

import torch

from ..cheap_stats import SUMS

from .stats_names import BACKWARD_SUMS, DKV_SLOTS, DQ_SLOTS, FORWARD_SUMS   # every slot, named once


def forward_sums(st: torch.Tensor, seqs: int = 0) -> torch.Tensor:
    """(B, H, nQB, 4) forward partials → (H, 4): Σ entropy, max score, max |logit|, Σ sink mass."""
    f = st[:seqs] if seqs else st
    sums = {n: f[..., i].sum(dim=(0, 2)) if n in SUMS else f[..., i].amax(dim=(0, 2))   # else a maximum
            for i, n in enumerate(FORWARD_SUMS)}
    return torch.stack([sums[n] for n in FORWARD_SUMS], dim=1)


def backward_sums(dqs: torch.Tensor, dkvs: torch.Tensor, seqs: int = 0) -> torch.Tensor:
    """(B, H, nQB, 5) dq-program and (B, H, nKB, 6) dK/dV-program partials (:data:`DQ_SLOTS`,
    :data:`DKV_SLOTS`) → (H, 7), in :data:`BACKWARD_SUMS` order, at grad_scale 1.  The score sums
    ``var``, ``ds2`` are in the dq programs' slots (split policy) or the dK/dV programs' (atomic
    dQ); the other's are 0, so both are added."""
    if seqs:
        dqs, dkvs = dqs[:seqs], dkvs[:seqs]
    q = {n: dqs[..., i] for i, n in enumerate(DQ_SLOTS)}
    kv = {n: dkvs[..., i] for i, n in enumerate(DKV_SLOTS)}
    c_sum, clogc = kv["c_sum"].sum(-1), kv["c_log_c"].sum(-1)                  # (B, H)
    safe = c_sum.clamp_min(torch.finfo(c_sum.dtype).tiny)
    colent = torch.where(c_sum > 0, safe.log() - clogc / safe, torch.zeros_like(c_sum))
    sums = {"eb": q["eb"].sum(dim=(0, 2)), "u2": q["u2"].sum(dim=(0, 2)),
            "var": q["var"].sum(dim=(0, 2)) + kv["var"].sum(dim=(0, 2)),
            "ds2": q["ds2"].sum(dim=(0, 2)) + kv["ds2"].sum(dim=(0, 2)),
            "colmax": kv["colmax"].amax(-1).sum(0), "colent": colent.sum(0), "dv2": kv["dv2"].sum(dim=(0, 2))}
    return torch.stack([sums[n] for n in BACKWARD_SUMS], dim=1)


def head_sums(fst: torch.Tensor, bst: torch.Tensor) -> dict[str, torch.Tensor]:
    """The ops' (H, 4) forward sums and a token's gradient (H·7,) → {Sums field: (H,)}."""
    b = bst.reshape(fst.shape[0], len(BACKWARD_SUMS))
    return {**{n: fst[:, i] for i, n in enumerate(FORWARD_SUMS)}, **{n: b[:, i] for i, n in enumerate(BACKWARD_SUMS)}}


def add_to(sums, parts: dict[str, torch.Tensor], B: int, T: int, grad_scale: float = 1.0,
           has_sinks: bool = False) -> None:
    """Add one forward/backward's ``head_sums`` to a :class:`~dyntool.cheap_stats.Sums`."""
    g = float(grad_scale)
    for name, spec in SUMS.items():
        x = parts[name].to(sums.ent.dtype)
        setattr(sums, name, getattr(sums, name) + x / g ** spec.u_power)
    sums.score_max = torch.maximum(sums.score_max, parts["score_max"].to(sums.ent.dtype))
    sums.logit_max = torch.maximum(sums.logit_max, parts["logit_max"].to(sums.ent.dtype))
    sums.rows += B * T
    sums.seqs += B
    sums.has_sinks = sums.has_sinks or has_sinks
