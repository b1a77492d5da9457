"""The self-check of every capture: the recorded α must reproduce the output the model produced.

Before anything is recorded (during the forward, so a refusal comes before any backward), each
observed layer's q, k, v and score modifiers are turned into α the way :mod:`dyntool.quantities`
will record them, and ``α V`` is compared with the per-head output the attention actually
returned.  A model that adds something dyntool was not told about (a relative-position bias, a
different scale, soft-capping, a sink, a custom softmax) fails here with a one-line reason instead
of recording wrong numbers: that is the guarantee "exact or refused".

The check also decides, from the output itself, what the attention did with query rows that see
no key (left padding): SDPA returns 0 there, an additive-mask softmax (eager) returns the mean of
all values.  Both are recorded exactly; the row semantics are read, not assumed.
"""
from __future__ import annotations

import torch

from .quantities import compute_dtype, masked_softmax, score_parts

# ‖o − α V‖ / ‖o‖ per layer.  float64: Llama-family eager attention takes its softmax in float32
# even in float64 models (≈1e-8 measured); float32/bfloat16/float16: a few ulps of the model's
# own accumulation over T keys.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


class SelfCheckError(RuntimeError):
    """The recorded attention would not be the attention the model computed."""


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE.get(dtype, 1e-4)


def verify(q, k, v, out, allowed, scale, bias=None, softcap=None, sinks=None, *, what: str,
           dtype: torch.dtype | None = None, out_map=None):
    """Check ``softmax(S) V == out``; return ``uniform_rows`` (B|1, nh|1, T, 1) or None.

    ``q`` (B, nh, T, d), ``k``/``v`` (B, nh, Tk, d) already per query head, ``out`` (B, nh, T, d_v)
    as the model produced it, ``sinks`` broadcastable to (B, nh, T, 1).  ``what`` names the layer
    in the error.  ``out_map``: ``out`` is ``out_map(o)``, a linear image of the per-head output
    (``nn.MultiheadAttention``'s out_proj); the check then compares in that space, and rows with no
    visible key are taken as SDPA's 0.  Raises :class:`SelfCheckError` with the reason on a mismatch."""
    dt = compute_dtype(q.dtype)
    with torch.no_grad():
        out_dtype = out.dtype
        q, k, v, o = (t.to(dt) for t in (q, k, v, out))
        _, s = score_parts(q, k, scale, softcap, None if bias is None else bias.to(dt))
        a, _ = masked_softmax(s, allowed, sinks)
        o_hat = torch.matmul(a, v)
        uniform_rows = None
        empty = ~allowed.any(-1, keepdim=True)
        if out_map is not None:
            o_hat = out_map(o_hat).to(dt)
        elif empty.any():
            # rows with no visible key: 0 (SDPA) or the mean of all values (additive mask)?
            a_u, _ = masked_softmax(s.masked_fill(empty, 0.0), allowed | empty, sinks)
            o_u = torch.matmul(a_u, v)
            err_zero = (o - o_hat).norm(dim=-1, keepdim=True)
            err_unif = (o - o_u).norm(dim=-1, keepdim=True)
            uniform_rows = empty & (err_unif < err_zero)
            o_hat = torch.where(uniform_rows, o_u, o_hat)
            if not uniform_rows.any():
                uniform_rows = None
        # a diverging model (inf/NaN activations) is recorded as it is, visibly non-finite: the
        # check judges the entries where both are finite, which is where a modifier would show
        both = torch.isfinite(o) & torch.isfinite(o_hat)
        if not both.all():
            o, o_hat = o[both], o_hat[both]
        denom = o.norm().clamp_min(torch.finfo(dt).tiny)
        err = float((o - o_hat).norm() / denom) if o.numel() else 0.0
        tol = tolerance(dtype or out_dtype)
        if not err <= tol:                      # also catches NaN
            raise SelfCheckError(
                f"{what}: the attention dyntool would record does not reproduce the output the model "
                f"produced (relative error {err:.2g} > {tol:g} for {out_dtype}): it applies something "
                "dyntool cannot see (a score bias, a different scale, soft-capping, sinks or its own "
                "softmax); refused, nothing recorded")
    return uniform_rows
