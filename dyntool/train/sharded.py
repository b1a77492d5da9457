"""Recording under FSDP (``--train.parallel=fsdp``): every rank records the heads of its own shard.

- **Probe batch** (``record.batch = "probe"``): the fixed probe of ``record.seqs`` sequences is split
  into ``world`` equal, contiguous shards (``record.seqs % world == 0``, refused otherwise before
  anything is created); rank ``r`` runs its shard through the sharded model and backpropagates
  ``loss_r / world``, i.e. its share of the probe's mean loss, so its U (and every quantity built
  from U) is exactly what a single process records for those sequences on the whole probe.
- **Training batch** (``"train"``): each rank records the first ``record.seqs`` sequences of its own
  micro-batch; U is ∂(that rank's micro-batch mean loss)/∂(head output), as under DDP.

Each rank writes its own recording (:mod:`dyntool.record.ranks`: ``record.zarr`` for rank 0,
``record.rank{r}.zarr`` for the others), nothing T×T is gathered.  Metrics stay rank 0's one
``metrics.jsonl``; the few per-head numbers it logs are combined with small all-reduces (attention
entropy: mean over ranks; max|logit|: max; per-group gradient norms from the local shards).
"""
from __future__ import annotations

from ..errors import ConfigError
from ..recording_session import Shard
from . import fsdp
from .recording import RecordingCallback


def check(cfg, world: int) -> None:
    """Refuse (before anything is created) what FSDP recording can't shard evenly."""
    rc = cfg.record
    if world > 1 and rc.enabled and rc.batch == "probe" and rc.seqs % world:
        raise ConfigError("record.seqs", f"the probe's {rc.seqs} sequence(s) can't be split evenly "
                                         f"over {world} ranks under train.parallel=fsdp; use a multiple of {world}")


class ShardedRecordingCallback(RecordingCallback):
    def __init__(self, run, cfg, dist):
        super().__init__(run, cfg)
        self.dist = dist

    def _shard(self) -> Shard:
        """The probe: ``seqs // world`` sequences each, in rank order; the training batch: the first
        ``seqs`` of this rank's own micro-batch."""
        world, rank, rc = self.dist.world, self.dist.rank, self.cfg.record
        per = rc.seqs // world if rc.batch == "probe" else rc.seqs
        return Shard(rank, world, per, rank * per, fsdp.all_reduce)

    def _group_norms(self) -> dict:
        return fsdp.group_grad_norms(self.groups)

    def on_step_end(self, step: int, metrics: dict) -> None:
        if self._lmax is not None:                   # max|logit| over every rank's batch
            self._lmax = fsdp.all_reduce(self._lmax.contiguous(), "max")
        super().on_step_end(step, metrics)

    def on_train_end(self, final: dict) -> None:
        super().on_train_end(final)
        if self.rec is not None:
            self.rec.store.flush()
