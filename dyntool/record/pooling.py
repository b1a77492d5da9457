"""Block pooling: the one way dyntool averages a matrix over tiles (the recorder's ``*_pooled``
overviews, the streamed full tier, the sims chunk by chunk, the app's overview).  Kept below the
recorder and the streamed tier so that neither has to import the other for it."""
from __future__ import annotations

import math

import numpy as np
import torch


def pool_blocks(x, block: int, visible=None, masked_zero: bool = False):
    """THE block pooling of dyntool: mean over ``block × block`` tiles of the last two axes, over
    the *visible* entries only (``visible`` broadcastable to x, 1/True = unmasked; default all).
    Masked entries never enter a mean, whatever they hold (0, NaN, −inf); edge tiles average what
    they hold; a fully masked tile is NaN.  Accepts torch tensors or numpy arrays (returns the same
    kind), so the recorder, the sims (chunk by chunk: chunks of whole block rows give the same
    result), the app and the test fixtures all pool alike.

    ``masked_zero=True``: the caller guarantees masked entries hold 0 (e.g. α, B, A, ∂L/∂S as
    :mod:`dyntool.quantities` returns them), so the tile sums need no masking pass; the visible
    counts still come from ``visible``.  Same result, about a third of the memory traffic."""
    if isinstance(x, np.ndarray):
        vis = None if visible is None else torch.as_tensor(np.asarray(visible))
        return pool_blocks(torch.as_tensor(x), block, vis, masked_zero).numpy()
    T, Tk = x.shape[-2:]
    nq, nk = math.ceil(T / block), math.ceil(Tk / block)
    pad = (0, nk * block - Tk, 0, nq * block - T)
    vis = torch.ones(T, Tk, dtype=x.dtype, device=x.device) if visible is None else visible.to(x.dtype)
    xs = x if masked_zero else torch.where(vis > 0, torch.nan_to_num(x), 0.0)
    xs = torch.nn.functional.pad(xs, pad) if any(pad) else xs
    vs = torch.nn.functional.pad(vis, pad) if any(pad) else vis       # counts: from the mask's own shape
    tiles = xs.reshape(*xs.shape[:-2], nq, block, nk, block).sum(dim=(-3, -1))
    counts = vs.reshape(*vs.shape[:-2], nq, block, nk, block).sum(dim=(-3, -1))
    return tiles / counts
