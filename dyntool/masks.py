"""Attention masks as tiny named factories (attention-gym style).

A :class:`Mask` answers "may query ``i`` of head ``h`` attend to key ``j``?"  Its ``fn`` takes
broadcastable integer tensors ``(h, q_idx, kv_idx)`` and returns a boolean tensor, so the same
object yields a dense boolean mask for the manual/SDPA backends (``dense``) and a flex-attention
``mask_mod`` on CUDA (``mask_mod``).  True means *attend*.

Conventions (those of arXiv 2512.22473):
- ``causal()``: key ``j`` is visible to query ``i`` iff ``j <= i`` (the diagonal is kept).
- ``sliding_window(p)``: a *local* causal window of width ``p`` **including the query itself**:
  query ``i`` sees keys ``j`` in ``[i - p + 1, i]`` (truncated at 0), i.e. exactly ``p`` keys once
  ``i >= p - 1``.  This is flash-attn ``window_size=(p - 1, 0)``.
- ``global_()``: a global head of a decoder, i.e. full causal attention (same as ``causal()``).
- ``full()``: every key visible (non-causal; used by the toy task).
- ``local_global(n_local, n_global, p)``: heads ``[0, n_local)`` local with window ``p``, heads
  ``[n_local, n_local + n_global)`` global causal (the LS-attention head order).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

MaskFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Mask:
    name: str
    fn: MaskFn
    per_head: bool = False      # does the answer depend on the head index?
    is_causal: bool = False     # exactly the standard causal mask (lets SDPA use is_causal=True)

    def dense(self, T: int, n_head: int = 1, device=None, T_k: int | None = None) -> torch.Tensor:
        """Boolean ``(n_head or 1, T, T_k)`` matrix, True = attend."""
        T_k = T if T_k is None else T_k
        nh = n_head if self.per_head else 1
        h = torch.arange(nh, device=device)[:, None, None]
        q = torch.arange(T, device=device)[None, :, None]
        k = torch.arange(T_k, device=device)[None, None, :]
        return self.fn(h, q, k).expand(nh, T, T_k)

    def mask_mod(self):
        """flex_attention ``mask_mod(b, h, q_idx, kv_idx)``."""
        fn = self.fn

        def mask_mod(b, h, q_idx, kv_idx):
            return fn(h, q_idx, kv_idx)

        mask_mod.__name__ = self.name
        return mask_mod


def causal() -> Mask:
    return Mask("causal", lambda h, q, k: k <= q, is_causal=True)


def full() -> Mask:
    return Mask("full", lambda h, q, k: torch.ones_like(k <= q))


def global_() -> Mask:
    """A decoder's global head: full causal attention."""
    return Mask("global", lambda h, q, k: k <= q, is_causal=True)


def sliding_window(p: int) -> Mask:
    if p < 1:
        raise ValueError(f"sliding window width must be >= 1, got {p}")
    return Mask(f"sliding_window_{p}", lambda h, q, k: (k <= q) & (q - k < p))


def and_masks(*masks: Mask) -> Mask:
    def fn(h, q, k):
        out = masks[0].fn(h, q, k)
        for m in masks[1:]:
            out = out & m.fn(h, q, k)
        return out
    return Mask("_and_".join(m.name for m in masks), fn, per_head=any(m.per_head for m in masks))


def or_masks(*masks: Mask) -> Mask:
    def fn(h, q, k):
        out = masks[0].fn(h, q, k)
        for m in masks[1:]:
            out = out | m.fn(h, q, k)
        return out
    return Mask("_or_".join(m.name for m in masks), fn, per_head=any(m.per_head for m in masks))


def per_head(local: Mask, glob: Mask, n_local: int) -> Mask:
    """Heads ``h < n_local`` use ``local``, the rest ``glob`` (one ``torch.where`` on h)."""
    def fn(h, q, k):
        return torch.where(h < n_local, local.fn(h, q, k), glob.fn(h, q, k))
    return Mask(f"heads[:{n_local}]={local.name},rest={glob.name}", fn, per_head=True)


def local_global(n_local: int, n_global: int, p: int) -> Mask:
    """LS-attention: ``n_local`` sliding-window heads (width p) then ``n_global`` causal heads."""
    if n_local < 0 or n_global < 0 or n_local + n_global == 0:
        raise ValueError("local_global needs n_local, n_global >= 0 and at least one head")
    if n_local == 0:
        return global_()
    if n_global == 0:
        return sliding_window(p)
    return per_head(sliding_window(p), global_(), n_local)

