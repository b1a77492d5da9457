"""``dyntool sim bijection``: the Bayesian wind tunnel (Paper I, arXiv 2512.22471).

A pre-LN multi-layer, multi-head GPT (:class:`dyntool.train.gpt.GPT`, so attention runs through
dyntool's :class:`~dyntool.attention.AttentionCore`) learns the bijection task
(:mod:`dyntool.sims.bijection_data`: V = 20, L = 19, keys without replacement, query from
context) from fresh random sequences every step, and is evaluated on a fixed held-out set drawn
from a separate generator (``seed + heldout_seed_offset``; the training stream draws ~10⁵–10⁷
sequences out of 20!·20!·19 ≈ 10³⁸ possible ones for V = 20, L = 19, so an overlap is practically
impossible and not checked).

On every recorded step (the ``[record]`` schedule):

* the seam records the standard arrays (α, B, A, ∂L/∂S, U, q, k, v, ...) of the first
  ``record.seqs`` held-out sequences (a probe forward/backward, no optimizer step);
* :func:`dyntool.sims.bijection_analysis.analyze` runs the Paper-I analyses on the first
  ``analysis_seqs`` held-out sequences: per-layer manifold metrics of the residual stream and of the
  head outputs against H_Bayes, key orthogonality, attention entropy; they go to metrics.jsonl
  (``manifold/…``, ``key_orth/…``, ``attn_entropy/…``) and PC1/PC2 scores of ``plot_seqs``
  sequences go to the record (``bij_pcs_resid``, ``bij_pcs_g``);
* the held-out evaluation (also every ``eval_every`` steps): loss, accuracy, and the model's
  predictive entropy per target position (``bij_model_entropy``) against
  ``static/bayes_entropy_target`` (``static/bayes_entropy`` is the same per sequence position,
  NaN at the value tokens, as the app reads it).

Loss: cross-entropy of the value-token logits (ids V..2V-1) at the L key positions and the query,
averaged over the L + 1 targets.  AdamW, linear warm-up then cosine decay to ``min_lr_frac``·lr,
gradient clipping.  The ``[task]`` section (:mod:`dyntool.sims.bijection_task`) switches to the
authors' task piece by piece: pointer head at the query, query-only (or ``all_values``) loss, the
final normed hidden state at the value positions as an extra read-out in bits; with
``with_replacement`` that is ``--preset authors`` (docs/wind_tunnel_differences.md).

``device`` (cpu | cuda | cuda:N, default cpu): the model, the training batches and the held-out
tensors live there.  The training batches are drawn on that device from a generator seeded with
``seed`` (no host→device copy per step; a CUDA run's batches are not the CPU run's), the held-out
set on the CPU (its exact posterior is computed there) and moved once; whatever numpy reads is moved
to the CPU first.  ``cpu`` is the run as it was before the key existed, byte for byte.  ``compile``
(auto | on | off): the training step compiled and, on CUDA, replayed as CUDA graphs
(:mod:`.bijection_step`; auto = on CUDA only).  One CUDA run so far: the paper preset, 13.8k steps
on an H200 (docs/results.md).

Checkpoints and ``--resume`` (:mod:`.resume`, the mechanism every sim shares): a run stopped by
Ctrl-C/SIGTERM, ``time_limit_min`` or ``stop_at_step`` writes ``checkpoint.pt`` (also at the end and
every ``checkpoint_every`` steps), and ``dyntool sim bijection --resume RUN`` continues it into a
new run ``RUN-resumeSTEP`` whose rows from that step on are the uninterrupted run's.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from typing import Annotated

from ..config import NonNegFloat, NonNegInt, Pattern, PosFloat, PosInt, Seed, to_dict
from ..errors import ConfigError, NonFiniteLossError
from ..progress import progress
from ..record import metric_names as mn
from ..record.policy import RecordConfig, check_budget, schedule
from ..recorder import Recorder
from ..run_writer import RunWriter, critical_section, ensure_out_dir
from ..safeio import memory_problem
from ..train.config import ModelConfig
from ..train.gpt import GPT
from . import bijection_data as data
from . import resume as ckpt
from .bijection_analysis import analyze, evaluate
from .bijection_phase import paper_reference, phase
from .bijection_step import Step, lr_at, wants_compile  # noqa: F401  (lr_at: its old home was here)
from .bijection_task import BijectionTask, task_loss, value_scores
from .device import SimDevice, resolve

COMPILE = Pattern("auto|on|off", "auto, on or off")


@dataclass
class BijectionModel:
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 192
    backend: str = "sdpa"           # sdpa | manual (manual also records routing_residual)
    init_std: float = 0.02
    tie_weights: bool = True

    def validate(self, prefix: str = "") -> None:
        if self.n_layer < 1 or self.n_head < 1 or self.n_embd % self.n_head:
            raise ConfigError(prefix + "n_embd", f"n_layer, n_head >= 1 and n_embd ({self.n_embd}) "
                                                 f"divisible by n_head ({self.n_head})")
        if self.backend not in ("sdpa", "manual"):
            raise ConfigError(prefix + "backend", f"sdpa or manual, got {self.backend!r}")


@dataclass
class BijectionConfig:
    seed: Seed = 42
    device: SimDevice = "cpu"       # cpu | cuda | cuda:N; the training batches are drawn there
    compile: Annotated[str, COMPILE] = "auto"     # the training step compiled (auto: on CUDA only)
    V: int = 20
    L: int = 19
    with_replacement: bool = False
    steps: PosInt = 2000
    batch_size: PosInt = 128
    lr: PosFloat = 3e-4
    min_lr_frac: float = 0.1
    warmup: NonNegInt = 100
    weight_decay: NonNegFloat = 0.1
    grad_clip: NonNegFloat = 1.0
    heldout_seqs: PosInt = 1024
    heldout_seed_offset: NonNegInt = 10000
    analysis_seqs: int = 256        # held-out sequences the geometry is measured on
    plot_seqs: int = 64             # ... of which PC1/PC2 scores are recorded for figures
    eval_every: PosInt = 100
    log_every: PosInt = 10
    threads: NonNegInt = 0              # torch and BLAS threads (0: leave the defaults)
    time_limit_min: NonNegFloat = 0.0    # stop after the step that crosses this wall time (0: none); the
                                    # stopping step is evaluated, analysed and recorded
    stop_at_step: NonNegInt = 0          # the same stop at a fixed step (0: none), e.g. to repeat a run
                                    # that the time limit stopped: the lr schedule still uses `steps`
    checkpoint_every: NonNegInt = 0      # also write checkpoint.pt every N steps (0: only when stopped
                                    # by a signal, the time limit or stop_at_step, and at the end)
    model: BijectionModel = field(default_factory=BijectionModel)
    task: BijectionTask = field(default_factory=BijectionTask)     # the authors' task, as options
    record: RecordConfig = field(default_factory=lambda: RecordConfig(
        every=250, log_spaced=8, seqs=2, dtype="float32", batch="probe"))

    def validate(self, prefix: str = "") -> None:
        p = prefix
        if self.V < 2 or self.L < 1:
            raise ConfigError(p + "V/L", f"V >= 2 and L >= 1, got V={self.V}, L={self.L}")
        if not self.with_replacement and self.L > self.V:
            raise ConfigError(p + "L", f"without replacement L <= V, got L={self.L} > V={self.V}")
        if self.steps < 1 or self.batch_size < 1:
            raise ConfigError(p + "steps/batch_size", "must be >= 1")
        if not self.lr > 0 or not 0 <= self.min_lr_frac <= 1 or self.warmup < 0:
            raise ConfigError(p + "lr", "lr > 0, 0 <= min_lr_frac <= 1, warmup >= 0")
        if self.heldout_seqs < 1 or not 0 < self.analysis_seqs <= self.heldout_seqs:
            raise ConfigError(p + "analysis_seqs", f"0 < analysis_seqs <= heldout_seqs ({self.heldout_seqs})")
        if not 0 <= self.plot_seqs <= self.analysis_seqs:
            raise ConfigError(p + "plot_seqs", f"0 <= plot_seqs <= analysis_seqs ({self.analysis_seqs})")
        if self.record.seqs > self.heldout_seqs:
            raise ConfigError(p + "record.seqs", f"at most heldout_seqs ({self.heldout_seqs})")
        if self.time_limit_min < 0 or self.stop_at_step < 0:
            raise ConfigError(p + "time_limit_min/stop_at_step", "must be >= 0")
        if self.eval_every < 1 or self.log_every < 1 or self.threads < 0:
            raise ConfigError(p + "eval_every/log_every/threads", "eval_every, log_every >= 1, threads >= 0")

    def check_memory(self) -> None:
        """Refuse, before anything is allocated or created, a run too big for this machine: the 2V
        token embedding with its gradient and AdamW state, and a batch's activations and logits."""
        m, T, V2 = self.model, data.seq_len(self.L), 2 * self.V
        per_token = m.n_layer * (12 * m.n_embd + 2 * m.n_head * T) + 3 * V2
        need = 4 * (4 * (V2 * m.n_embd + 12 * m.n_layer * m.n_embd ** 2) + self.batch_size * T * per_token)
        why = memory_problem(need, "one training step")
        if why:
            raise ConfigError("V", f"{why} (V {self.V}, L {self.L}, batch {self.batch_size}, "
                                   f"{m.n_layer} layers of {m.n_embd}); lower V, batch_size or the model size")


def build_model(cfg: BijectionConfig):
    m = cfg.model
    mc = ModelConfig(attention="mhsa", n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd,
                     backend=m.backend, init_std=m.init_std, tie_weights=m.tie_weights)
    torch.manual_seed(cfg.seed)
    return GPT(mc, vocab_size=2 * cfg.V, block_size=data.seq_len(cfg.L))


def heldout(cfg: BijectionConfig):
    g = torch.Generator().manual_seed(cfg.seed + cfg.heldout_seed_offset)
    return data.sample(cfg.heldout_seqs, cfg.V, cfg.L, g, cfg.with_replacement)


def checks_loss_each_step(dev: torch.device) -> bool:
    """Is each step's loss checked for finiteness before its update (True on the CPU, as always)?
    On a GPU that check is a host sync per step, so there non-finite losses are OR-ed on the device
    and read on logged steps: the run fails at the first logged step at or after the bad one."""
    return dev.type == "cpu"


def _bayes_accuracy_keys(cfg: BijectionConfig, h: np.ndarray) -> float:
    """Bayes-optimal accuracy at the key positions: closed form without replacement; with
    replacement the posterior is uniform on exp(H) values, so the held-out mean of exp(-H)."""
    if not cfg.with_replacement:
        return data.bayes_accuracy(cfg.V, cfg.L)[0]
    return float(np.exp(-h[:, :cfg.L]).mean())


def _declare(store, readout: str = "resid_keys") -> None:
    store.declare("bij_model_entropy", dims=("step", "target"))
    for rep in ("resid", "g") + (("normed_values",) if readout == "normed_values" else ()):
        store.declare(f"bij_pcs_{rep}", dims=("step", "layer", "point", "pc"))


def run_bijection(cfg: BijectionConfig, out_dir: str, name: str | None = None,
                  tags: list[str] | None = None, quiet: bool = False, resume: dict | None = None,
                  resumed_from: str | None = None) -> RunWriter:
    """Train and record one wind-tunnel run; ``cfg.threads`` applies to torch and to BLAS (the
    analyses) for the duration of the run only.  ``resume``: a checkpoint from
    :func:`dyntool.sims.resume.load` (of the run ``resumed_from``) to continue from."""
    dev = resolve(cfg.device)                                # before any folder is made
    cfg.check_memory()                                       # (it counts host memory, also for a GPU run)
    prev, limits = torch.get_num_threads(), None
    if cfg.threads:
        try:        # numpy/BLAS threads of the analyses too (threadpoolctl comes with scikit-learn)
            from threadpoolctl import threadpool_limits
            limits = threadpool_limits(cfg.threads)
        except ImportError:
            pass
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, dev, out_dir, name, tags, quiet, resume, resumed_from)
    finally:            # reverse order: the BLAS/OpenMP limits also hold torch's OpenMP pool
        if limits is not None:
            limits.restore_original_limits()
        torch.set_num_threads(prev)


# geometry numbers kept at step 0 and at the end in meta.final["geometry"], with their baselines
_GEOMETRY = ("r2_linear", "r_pc1", "r_best", "ordering_score", mn.R2_PARTIAL, mn.ORDERING_NULL_MEAN,
             mn.ORDERING_NULL_P)


def _run(cfg: BijectionConfig, dev: torch.device, out_dir: str, name, tags, quiet: bool,
         resume: dict | None = None, resumed_from: str | None = None) -> RunWriter:
    m = cfg.model
    T, hs = data.seq_len(cfg.L), m.n_embd // m.n_head
    check_budget(cfg.record, len(schedule(cfg.record, cfg.steps)), ensure_out_dir(out_dir),
                 L=m.n_layer, H=m.n_head, T=T, d_k=hs, d_v=hs)
    model = build_model(cfg).to(dev)        # initialised on the CPU: the same weights on any device
    task = cfg.task

    def loss_of(mdl, x, y):                # the task's loss (default: keys + query, value logits)
        return task_loss(value_scores(mdl, x, cfg.V, task.head), x, y, cfg.V, task)
    opt = torch.optim.AdamW(model.param_groups(cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))
    ho = _Heldout.of(cfg, dev)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)      # the batches are drawn on the device
    start, kept = 0, {}
    if resume is not None:
        start, kept = ckpt.restore(resume, model, opt, {"batches": gen}), resume["extra"]
    train_step = Step(model, opt, cfg, loss_of, compiled=wants_compile(cfg.compile, dev))
    meta = {"record_batch": f"probe: first {cfg.record.seqs} held-out sequences", "n_params": model.num_params(),
            "bayes_loss": ho.bayes_loss, "bayes_accuracy_keys": _bayes_accuracy_keys(cfg, ho.h),
            "compiled_step": train_step.compiled}
    if resumed_from is not None:
        meta["resumed_from"] = {"run": resumed_from, "step": start}
    run = RunWriter.create(out_dir, "bijection", to_dict(cfg), name=name, seeds=[cfg.seed], tags=tags,
                           device=str(dev), extra_meta=meta)
    saver = ckpt.Checkpointer(run, "bijection", cfg.checkpoint_every)
    t0 = time.perf_counter()
    with run:
        store = run.open_store(cfg.record.chunk_steps, cfg.record.flush_seconds,
                               attrs={"task": "bijection", "V": cfg.V, "L": cfg.L})
        _write_statics(store, cfg, ho)
        rec = Recorder(store, cfg.record, cfg.steps, T)
        last_eval, stop_at = kept.get("last_eval"), None
        # analysed step -> geometry numbers (first and last kept)
        geometry: dict[int, dict] = {int(k): v for k, v in kept.get("geometry", {}).items()}
        check_now, nonfinite = checks_loss_each_step(dev), torch.zeros((), dtype=torch.bool, device=dev)
        done, consistent = start, True          # steps taken; whether model and optimizer agree with it

        def save(at: int) -> None:
            saver.save(at, model, opt, {"batches": gen}, {"last_eval": last_eval, "geometry": geometry})
        try:
            for step in progress(range(start, cfg.steps), desc="bijection", disable=quiet, initial=start,
                                 total=cfg.steps):
                with critical_section():       # a SIGTERM/SIGINT lands between steps
                    consistent = False
                    row: dict = {}
                    over = (cfg.time_limit_min > 0 and time.perf_counter() - t0 > 60 * cfg.time_limit_min) or \
                        (0 < cfg.stop_at_step == step)
                    if over:
                        stop_at = step
                    if rec.wants(step) or over or step % cfg.eval_every == 0 or step == cfg.steps - 1:
                        last_eval, ent = _evaluate(model, cfg, ho)
                        row.update({mn.bijection_heldout(k): v for k, v in last_eval.items()})
                        row[mn.bijection_heldout("excess_loss")] = last_eval["loss"] - ho.bayes_loss
                    if rec.wants(step) or over:
                        an = analyze(model, ho.an_tok, cfg.V, n_plot=cfg.plot_seqs, h_bayes=ho.an_h,
                                     readout=task.readout)
                        row.update(an["metrics"])
                        geometry = _keep_geometry(geometry, step, an["metrics"], last_eval["acc_query"])
                        extra = {f"bij_{k}": v for k, v in an["arrays"].items()}
                        extra["bij_model_entropy"] = ent
                        rec.record_probe(model, lambda mdl: loss_of(mdl, ho.pr_tok, ho.pr_tgt), step, extra)
                    if over:                 # time limit: this step is the last one evaluated; no update
                        run.log(step, elapsed_s=time.perf_counter() - t0, **row)
                        consistent = True
                        break
                    loss, lr, gnorm = train_step(step, gen, check_now)
                    if not check_now:
                        nonfinite |= ~torch.isfinite(loss)
                    if row or step % cfg.log_every == 0:
                        if not check_now and nonfinite.item():
                            raise NonFiniteLossError(step, "a loss since the previous logged step was not finite "
                                                           "(on a GPU the check is read on logged steps)")
                        run.log(step, loss=loss.item(), lr=lr, grad_norm=float(gnorm),
                                elapsed_s=time.perf_counter() - t0, **row)
                    done, consistent = step + 1, True
                    if saver.due(done) and done < cfg.steps:
                        save(done)
        except KeyboardInterrupt as e:          # Ctrl-C / SIGTERM: a checkpoint, and how to go on
            if consistent:
                save(done)
            e.next_step = ckpt.continue_command("bijection", run.path, saver.step) if saver.step is not None \
                else f"stopped at step {done} with no checkpoint (the step was cut off by a second signal)"
            raise
        n_done = stop_at if stop_at is not None else cfg.steps
        save(n_done)
        seconds = time.perf_counter() - t0
        final = {**(last_eval or {}), "bayes_loss": ho.bayes_loss, "steps_done": n_done,
                 "geometry": _final_geometry(geometry), "stopped_early": stop_at is not None,
                 "paper_i": paper_reference((last_eval or {}).get("acc_query"), n_done),
                 "seconds": round(seconds, 1), "sec_per_step": seconds / max(n_done - start, 1)}
        if stop_at is not None:
            final["next_step"] = ckpt.continue_command("bijection", run.path, n_done)
        run.update_meta(final=final)
    return run


@dataclass
class _Heldout:
    """The fixed held-out set and its slices: analysed sequences, probe sequences, exact H_Bayes."""
    tok: torch.Tensor
    tgt: torch.Tensor
    h: np.ndarray                  # (n, L+1) exact posterior entropy per target
    an_tok: torch.Tensor
    an_h: np.ndarray
    pr_tok: torch.Tensor
    pr_tgt: torch.Tensor
    h_pos: np.ndarray              # (L+1,) mean H_Bayes per target
    bayes_loss: float              # mean H_Bayes: the Bayes-optimal held-out loss

    @classmethod
    def of(cls, cfg: BijectionConfig, dev: torch.device | None = None) -> "_Heldout":
        """Drawn on the CPU (H_Bayes from its numpy copy), the token tensors then moved to ``dev``."""
        tok, tgt = heldout(cfg)
        h = data.posterior_entropy(tok.numpy(), cfg.V)
        if dev is not None:
            tok, tgt = tok.to(dev), tgt.to(dev)
        return cls(tok, tgt, h, tok[:cfg.analysis_seqs], h[:cfg.analysis_seqs],
                   tok[:cfg.record.seqs], tgt[:cfg.record.seqs], h.mean(0), float(h.mean()))


def _write_statics(store, cfg: BijectionConfig, ho: _Heldout) -> None:
    """The record's declared arrays and its per-run constants (H_Bayes per position and target)."""
    _declare(store, cfg.task.readout)
    # per sequence position (the app's convention): H_Bayes of the target predicted there,
    # NaN at the value tokens (no target); per target (L keys, then the query) for the figures
    h_seq = np.full(data.seq_len(cfg.L), np.nan)
    h_seq[data.target_positions(cfg.L)] = ho.h_pos
    store.write_static("bayes_entropy", h_seq, ("position",))
    store.write_static("bayes_entropy_target", ho.h_pos, ("target",))
    store.write_static("target_position", data.target_positions(cfg.L), ("target",))
    if cfg.plot_seqs:
        store.write_static("point_entropy", ho.an_h[:cfg.plot_seqs, :cfg.L].reshape(-1), ("point",))
        store.write_static("point_k", np.tile(np.arange(1, cfg.L + 1), cfg.plot_seqs), ("point",))


def _evaluate(model, cfg: BijectionConfig, ho: _Heldout) -> tuple[dict, np.ndarray]:
    """Held-out loss/accuracy and the entropy error in bits; also the per-target model entropy."""
    ev = evaluate(model, ho.tok, ho.tgt, cfg.V, head=cfg.task.head)
    ent = ev.pop("entropy_per_position")
    return {**ev, "entropy_mae_bits": float(np.abs(ent - ho.h_pos).mean() / math.log(2))}, ent


def _keep_geometry(geometry: dict[int, dict], step: int, metrics: dict, acc_query: float | None = None
                   ) -> dict[int, dict]:
    """The first analysed step's geometry numbers and this step's (the last so far), each with its
    phase (:mod:`.bijection_phase`: whether the lookup is learned there)."""
    keep = {k: v for k, v in metrics.items() if mn.is_bijection_manifold(k) and
            k.rsplit("/", 1)[-1] in _GEOMETRY}
    keep["phase"], keep["query_accuracy"] = phase(acc_query), acc_query
    return {k: v for k, v in geometry.items() if k == min(geometry)} | {step: keep}


def _final_geometry(geometry: dict[int, dict]) -> dict | None:
    """Step 0 (untrained) beside the last analysed step; manifold/pos_onehot/* is the baseline."""
    if not geometry:
        return None
    return {"steps": sorted(geometry), **{f"step{k}": v for k, v in geometry.items()}}
