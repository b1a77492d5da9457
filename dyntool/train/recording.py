"""Training callbacks: recording (core Recorder + per-step statistics), metrics, console.

``RecordingCallback`` (rank 0 only; every rank under FSDP: :mod:`.sharded`) does four things, none
of which the loop knows about; the recording machinery it shares with ``RunRecorder`` and the
simulations (the record and its Recorder, the flight recorder, the schedule, a recorded step's
row, the cheap tier's read) is one :class:`dyntool.recording_session.RecordingSession`:

1. **Recorded steps** (``record.every`` etc.): through :class:`dyntool.recorder.Recorder`.
   ``record.batch = "probe"``: before the step, one extra forward/backward of the uncompiled model
   on a fixed probe batch (``record.seqs`` sequences of ``data.probe_split``), no optimizer step,
   grads cleared, float32/float64 (no autocast, so U is not bf16-rounded).  ``"train"``: a
   Capture around micro-step 0 of the real step with ``grad_scale = 1/accum`` (the factor the
   loss was multiplied by), so the recorded U is ∂(micro-batch mean loss)/∂(head output),
   unbiased; the factor is stored per step in the ``grad_scale`` array.  Either way α, B, A, U,
   values, ... per (layer, head, seq, query, key) go to ``record.zarr``, and the per-layer/head
   mean attention entropy of the recorded batch goes to metrics (``attn_entropy/L{l}H{h}``).
2. **Every step, max|logit| per layer and head** (``train.logit_stat``) on the training
   micro-batches (max over micro-steps): ``exact`` = ``max |τ q_i·k_j|`` over the allowed (i, j)
   of each head, computed under no_grad from the q, k the step's forward produced (the model
   keeps a detached *reference*, no copy, through the observer seam: ``GPT.track_qk``), in query chunks of 256 (memory
   B·nh·256·T floats; causal chunks only read keys < chunk end).  Cost ≈ one QKᵀ per layer,
   i.e. ~1/3 of the attention forward; well under 1% of a step at our sizes (see bench).
   ``bound`` = ``τ · max_i‖q_i‖ · max_j‖k_j‖`` (Cauchy–Schwarz, O(B·nh·T·hs), an upper bound
   that ignores the mask).  Metrics: ``logit_max/L{l}H{h}``, ``logit_max/L{l}`` (max over
   heads), ``logit_max`` (model max).  On recorded steps the recorded ``logit_max`` array
   holds the same statistic for the recorded sequences.
3. **The cheap tier** (``record.cheap_every = N``, :class:`dyntool.flight.FlightRecorder`): on
   every N-th step, over all micro-steps of the training batch (``record.cheap_seqs`` sequences
   of each), per layer and head: attention entropy, E_α[b] and Var_α[b], ‖∂L/∂S‖, ‖U‖, ‖αᵀU‖,
   column-usage concentration, the largest score; reduced in the backward in query-row blocks of
   ``record.max_block_mib``, no T×T kept.  Metrics ``BASE/L{l}H{h}`` (dyntool.flight.STATS);
   its ``attn_entropy`` replaces the recorded batch's on steps that have both, so the per-step
   series comes from one kind of batch.
4. **Every step, gradient norms per parameter group** (``grad_norm/emb``, ``grad_norm/L{l}.attn``,
   ``.mlp``, ``.ln``, ``grad_norm/ln_f``), taken after the last micro-step's backward, i.e. on
   the accumulated (and, under DDP, averaged) gradient *before* clipping.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from contextlib import contextmanager, nullcontext

import torch

from ..data.wikitext import fixed_batch
from ..errors import ConfigError
from ..flight import FlightError, FlightRecorder, KernelRefused
from ..record import metric_names as mn
from ..record.selection import resolve
from ..recorder import Recorder
from ..recording_session import RecordingSession, Shard
from .gpt import group_norms_of
from .trainer import Callback


@torch.no_grad()
def logit_absmax(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, scale: float,
                 chunk: int = 256, causal: bool = True) -> torch.Tensor:
    """Exact ``max |scale · q_i·k_j|`` over allowed (i, j), per head.  q, k (B, nh, T, hs);
    allowed (nh|1, T, T).  Returns (nh,)."""
    dt = torch.promote_types(q.dtype, torch.float32)
    q, k = q.to(dt), k.to(dt)
    T = q.shape[-2]
    out = torch.zeros(q.shape[1], dtype=dt, device=q.device)
    for a in range(0, T, chunk):
        b = min(a + chunk, T)
        kend = b if causal else T                                      # keys > i are never allowed
        s = torch.matmul(q[:, :, a:b], k[:, :, :kend].transpose(-1, -2))   # (B, nh, c, kend)
        s = s.abs_().masked_fill_(~allowed[:, a:b, :kend], 0.0)
        out = torch.maximum(out, s.amax(dim=(0, 2, 3)))
    return out * scale


@torch.no_grad()
def logit_bound(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Cauchy–Schwarz bound ``scale · max‖q_i‖ · max‖k_j‖`` per head (ignores the mask).  (nh,)"""
    dt = torch.promote_types(q.dtype, torch.float32)
    return q.to(dt).norm(dim=-1).amax(dim=(0, 2)) * k.to(dt).norm(dim=-1).amax(dim=(0, 2)) * scale


class RecordingCallback(Callback):
    def __init__(self, run, cfg):
        self.run, self.cfg = run, cfg
        self.session: RecordingSession | None = None    # recorder, flight recorder, schedule, reads
        self.rec: Recorder | None = None
        self.trainer = None
        self._lmax = None           # (L, nh) running max over this step's micro-steps
        self._gn = None             # (group names, their grad norms on the host) of this step
        self._extra: dict = {}      # metrics gathered during the step
        self.flight: FlightRecorder | None = None
        self._cheap = None         # the cheap tier's metrics of this step, on their way (PendingMetrics)

    def _shard(self) -> Shard | None:
        """This rank's part of the recording (FSDP: ShardedRecordingCallback); None: all of it."""
        return None

    # -- setup ----------------------------------------------------------------------------
    def on_train_start(self, trainer) -> None:
        self.trainer = tr = trainer
        cfg, model = self.cfg, trainer.raw
        m, T = cfg.model, cfg.data.block_size
        rc = cfg.record
        shard = self._shard()
        if shard is not None:                   # the Recorder captures this rank's own sequences
            rc = dataclasses.replace(rc, seqs=shard.seqs)
        self.session = s = RecordingSession(self.run, rc, cfg.train.max_steps, shard)
        self.probe_divisor = shard.world if shard is not None else 1   # each rank: its share of the probe mean loss
        if rc.enabled and (rc.every or rc.steps or rc.log_spaced):
            sel = resolve(rc.heads, m.n_layer, m.n_head)      # checked by TrainConfig.validate
            dims = dict(L=len(sel.layers), H=sel.slots, T=T, d_k=m.n_embd // m.n_head, d_v=m.n_embd // m.n_head)
            words = None
            if rc.batch == "probe":
                d = cfg.data
                x, y = fixed_batch(tr.corpus.split(d.probe_split), cfg.record.seqs, T, d.probe_offset, tr.device)
                # the probe's words label the matrix axes in the app (one list per sequence)
                words = [[tr.corpus.vocab[int(t)] for t in row] for row in x.tolist()]
                own = slice(shard.offset, shard.offset + shard.seqs) if shard is not None else slice(None)
                self.probe = (x[own], y[own])
            self.rec = s.open_recorder(T, dims, tokens=words, attrs={
                "task": "wikitext", "attention": m.attention, "record_batch": rc.batch,
                "grad_scale": tr.grad_scale, "accum": cfg.optim.accum, "block_size": T,
                # span's backward rescales dQ/dK: query_grad/key_grad hold the applied ones
                "adapter": "dyntool", "qk_grads": "applied" if m.attention == "span" else "standard"})
        if rc.enabled and rc.cheap_every > 0:
            try:
                self.flight = s.open_flight(model, grad_scale=tr.grad_scale)    # paths -> meta.json
            except KernelRefused as e:
                raise ConfigError("record.kernel", str(e).removeprefix("record.kernel=")) from None
        self.groups = model.grad_groups()
        self.cores = [blk.attn.core for blk in model.h]
        model.track_qk(cfg.train.logit_stat != "off")
        self.logit_tap: FlightRecorder | None = None
        if cfg.train.compile:
            self.run.update_meta(compiled_steps=self._prepare_compiled(model))

    def _prepare_compiled(self, model) -> dict:
        """How compiled steps record (kept in meta as ``compiled_steps``): the cheap tier through the
        fused kernel when every site takes it (else its steps run eager), and the per-step
        max |logit| from the kernel's forward statistics, or from the q, k the compiled graph hands
        out (one QKᵀ pass after the forward, as on eager steps)."""
        d, rc, how = self.cfg.data, self.cfg.record, {}
        if self.flight is not None:
            try:
                self.flight.prepare(d.batch_size, d.block_size)
                how["cheap_tier"] = "compiled, fused kernel"
            except FlightError as e:
                how["cheap_tier"] = f"eager steps ({e})"
        stat = self.cfg.train.logit_stat
        if stat == "exact":
            tap = self.flight if self.flight is not None and self.flight.compilable else None
            if tap is None and self.flight is None and rc.kernel != "eager":
                try:                        # a recorder of the kernel's forward statistics only
                    tap = FlightRecorder(model, kernel=rc.kernel)
                    tap.prepare(d.batch_size, d.block_size)
                except FlightError:
                    tap = None
            self.logit_tap = tap
        if stat != "off":
            how["logit_stat"] = (f"{stat}, fused kernel's forward statistics" if self.logit_tap is not None
                                 else f"{stat}, from the q, k the compiled graph returns")
        return how

    def wants_eager(self, step: int) -> bool:
        if self.session.cheap_wants(step) and not self.flight.compilable:
            return True                     # the observer seam is skipped inside compiled code
        return self.rec is not None and self.rec.wants(step)

    # -- per step -------------------------------------------------------------------------
    def on_step_start(self, step: int) -> None:
        self._lmax, self._extra, self._cheap, self._gn = None, {}, None, None
        if self.rec is None or self.cfg.record.batch != "probe" or not self.rec.wants(step):
            return
        model = self.trainer.raw
        x, y = self.probe
        try:
            with self.rec.capture(model) as cap:
                _, loss = model(x, y)
                (loss / self.probe_divisor).backward()
            qs = self.rec.record_capture(step, cap, extra={"probe_loss": loss.item()})
            self._summarise(qs)
            self._extra["probe_loss"] = self.session.mean_over_ranks(loss.item(), loss.device)   # the whole probe's
        finally:
            model.zero_grad(set_to_none=True)

    probe_divisor = 1         # the probe loss is split over this many processes (FSDP ranks: on_train_start)

    def micro_step_context(self, step: int, micro: int):
        return self._micro(step, micro)

    @contextmanager
    def _micro(self, step: int, micro: int):
        rec, tr = self.rec, self.trainer
        cap = None
        if rec is not None and self.cfg.record.batch == "train" and micro == 0 and rec.wants(step):
            cap = rec.capture(tr.raw, grad_scale=tr.grad_scale)
        flight = self.flight if self.session.cheap_wants(step) else None
        # a compiled step without the cheap tier: the max |logit| from the kernel's forward
        tap = self.logit_tap if flight is None and getattr(tr, "step_compiled", False) else None
        try:
            with cap if cap is not None else nullcontext(), flight if flight is not None else nullcontext(), \
                    tap.logits() if tap is not None else nullcontext():
                yield
        except BaseException:
            for f in (flight, tap):
                if f is not None:
                    f.reset()
            raise
        if cap is not None:
            qs = rec.record_capture(step, cap, grad_scale=tr.grad_scale)
            self._summarise(qs)
        # the exact logit statistic is the cheap tier's logit_max when that sees every sequence:
        # one QKᵀ pass, not two
        covered = flight is not None and not self.cfg.record.cheap_seqs and self.cfg.train.logit_stat == "exact"
        if covered or tap is not None:
            for blk in tr.raw.h:
                blk.clear_qk()
            if tap is not None:
                self._fold_lmax(tap.logit_max().float())
        else:
            self._logit_stat()
        if flight is not None and micro == self.cfg.optim.accum - 1:
            res = flight.result()
            if covered:
                self._lmax = res["logit_max"].float()
            # logit_max/L{l}H{h} is the per-step statistic's unless that is off; the row is read at
            # the step's own sync (on_step_end), after the optimizer launched: never waited on here
            self._cheap = self.session.cheap_read(res, drop=("logit_max",) if self.cfg.train.logit_stat != "off" else ())
        if micro == self.cfg.optim.accum - 1 and self.trainer.fsdp and self._logged(step):
            self._grad_norms(self._group_norms())      # sharded: local sums, one all-reduce

    def _summarise(self, qs: dict) -> None:
        self._extra.update(self.session.recorded_row(qs))          # attention entropy per head (all ranks')
        self._extra["recorded"] = True

    def _logit_stat(self) -> None:
        how = self.cfg.train.logit_stat
        if how == "off":
            return
        rows = []
        for blk, core in zip(self.trainer.raw.h, self.cores):
            qk = blk.last_qk()
            if qk is None:                  # the observer was not fed: a bug, never a silent gap
                raise RuntimeError(f"train.logit_stat={how}: layer {core.layer_index} handed out no q, k this step")
            q, k = qk
            scale = 1.0 / math.sqrt(q.shape[-1])
            if how == "exact":
                rows.append(logit_absmax(q, k, core.allowed(q.shape[-2], q.device), scale))
            else:
                rows.append(logit_bound(q, k, scale))
            blk.clear_qk()                  # drop the reference: memory back before backward ends
        self._fold_lmax(torch.stack(rows))                              # (L, nh)

    def _fold_lmax(self, lm: torch.Tensor) -> None:
        """This micro-step's (L, nh) max |logit| into the step's (the max over micro-steps)."""
        self._lmax = lm if self._lmax is None else torch.maximum(self._lmax, lm)

    def _logged(self, step: int) -> bool:
        """This step gets a metrics row (MetricsLogger's rule, as far as it is known before the
        step ends): per-group gradient norms are computed for those steps only."""
        t = self.cfg.train
        return step % t.log_every == 0 or bool(t.eval_every and step and step % t.eval_every == 0) or \
            (self.rec is not None and self.rec.wants(step)) or \
            (self.flight is not None and self.session.cheap_wants(step))

    def on_gradients(self, step: int, params: list, norms: torch.Tensor) -> None:
        """Per-group norms from the trainer's per-parameter norm pass (the one clipping uses)."""
        if not self._logged(step):
            return
        self._grad_norms(group_norms_of(self.groups, params, norms))

    @torch.no_grad()
    def _grad_norms(self, norms: dict) -> None:
        if norms:
            t = torch.stack(list(norms.values())).float()
            # to the host without a sync of its own: the copy is queued before the trainer's one
            # sync of the step (loss, grad norm); the event makes on_step_end wait for it anyway
            ev = None
            if t.is_cuda:
                t = t.to("cpu", non_blocking=True)
                ev = torch.cuda.Event()
                ev.record()
            self._gn = (list(norms), t, ev)

    def _group_norms(self) -> dict:
        raise NotImplementedError("per-group norms come from on_gradients; the FSDP callback overrides this")

    def on_step_end(self, step: int, metrics: dict) -> None:
        if self._lmax is not None:
            lm = self._lmax.tolist()
            for l, row in enumerate(lm):
                for h, v in enumerate(row):
                    metrics[mn.head(mn.LOGIT_MAX, l, h)] = v
                metrics[mn.layer(mn.LOGIT_MAX, l)] = max(row)
            metrics[mn.LOGIT_MAX] = max(max(r) for r in lm)
        metrics.update(self._extra)
        if self._gn is not None:
            if self._gn[2] is not None:
                self._gn[2].synchronize()
            for name, v in zip(self._gn[0], self._gn[1].tolist()):
                metrics[mn.grad_norm(name)] = v
        if self._cheap is not None:
            metrics.update(self._cheap.get(), cheap_tier=True)

    def on_train_end(self, final: dict) -> None:
        self.trainer.raw.track_qk(False)


class MetricsLogger(Callback):
    """Writes one metrics.jsonl row per logged step; keep it last in the callback list."""

    def __init__(self, run, log_every: int = 1):
        self.run, self.every = run, log_every

    def on_step_end(self, step: int, metrics: dict) -> None:
        recorded, cheap = metrics.pop("recorded", False), metrics.pop("cheap_tier", False)
        force = recorded or cheap or "val_loss" in metrics or not math.isfinite(metrics["loss"])
        if force or step % self.every == 0:
            self.run.log(step, **metrics)

    def on_final_state(self, step: int, metrics: dict) -> None:
        self.run.log(step, **metrics)           # the validation after the last step: row N


class ConsoleCallback(Callback):
    """One line per validation (and the final numbers) on stderr."""

    def __init__(self, label: str = "", stream=sys.stderr):
        self.label, self.stream, self.t0 = label, stream, time.perf_counter()
        self.last = None

    def on_step_end(self, step: int, metrics: dict) -> None:
        self.last = metrics
        if "val_loss" in metrics:           # step = steps taken: the model both numbers are of
            print(f"{self.label}step {step}: loss {metrics['loss']:.4f}  val {metrics['val_loss']:.4f} "
                  f"(ppl {metrics['val_ppl']:.1f})  {metrics['tokens_per_s']:.0f} tok/s  "
                  f"{time.perf_counter() - self.t0:.0f}s", file=self.stream, flush=True)

    def on_final_state(self, step: int, metrics: dict) -> None:
        print(f"{self.label}step {step}: val {metrics['val_loss']:.4f} (ppl {metrics['val_ppl']:.1f})  "
              f"{time.perf_counter() - self.t0:.0f}s", file=self.stream, flush=True)

    def on_train_end(self, final: dict) -> None:
        ppl = f"valid ppl {final['valid_ppl']:.2f}  test ppl {final['test_ppl']:.2f}{bounded(final)}  " \
            if "valid_ppl" in final else ""
        print(f"{self.label}final: {ppl}{time_summary(final)}  ({time.perf_counter() - self.t0:.0f}s in all)",
              file=self.stream, flush=True)


def bounded(final: dict) -> str:
    """`` (bounded: first N tokens of each split)`` when the final evaluation did not read it all."""
    if final.get("final_eval") != "bounded":
        return ""
    n = final.get("final_eval_tokens", {})
    return f" (bounded: first {n.get('valid', 0):,} / {n.get('test', 0):,} tokens of valid / test)"


def time_summary(final: dict) -> str:
    """``training 12.3 s, evaluation 4.5 s (periodic 1.2 s + final 3.3 s)`` from a run's final numbers."""
    per, fin = final.get("eval_seconds", 0.0), final.get("final_eval_seconds")
    ev = per + (fin or 0.0)
    parts = f" (periodic {per:.1f} s + final {fin:.1f} s)" if fin is not None and per else ""
    return f"training {final.get('train_seconds', 0.0):.1f} s, evaluation {ev:.1f} s{parts}"
