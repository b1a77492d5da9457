"""Process-group setup for ``torchrun --nproc_per_node=N -m dyntool train ...``.

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address; without them
we are a single process and nothing is initialised.  Backend: nccl on CUDA, gloo on CPU.  Only
rank 0 (``is_main``) evaluates, records and writes the run; every rank trains on its own data
stream (the data generator is seeded with the rank) and DDP averages the gradients.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialised: bool = False      # did *we* create the process group (and so must destroy it)?

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device", "mps requested but not available on this machine; use --device=cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device", "CUDA was requested but torch.cuda.is_available() is False")
        if dev.index is None:
            dev = torch.device("cuda", local_rank)
    return dev


def setup(device: str = "auto") -> DistInfo:
    """Join the process group when launched by torchrun; a plain DistInfo otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=resolve_device(device))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local)
    created = False
    if not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
            # device_id binds the NCCL communicator to this rank's GPU up front (no guessing,
            # no hang when a rank's first collective would otherwise pick device 0)
            dist.init_process_group("nccl", device_id=dev)
        else:
            dist.init_process_group("gloo")
        created = True
    return DistInfo(rank, world, local, dev, created)


def cleanup(info: DistInfo) -> None:
    """Leave the process group while the interpreter is fully alive.  The trainer and its callbacks
    refer to each other, so the DDP wrapper (which holds the group) outlives the run until a garbage
    collection; were that the interpreter's exit, a gloo worker thread could free a Python-owned
    tensor during finalisation, which aborts the rank ("terminate called without an active
    exception", seen once in ~3 loaded test runs).  Collect first, then destroy the group."""
    if info.initialised and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.world > 1:
        dist.barrier()
