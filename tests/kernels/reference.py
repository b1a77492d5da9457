"""The independent computations the fused kernel is held to, in float64: autograd through
``dyntool.quantities`` (score_parts + masked_softmax) for out, dq, dk, dv, dσ, and the full tier's
quantities (``head_quantities``) reduced by ``flight.full_tier_reduction`` for the statistics."""
from __future__ import annotations

import torch

from dyntool.flight import full_tier_reduction
from dyntool.observe import causal_allowed, expand_kv
from dyntool.quantities import head_quantities, masked_softmax, score_parts


def allowed_of(B, T, Tk, causal, window=None, key_lengths=None, padding_side="right", key_mask=None):
    """(B, 1|H, T, Tk) bool, built independently of the kernel's tile masks."""
    if isinstance(window, (list, tuple)):                # one per head (0: none), as LS attention
        base = torch.stack([causal_allowed(T, Tk, w or None) for w in window])[None]
    else:
        base = (causal_allowed(T, Tk, window) if causal else torch.ones(T, Tk, dtype=torch.bool))[None, None]
    if window and not causal:
        raise ValueError("the reference's window is causal")
    keys = torch.ones(B, Tk, dtype=torch.bool)
    if key_lengths is not None:
        j = torch.arange(Tk)[None, :]
        n = torch.as_tensor(key_lengths)[:, None]
        keys = (j >= Tk - n) if padding_side == "left" else (j < n)
    if key_mask is not None:
        keys = keys & key_mask
    return base & keys[:, None, None, :]


def alibi_bias(slopes, T, Tk):
    """(1, H, T, Tk): slope·(j − i'), i' = i + Tk − T."""
    i = torch.arange(T)[:, None] + (Tk - T)
    j = torch.arange(Tk)[None, :]
    return slopes.double().reshape(1, -1, 1, 1) * (j - i).double()


def forward(q, k, v, allowed, scale, softcap=None, bias=None, sinks=None):
    H = q.shape[1]
    _, s = score_parts(q, expand_kv(k, H), scale, softcap, bias)
    a, _ = masked_softmax(s, allowed, None if sinks is None else sinks.reshape(1, H, 1, 1))
    return a @ expand_kv(v, H)


def grads(q, k, v, do, allowed, scale, softcap=None, bias=None, sinks=None, dtype=torch.float64):
    """(out, dq, dk, dv, dsink) in float64 by autograd (``dtype``: another precision's own error)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    sk = None if sinks is None else sinks.detach().to(dtype).requires_grad_()
    out = forward(*leaves, allowed, scale, softcap, None if bias is None else bias.to(dtype), sk)
    out.backward(do.to(dtype))
    return out.detach(), *(t.grad for t in leaves), (None if sk is None else sk.grad)


def statistics(q, k, v, do, allowed, scale, softcap=None, bias=None, sinks=None, dtype=torch.float64):
    """The cheap tier's statistics from the float64 full tier: {name: (H,)} (``dtype``: as for grads)."""
    H = q.shape[1]
    hf = lambda t: t.to(dtype).transpose(0, 1)           # noqa: E731  (H, B, ...) heads first
    qs = head_quantities(hf(q), hf(expand_kv(k, H)), hf(expand_kv(v, H)), hf(do), allowed.transpose(0, 1),
                         scale, bias=None if bias is None else bias.to(dtype).transpose(0, 1), softcap=softcap,
                         sinks=None if sinks is None else sinks.to(dtype).reshape(H, 1, 1, 1))
    return {n: x[0] for n, x in full_tier_reduction({n: x.unsqueeze(0) for n, x in qs.items()}).items()}
