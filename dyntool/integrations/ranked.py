""":class:`~dyntool.integrations.loop.RunRecorder` on a model sharded with FSDP2 (``fully_shard``,
e.g. ``from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N))`` under a
``transformers.Trainer``): every rank records its own shard of the probe.

A sharded forward is a collective (each block all-gathers its parameters), so a probe run on
one rank alone would wait forever for the others.  Here every rank runs the probe step together:
the probe batch is split into ``world`` equal contiguous shards along its first (batch) axis,
rank ``r`` runs shard ``r`` and backpropagates ``loss_r / world`` (its share of the probe's mean
loss, exact when every shard holds the same number of loss tokens), so its U is what a single
process records for those sequences on the whole probe.  Rank 0 creates the run and writes
``record.zarr``, rank ``r`` writes ``record.rank{r}.zarr`` into it (:mod:`dyntool.record.ranks`,
which also merges them for every reader); the few per-head numbers of the metrics row are
combined with small all-reduces (attention entropy: mean, max|logit|: max, probe loss: mean: the
recording session's, :mod:`dyntool.recording_session`).
Nothing T×T leaves a rank.
"""
from __future__ import annotations

import torch


class ShardError(ValueError):
    """A probe (or option) that can't be recorded rank by rank: one line."""


def world_rank() -> tuple[int, int]:
    d = torch.distributed
    if d.is_available() and d.is_initialized():
        return d.get_world_size(), d.get_rank()
    return 1, 0


def is_sharded(model: torch.nn.Module) -> bool:
    """True for a model whose parameters are FSDP2 shards (``DTensor``) or that contains an
    ``FSDPModule``: its forward is a collective."""
    try:        # here, not at the top: a torch built without distributed has no fsdp (optional)
        from torch.distributed.fsdp import FSDPModule
    except ImportError:                                   # torch built without distributed
        return False
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return True
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def _rows(x) -> int | None:
    return int(x.shape[0]) if torch.is_tensor(x) and x.ndim >= 1 else None


def split_probe(probe, rank: int, world: int, seqs: int):
    """Rank ``rank``'s contiguous shard of a probe batch (a dict of tensors, a tuple/list of
    tensors, or one tensor; non-tensor values are shared).  Raises :class:`ShardError` when the
    probe's rows or ``seqs`` can't be split evenly over ``world`` ranks."""
    if isinstance(probe, dict):
        items = list(probe.values())
    elif isinstance(probe, (tuple, list)):
        items = list(probe)
    else:
        items = [probe]
    sizes = {n for n in map(_rows, items) if n is not None}
    if len(sizes) != 1:
        raise ShardError(f"the probe batch can't be split over {world} FSDP ranks: its tensors have "
                         f"{sorted(sizes) or 'no'} leading sizes (give tensors with one batch axis)")
    n = sizes.pop()
    if n % world:
        raise ShardError(f"the probe's {n} sequence(s) can't be split evenly over {world} FSDP ranks; "
                         f"use a multiple of {world}")
    if seqs != n:
        raise ShardError(f"under FSDP every probe sequence is recorded: seqs={seqs} must equal the "
                         f"probe's {n} sequences")
    per = n // world
    sl = slice(rank * per, (rank + 1) * per)

    def cut(v):
        return v[sl] if _rows(v) is not None else v
    if isinstance(probe, dict):
        return {k: cut(v) for k, v in probe.items()}
    if isinstance(probe, (tuple, list)):
        return type(probe)(cut(v) for v in probe)
    return cut(probe)
