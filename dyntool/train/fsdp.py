"""FSDP2 for ``dyntool train --train.parallel=fsdp`` (under ``torchrun``): sharding, full-state
checkpoints, and the few collectives recording needs.

Sharding: :func:`torch.distributed.fsdp.fully_shard` on every transformer block, then on the
root (embeddings, final LayerNorm and the tied head stay in the root group).  Parameters become
``DTensor`` shards; the forward all-gathers a block's parameters just before it runs, so the
activations (q, k, v, the per-head output) are ordinary tensors of the rank's own batch shard
and :class:`dyntool.capture.Capture` hooks them unchanged.  Nothing T×T ever leaves a rank.

Data: one global batch of ``data.batch_size × world`` sequences is drawn from a generator seeded
identically on every rank; rank ``r`` trains on rows ``[r·B, (r+1)·B)``.  FSDP averages the
gradients, so a step equals a single-process step on the global batch (up to float rounding):
this is what the equivalence test checks.  Evaluation and the final evaluation run on every
rank (each forward is a collective); rank 0 reports.

Checkpoints stay the trainer's plain tensor tree, with the model and optimizer state as *full*
(unsharded, CPU) tensors keyed by parameter name (``get_state_dict(full_state_dict=True)``), so
a checkpoint is independent of the world size it was written with.
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

PARALLEL = ("auto", "ddp", "fsdp")


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """``fully_shard`` each block of ``model.h``, then the root.  In place; returns the model."""
    from torch.distributed.fsdp import fully_shard
    for blk in model.h:
        fully_shard(blk)
    fully_shard(model)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kw)


def full_state(model, opt) -> tuple[dict, dict]:
    """(model, optimizer) state dicts as full CPU tensors (collective: every rank calls)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt, options=_options())
    return msd, osd


def load_full_state(model, opt, msd: dict, osd: dict) -> None:
    """Load full state dicts (as :func:`full_state` writes them) into the sharded model/optimizer."""
    from torch.distributed.checkpoint.state_dict import set_state_dict
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd, options=_options())


def digest(model) -> str:
    """sha256 of the full parameters in state_dict order (collective): equal to the unsharded
    model's :meth:`Trainer.param_digest` when the parameters are equal."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    sd = get_model_state_dict(model, options=_options())
    h = hashlib.sha256()
    for name, t in sd.items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a plain tensor is returned as is)."""
    return t.to_local() if hasattr(t, "to_local") else t


@torch.no_grad()
def group_grad_norms(groups: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-group gradient L2 norms of sharded parameters: local sums of squares, one all-reduce."""
    names, sq = [], []
    for name, ps in groups.items():
        gs = [local(p.grad) for p in ps if p.grad is not None]
        if gs:
            names.append(name)
            sq.append(sum((g.float() ** 2).sum() for g in gs))
    if not names:
        return {}
    tot = torch.stack(sq)
    dist.all_reduce(tot)
    return dict(zip(names, tot.sqrt().unbind()))


def total_norm(t: torch.Tensor) -> torch.Tensor:
    """``clip_grad_norm_``'s result as a plain tensor (a DTensor norm is materialised)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In place over the default group; ``op``: sum | max | mean."""
    if op == "max":
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    else:
        dist.all_reduce(t)
        if op == "mean":
            t /= dist.get_world_size()
    return t


def broadcast(obj, src: int = 0):
    """A picklable object from ``src`` to every rank (e.g. the run path rank 0 created)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
