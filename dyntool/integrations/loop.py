"""A plain-loop recording helper: one run directory, the same format as ``dyntool train``.

Usage::

    rec = RunRecorder(model, "runs", max_steps=300, every=50, probe=probe_batch)
    for step in range(300):
        rec.probe_step(step)                      # extra fwd/bwd on the probe batch, when scheduled
        with rec.train_step(step):                # or: Capture around the real step (batch="train")
            loss = model(**batch).loss
            loss.backward()
        rec.log(step, loss=loss.item())
        opt.step(); opt.zero_grad()
    rec.close()                                   # or use it as a context manager

The cheap tier (``cheap_every=N``, :class:`dyntool.flight.FlightRecorder`): on every N-th step,
per-head statistics of the *training* batch (entropy, E_α[b], Var_α[b], ‖∂L/∂S‖, ‖U‖, ‖αᵀU‖,
column usage, the largest score) go to that step's metrics row.  Around your own loop's
forward + backward use ``train_step`` (every micro-step of the step; the statistics add up);
trainers that own the loop call ``cheap_begin(step)`` before the step's first forward and
``cheap_end(step)`` after its last backward (``HFRecorderCallback``, ``LightningRecorder`` do).
Same option names as ``dyntool train``: ``cheap_every``, ``cheap_seqs``, ``max_block_mib``.

``probe`` is what ``loss_fn(model, probe)`` turns into a scalar loss; the default ``loss_fn`` handles
a dict of keyword arguments (Hugging Face: ``model(**probe).loss``), a tuple ``(x, y)`` of a model
returning ``(logits, loss)`` or a loss, and a single tensor of token ids (next-token loss on
``logits``).  The probe runs in eval mode (no dropout: α recomputed must be the α used), with the
model's current gradients set aside and restored, so training is not touched.  Under DDP pass the
unwrapped model; ranks other than 0 record nothing.  On a model sharded with FSDP2 every rank
must construct the recorder and call ``probe_step`` (a sharded forward is a collective): each
records its own shard of the probe (:mod:`dyntool.integrations.ranked`).

The machinery is the trainer's (:class:`dyntool.recording_session.RecordingSession`: the record, the
flight recorder, the schedule, a recorded step's row, the cheap tier's read); this class keeps what
a user's loop needs: the probe step, the micro-step context, and rows written when ``log`` is called.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..adapters import AdapterError, find_adapter
from ..capture import Capture
from ..flight import FlightRecorder
from ..record.policy import RecordConfig, crops
from ..record.selection import parse_heads, resolve
from ..recorder import Recorder, plan
from ..recording_session import CHEAP, RecordingSession, Shard, rank_writers, resolved
from ..run_writer import RunWriter
from ..stream import size
from ..train.fsdp import all_reduce, broadcast
from . import ranked


def rank() -> int:
    d = torch.distributed
    return d.get_rank() if d.is_available() and d.is_initialized() else 0


def default_loss(model, batch):
    if isinstance(batch, dict):
        out = model(**batch)
        return out.loss if hasattr(out, "loss") else out["loss"]
    if isinstance(batch, (tuple, list)):
        out = model(*batch)
        if isinstance(out, tuple):
            out = out[-1]
        return out.loss if hasattr(out, "loss") else out
    out = model(batch)                      # token ids → next-token cross-entropy
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch[:, 1:].flatten())


class RunRecorder:
    def __init__(self, model: torch.nn.Module, out_dir: str | Path = "runs", max_steps: int = 1000,
                 every: int = 50, steps: list[int] | None = None, probe=None, loss_fn=default_loss,
                 batch: str | None = None, seqs: int = 1, name: str | None = None, config: dict | None = None,
                 tokens: list[list[str]] | None = None, attention=None, kind: str = "loop", **record_kw):
        self.model, self.probe, self.loss_fn, self.attention = model, probe, loss_fn, attention
        batch = batch or ("probe" if probe is not None else "train")
        self.cfg = RecordConfig(every=every, steps=list(steps or []), batch=batch, seqs=seqs, **record_kw)
        self.cfg.validate("record.")
        if batch == "probe" and probe is None:
            raise ValueError("batch='probe' needs a probe batch (probe=...)")
        _check_heads(model, self.cfg.heads, attention)
        self.max_steps = int(max_steps)
        self.world, self.rank = ranked.world_rank()
        self.sharded = self.world > 1 and ranked.is_sharded(model)   # FSDP2: every rank records
        if self.sharded:
            if batch != "probe":
                raise ranked.ShardError("under FSDP, RunRecorder records a probe batch only "
                                        "(pass probe=...); batch='train' is not supported there")
            self.probe = ranked.split_probe(probe, self.rank, self.world, seqs)
        self.active = self.sharded or rank() == 0
        self.writes_metrics = self.rank == 0 or not self.sharded
        self.run = self.rec = self.session = None
        self.tokens = tokens
        self._attrs_done = False
        self._pending = None
        self.flight: FlightRecorder | None = None
        self._cheap_step: int | None = None       # the step the cheap tier is accumulating
        self._cheap_attached = False              # cheap_begin attached it; cheap_end detaches
        self._cheap_opened = 0                    # steps the cheap tier watched (0: never wired up)
        self._cheap_warned = False
        if not self.active:
            return
        record = asdict(self.cfg)                              # the run's config: the whole probe's
        shard = None
        if self.sharded:                                       # this rank's sequences
            per = seqs // self.world
            self.cfg = replace(self.cfg, seqs=per)
            shard = Shard(self.rank, self.world, per, self.rank * per, all_reduce)
        # the run comes after the flight recorder: a model it can't record is refused before
        self.session = RecordingSession(None, self.cfg, self.max_steps, shard)
        if self.cfg.cheap_every > 0 and self.writes_metrics:    # under FSDP: rank 0's batch
            self.flight = self.session.open_flight(model, attention=attention)
        full = {"source": type(model).__name__, "max_steps": self.max_steps,
                "model": _model_config(model, attention), "record": record, **(config or {})}
        # the kind says how the run was recorded ("loop", "hf-callback", "lightning"): `dyntool ls`
        # shows it and the figures pick by it (a user's model is not a `dyntool train` run)
        self.t0 = time.perf_counter()
        if not self.sharded:
            self.run = RunWriter.create(out_dir, kind, full, name=name, device=_device(model))
        else:
            full["world_size"], full["parallel"] = self.world, "fsdp"
            _, self.run = rank_writers(self.rank, lambda: RunWriter.create(     # rank r: its own record
                out_dir, kind, full, name=name, device=_device(model),
                extra_meta={"world_size": self.world, "parallel": "fsdp"}), broadcast)
        self.session.bind(self.run)         # which path each site's cheap tier takes, and why: meta

    # -- schedule -------------------------------------------------------------------------
    def wants(self, step: int) -> bool:
        return self.active and self.session.wants(step)

    def _recorder(self, cap: Capture) -> Recorder:
        if self.rec is None:
            slot, T = next(iter(cap.slots.values())), size(cap)
            (_, _), (k0, k1) = crops(self.cfg, T)
            sel, _ = plan(self.cfg, cap, k1 - k0)    # a bad selection or budget: refused before the store
            dims = dict(L=len(sel.layers), H=sel.slots, T=T, d_k=slot.q.shape[-1], d_v=slot.v.shape[-1])
            # every rank's words (rank 0 labels the merged view; a rank's own store, its own rows)
            tokens = self.tokens[: self.cfg.seqs * self.world] if self.tokens else None
            self.rec = self.session.open_recorder(T, dims, tokens=tokens, attrs={
                "task": "custom", "record_batch": self.cfg.batch, "block_size": T})
        return self.rec

    def _store(self, step: int, cap: Capture, extra: dict | None = None, grad_scale: float = 1.0):
        rec = self._recorder(cap)
        if not self._attrs_done:
            rec.store.group.attrs.update(rec.selection_attrs(cap, cap.attrs))
            if self.writes_metrics:
                self.run.update_meta(adapter=cap.attrs.get("adapter"))
            self._attrs_done = True
        qs = rec.record_capture(step, cap, extra=extra, grad_scale=grad_scale)
        row = self.session.recorded_row(qs, logit_max=True)     # under FSDP: small all-reduces, every rank
        if extra and "probe_loss" in extra:             # the whole probe's (FSDP: the mean over the ranks)
            extra = {**extra, "probe_loss": self.session.mean_over_ranks(extra["probe_loss"],
                                                                         qs["attn_entropy"].device)}
        if not self.writes_metrics:
            return
        row.update(extra or {})
        self._flush_pending()
        self._pending = (step, row)         # merged into this step's log() row

    # -- recording ------------------------------------------------------------------------
    def probe_step(self, step: int, model: torch.nn.Module | None = None) -> bool:
        """Record ``step`` on the probe batch if scheduled (call before the step's forward)."""
        if not self.wants(step) or self.cfg.batch != "probe":
            return False
        model = model or self.model
        was_training = model.training
        saved = [(p, p.grad) for p in model.parameters()]
        try:
            for p, _ in saved:
                p.grad = None
            model.eval()
            with torch.enable_grad(), Capture(model, seqs=self.cfg.seqs, attention=self.attention) as cap:
                loss = self.loss_fn(model, self.probe)
                # under FSDP: this shard's share of the probe's mean loss (equal shards)
                (loss / self.world if self.sharded else loss).backward()
            self._store(step, cap, extra={"probe_loss": loss.item()})
        finally:
            for p, g in saved:
                p.grad = g
            model.train(was_training)
        return True

    @contextmanager
    def train_step(self, step: int, grad_scale: float = 1.0):
        """Around one micro-step's forward and backward: records the training batch if scheduled
        (the full tier with ``batch="train"``, the cheap tier with ``cheap_every``)."""
        full = self.wants(step) and self.cfg.batch == "train"
        cheap = self._cheap_wants(step)
        if not (full or cheap):
            yield None
            return
        if cheap:
            self._cheap_open(step, grad_scale)
        cap = Capture(self.model, seqs=self.cfg.seqs, grad_scale=grad_scale, attention=self.attention) \
            if full else None
        try:
            if cap is not None and cheap:
                with self.flight.alongside(cap):      # one adapter feeds both tiers
                    yield cap
            elif cap is not None:
                with cap:
                    yield cap
            else:
                with self.flight:
                    yield None
        except BaseException:
            if cheap:
                self.flight.reset()
                self._cheap_step = None
            raise
        if cap is not None:
            self._store(step, cap, grad_scale=grad_scale)

    # -- the cheap tier for loops this class does not wrap (Trainer callbacks) -------------
    def _cheap_wants(self, step: int) -> bool:
        return self.active and self.session.cheap_wants(step)

    def _cheap_open(self, step: int, grad_scale: float) -> None:
        if self._cheap_step is not None and self._cheap_step != step:
            self._cheap_close()                   # the previous step was never logged
        self._cheap_step, self.flight.grad_scale = int(step), float(grad_scale)
        self._cheap_opened += 1

    def _warn_cheap_unused(self, step: int) -> None:
        """``cheap_every`` was set but no step went through ``train_step`` / ``cheap_begin``: the
        per-step statistics can't be taken, and saying nothing would leave the user guessing."""
        if self._cheap_warned or self._cheap_opened or self.flight is None:
            return
        self._cheap_warned = True
        print(f"dyntool: warning: RunRecorder(cheap_every={self.cfg.cheap_every}) recorded no per-step "
              f"statistics (step {step} had none): wrap each step's forward and backward in "
              "`with rec.train_step(step):` (or call rec.cheap_begin(step) / rec.cheap_end(step))",
              file=sys.stderr, flush=True)

    def cheap_begin(self, step: int, grad_scale: float = 1.0) -> bool:
        """Attach the cheap tier for the whole of ``step`` (every micro-step until
        :meth:`cheap_end`), if scheduled.  ``grad_scale``: the factor the loss was multiplied by."""
        if not self._cheap_wants(step):
            return False
        self._cheap_open(step, grad_scale)
        self.flight.__enter__()
        self._cheap_attached = True
        return True

    def cheap_end(self, step: int) -> None:
        """After the step's last backward: detach and put the statistics into the step's row."""
        if self._cheap_step != step or self.flight is None:
            return
        self.flight.__exit__(None, None, None)
        self._cheap_attached = False
        self._cheap_close()

    def _cheap_close(self) -> None:
        step, self._cheap_step = self._cheap_step, None
        # on its way to the host: read when the row is written (the user's optimizer first)
        row = {CHEAP: self.session.cheap_read()}
        if self._pending is not None and self._pending[0] == step:
            self._pending = (step, {**self._pending[1], **row})
        else:
            self._flush_pending()
            self._pending = (step, row)

    def log(self, step: int, **metrics) -> None:
        if not self.active or not self.writes_metrics:
            return
        if self._cheap_wants(step) and not self._cheap_opened:
            self._warn_cheap_unused(step)
        if self._cheap_step == step and not self._cheap_attached:
            self._cheap_close()
        if self._pending is not None and self._pending[0] == step:
            metrics = {**resolved(self._pending[1]), **metrics}
            self._pending = None
        self._flush_pending()
        self.run.log(step, elapsed_s=time.perf_counter() - self.t0, **metrics)

    def _flush_pending(self) -> None:
        if self._pending is not None:
            self.run.log(self._pending[0], **resolved(self._pending[1]))
            self._pending = None

    def close(self, status: str = "finished") -> None:
        if self.active and self.flight is not None:
            if status == "finished" and self.max_steps > 0:
                self._warn_cheap_unused(self.max_steps - 1)
            self.flight.__exit__(None, None, None)
            self._cheap_attached = False
            if self._cheap_step is not None and status == "finished":
                self._cheap_close()
        if self.active and self.run is not None and not self.writes_metrics:   # rank > 0 of FSDP
            self.run.close()
            self.active = False
        if self.active and self.run is not None:
            self._flush_pending()
            self.run.finish(status, steps_recorded=self.rec.n_recorded if self.rec else 0)
            self.active = False

    def __enter__(self) -> "RunRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close("finished" if exc_type is None else
                   "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")
        return False

    @property
    def path(self) -> Path | None:
        return self.run.path if self.run is not None else None


def _check_heads(model, heads: str, attention=None) -> None:
    """Selectors past the model's layers (or heads, when its config says how many) are refused
    before the run directory exists; the first capture checks the rest (dyntool.recorder.plan)."""
    if parse_heads(heads) is None:
        return
    try:
        n_layer = len(find_adapter(model, attention).sites())
    except AdapterError:
        return                                  # Capture says why, with the way out
    cfgs = [getattr(m, "config", None) or getattr(m, "cfg", None) for m in model.modules()]
    n_head = next((int(v) for c in cfgs if c is not None for k in ("num_attention_heads", "n_head", "n_heads")
                   if isinstance(v := getattr(c, k, None), int) and v > 0), 1 << 30)
    resolve(heads, n_layer, n_head)


def _device(model) -> str:
    p = next(model.parameters(), None)
    return str(p.device) if p is not None else "cpu"


def _model_config(model, attention=None) -> dict:
    """What the run's config says about a user's model: its real class, the classes holding the
    recorded attention, the attention implementation and the adapter that reaches it."""
    cfg = getattr(model, "config", None)
    out: dict = {"class": type(model).__name__}
    try:
        ad = find_adapter(model, attention)
        out["adapter"] = ad.name
        out["attention_modules"] = sorted({s.label for s in ad.sites() if s.label})
    except AdapterError as e:                 # Capture will say the same, with the way out
        out["adapter"] = None
        out["adapter_error"] = str(e)
    inner = [m for m in model.modules() if m is not model and hasattr(getattr(m, "config", None), "to_dict")]
    if cfg is None and inner:                 # e.g. a LightningModule wrapping a Hugging Face model
        out["wraps"] = type(inner[0]).__name__
        cfg = inner[0].config
    impl = getattr(cfg, "_attn_implementation", None)
    out["attention"] = impl or out.get("adapter") or "unknown"
    if cfg is not None and hasattr(cfg, "to_dict"):
        d = cfg.to_dict()
        out.update({k: d[k] for k in ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                      "hidden_size", "sliding_window", "n_layer", "n_head", "n_embd") if k in d})
    return out
