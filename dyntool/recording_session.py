"""One recording session: the machinery every loop that records drives, written once.

Three loops record: the trainer (:mod:`dyntool.train.recording`, :mod:`dyntool.train.sharded`),
a user's loop (:class:`dyntool.integrations.loop.RunRecorder`, and through it the Hugging Face and
Lightning callbacks) and the simulations that record the cheap tier (:mod:`dyntool.sims.icl_markov`).
Each keeps what is its own (the loop, when a micro-step starts, its callbacks' API); the session
holds what they share::

    session = RecordingSession(run, cfg.record, max_steps, shard=None)
    rec = session.open_recorder(T, dims, attrs={...}, tokens=words)   # the full tier's store + Recorder
    flight = session.open_flight(model, grad_scale=1 / accum)         # the cheap tier (paths -> meta)
    session.wants(step), session.cheap_wants(step)                    # the schedule
    row = session.recorded_row(qs)                                    # a recorded step's per-head numbers
    later = session.cheap_read()        # the cheap tier's row, on its way to the host (never waited on)
    row = resolved({**row, CHEAP: later})                             # read when the row is written

Under FSDP every rank records its own sequences (:class:`Shard`) into the run rank 0 made
(:func:`rank_writers`): its store says which (``rank``, ``seq_offset``, ...) and declares how the
per-rank scalars merge (:mod:`dyntool.record.ranks`); the per-head numbers of the metrics row are
combined with small all-reduces (entropy: mean, max |logit|: max).  The collectives are the
caller's (``train.fsdp.all_reduce``, ``broadcast``), handed down: the session sits below the trainer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .errors import RunError
from .flight import FlightRecorder, PendingMetrics
from .location import location
from .record import metric_names as mn
from .record.policy import RecordConfig, check_budget, cheap_wants, schedule
from .record.ranks import declare_reducers
from .recorder import Recorder
from .run_writer import RankRun

CHEAP = "__cheap_tier_pending__"     # a row's key for its cheap-tier values still on their way (PendingMetrics)


@dataclass(frozen=True)
class Shard:
    """This rank's part of a recording every rank of an FSDP job makes: ``seqs`` sequences from
    ``offset`` on; ``reduce(tensor, "mean" | "max")`` all-reduces a small tensor over the ranks."""
    rank: int
    world: int
    seqs: int
    offset: int
    reduce: Callable[[torch.Tensor, str], torch.Tensor]

    def attrs(self) -> dict:
        return {"rank": self.rank, "world_size": self.world, "shard_axis": "seq", "seq_offset": self.offset,
                "parallel": "fsdp"}


def rank_writers(rank: int, make: Callable, broadcast: Callable) -> tuple:
    """Under FSDP: rank 0 runs ``make()`` (a :class:`~dyntool.run_writer.RunWriter`) and every rank
    gets ``(rank 0's run or None, the writer of its own record)``: the run itself on rank 0, a
    :class:`~dyntool.run_writer.RankRun` into the run's location (a folder or an object-store URL)
    on the others.  Rank 0's refusal (``RunError``) is raised on every rank, so none waits for a run
    that was never made; ``broadcast(obj)`` returns rank 0's ``obj`` on every rank."""
    run, msg = None, None
    if rank == 0:
        try:
            run = make()
        except RunError as e:
            broadcast(("error", str(e)))
            raise
        msg = ("ok", str(run.path))
    msg = broadcast(msg)
    if msg is None or msg[0] != "ok":
        raise RunError(msg[1] if msg else "rank 0 could not create the run")
    return run, run if run is not None else RankRun(location(msg[1]), rank)


class RecordingSession:
    """``run``: a :class:`~dyntool.run_writer.RunWriter` (or a rank's ``RankRun``), or None until
    :meth:`bind` (a loop that refuses a model before its run exists); ``cfg``: the
    :class:`~dyntool.record.policy.RecordConfig` (its ``seqs``: this rank's sequences)."""

    def __init__(self, run, cfg: RecordConfig, max_steps: int, shard: Shard | None = None):
        self.run, self.cfg, self.max_steps, self.shard = run, cfg, int(max_steps), shard
        self.steps = schedule(cfg, self.max_steps)           # the full tier's steps
        self._wanted = frozenset(int(s) for s in self.steps)
        self.rec: Recorder | None = None
        self.flight: FlightRecorder | None = None

    # -- the schedule ----------------------------------------------------------------------
    def wants(self, step: int) -> bool:
        """A full-tier step."""
        return int(step) in self._wanted

    def cheap_wants(self, step: int) -> bool:
        """A cheap-tier step (once the flight recorder is open)."""
        return self.flight is not None and cheap_wants(self.cfg, int(step))

    # -- the full tier ---------------------------------------------------------------------
    def open_recorder(self, T: int, dims: dict, attrs: dict, tokens: list | None = None) -> Recorder:
        """The record's store and its :class:`~dyntool.recorder.Recorder`, after the disk budget is
        checked for the schedule (``dims``: L, H, T, d_k, d_v).  ``tokens``: the words of every
        recorded sequence (all ranks'), the app's matrix labels; a rank's own store keeps its rows,
        rank 0's (the merged view's) all of them."""
        check_budget(self.cfg, len(self.steps), self.run.path, **dims)
        sh = self.shard
        store = self.run.open_store(self.cfg.chunk_steps, self.cfg.flush_seconds,
                                    attrs={**attrs, **sh.attrs()} if sh is not None else attrs)
        if sh is not None:
            declare_reducers(store)
        self.rec = Recorder(store, self.cfg, self.max_steps, T)
        if tokens:
            own = tokens if sh is None or sh.rank == 0 else tokens[sh.offset:sh.offset + sh.seqs]
            store.group.attrs.update({"probe_tokens": own})
        return self.rec

    def recorded_row(self, qs: dict, logit_max: bool = False) -> dict:
        """A recorded step's per-head numbers for the metrics row: the attention entropy of the
        recorded batch (mean over sequences and queries) and, with ``logit_max``, its largest
        |logit| (``logit_max/L{l}H{h}``, ``recorded_logit_max``); over every rank under a shard."""
        lmax = qs["logit_max"].float() if logit_max else None
        if self.shard is None:
            ent = qs["attn_entropy"].float().mean(dim=(2, 3))               # (L, nh)
        else:                                               # equal shards: the mean of the means
            ent = self.shard.reduce(qs["attn_entropy"].double().mean(dim=(2, 3)).contiguous(), "mean")
            lmax = self.shard.reduce(lmax.double().contiguous(), "max") if lmax is not None else None
        row = {mn.head(mn.ATTN_ENTROPY, l, h): v for l, h, v in self.rec.head_values(ent.tolist())}
        if lmax is not None:
            heads = self.rec.head_values(lmax.tolist())
            row.update({mn.head(mn.LOGIT_MAX, l, h): v for l, h, v in heads})
            row["recorded_logit_max"] = max(v for _, _, v in heads)
        return row

    def mean_over_ranks(self, value: float, device=None) -> float:
        """A scalar (the probe loss) averaged over the ranks; itself without a shard."""
        if self.shard is None:
            return float(value)
        return float(self.shard.reduce(torch.tensor([float(value)], dtype=torch.float64, device=device), "mean"))

    # -- the cheap tier --------------------------------------------------------------------
    def open_flight(self, model: torch.nn.Module, grad_scale: float = 1.0, attention=None) -> FlightRecorder:
        """The flight recorder of ``cfg`` (``cheap_seqs``, ``max_block_mib``, ``kernel``); which path
        each site's statistics take, and why, goes to meta.json (``attention_paths``).  Raises
        :class:`~dyntool.flight.KernelRefused` for ``kernel="fused"`` where a site can't take it."""
        c = self.cfg
        self.flight = FlightRecorder(model, grad_scale=grad_scale, seqs=c.cheap_seqs or None,
                                     max_block_mib=c.max_block_mib, attention=attention, kernel=c.kernel)
        if self.run is not None:
            self.run.update_meta(attention_paths=self.flight.paths())
        return self.flight

    def bind(self, run) -> None:
        """The run, made after the flight recorder was (a model it can't record refused first)."""
        self.run = run
        if self.flight is not None:
            run.update_meta(attention_paths=self.flight.paths())

    def cheap_read(self, result: dict | None = None, drop: tuple = ()) -> PendingMetrics:
        """The statistics the flight recorder summed since its last reset (or ``result``, already
        taken), without the ``drop`` ones, on their way to the host; the recorder is reset.  Read
        them (``.get()``, or :func:`resolved`) when the row is written: the caller's optimizer runs
        first, the read waits for their copy alone."""
        try:
            res = self.flight.result() if result is None else result
        finally:
            self.flight.reset()
        for name in drop:
            res.pop(name, None)
        return self.flight.metrics_later(res)


def resolved(row: dict) -> dict:
    """``row`` with its pending cheap-tier values (key :data:`CHEAP`) read: the one wait, when the
    row is written.  They take precedence over the row's other values (a cheap-tier step's
    attention entropy is the training batch's, not the recorded probe's)."""
    if CHEAP not in row:
        return row
    row = dict(row)
    cheap = row.pop(CHEAP).get()
    return {**row, **cheap}
