"""The training loop (nanoGPT's train.py as a class) and its callback seam (minGPT style).

The loop knows nothing about recording or logging: it calls, in list order,

- ``on_train_start(trainer)``, ``on_train_end(final)``;
- ``on_step_start(step)``, then for each micro-step ``micro_step_context(step, micro)`` (a context
  manager entered around that micro-step's forward *and* backward), then
  ``on_step_end(step, metrics)`` (callbacks may add keys; the last one writes them);
- ``on_eval(step, metrics)`` after a validation of the model after ``step`` steps (its keys are
  also in row ``step``'s metrics; for the state after the last step, which has no training row,
  ``on_final_state(step, metrics)`` follows, and the metrics logger writes a row of its own);
- ``wants_eager(step)``: True makes the step run on the uncompiled model (hooks need eager);
  ``trainer.step_compiled`` then says, during the step, which model it runs on.

Training: AdamW (decay on 2-D weights) with linear warmup + cosine decay, global-norm clipping,
gradient accumulation (loss / accum), bf16 autocast on CUDA, optional ``torch.compile``, DDP.
Checkpoints (:mod:`.checkpoint`, loaded with ``weights_only=True``) hold model, optimizer,
scheduler, step and every RNG state (torch, numpy, python, and each rank's data generator and
CUDA state), so ``resume`` continues bit for bit (tested on CPU; on CUDA with
``train.deterministic``).  They are written every ``train.checkpoint_every`` steps, at the end,
and when SIGTERM/SIGINT stops the run (each step runs in a :func:`critical_section`, so the
checkpoint is at the step reached).  Best validation loss (and its step) is tracked.  The loop
makes one host sync per step (loss and grad norm read together).
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

import torch

from ..data.wikitext import get_batch
from ..errors import NonFiniteLossError
from ..run_writer import critical_section
from . import checkpoint as ckpt, final_eval, fsdp
from .config import OptimConfig, TrainConfig
from .ddp import DistInfo
from .evaluation import evaluate, evaluate_state


class Callback:
    def on_train_start(self, trainer: "Trainer") -> None: ...
    def on_step_start(self, step: int) -> None: ...
    def on_gradients(self, step: int, params: list, norms: torch.Tensor) -> None:
        """After the last micro-step, before clipping: ``norms`` (n,) are the L2 norms of
        ``params``' gradients, on the device (the pass clipping uses; no sync of its own)."""

    def micro_step_context(self, step: int, micro: int):
        return nullcontext()
    def wants_eager(self, step: int) -> bool:
        return False
    def on_step_end(self, step: int, metrics: dict) -> None: ...
    def on_eval(self, step: int, metrics: dict) -> None: ...
    def on_train_end(self, final: dict) -> None: ...


def lr_factor(opt: OptimConfig, max_steps: int):
    """Multiplier of the peak lr at ``step``: linear warmup, then cosine to ``min_lr_ratio``."""
    def f(step: int) -> float:
        if step < opt.warmup_steps:
            return (step + 1) / (opt.warmup_steps + 1)
        span = max(1, max_steps - opt.warmup_steps)
        t = min(1.0, (step - opt.warmup_steps) / span)
        return opt.min_lr_ratio + 0.5 * (1 - opt.min_lr_ratio) * (1 + math.cos(math.pi * t))
    return f


def set_deterministic(on: bool) -> dict:
    """``train.deterministic``: deterministic kernels everywhere (exact resume on CUDA).  Sets
    ``CUBLAS_WORKSPACE_CONFIG`` (cuBLAS needs it before its first call), cuDNN deterministic and
    no autotuning, ``torch.use_deterministic_algorithms``.  Returns the previous settings for
    :func:`restore_deterministic`."""
    prev = {"algos": torch.are_deterministic_algorithms_enabled(),
            "cudnn_det": torch.backends.cudnn.deterministic, "cudnn_bench": torch.backends.cudnn.benchmark,
            "env": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return prev


def restore_deterministic(prev: dict) -> None:
    torch.use_deterministic_algorithms(prev["algos"])
    torch.backends.cudnn.deterministic = prev["cudnn_det"]
    torch.backends.cudnn.benchmark = prev["cudnn_bench"]
    if prev["env"] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = prev["env"]


def amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None (plain float32/float64 training)."""
    if cfg.train.dtype == "bfloat16" or (cfg.train.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """(n,) L2 norms, one fused ``_foreach_norm`` per dtype (it takes one dtype at a time), in order."""
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, g in enumerate(grads):
        by_dtype.setdefault(g.dtype, []).append(i)
    if len(by_dtype) == 1:
        return torch.stack(torch._foreach_norm(grads, 2.0))
    out: list = [None] * len(grads)
    for idx in by_dtype.values():
        for i, n in zip(idx, torch._foreach_norm([grads[i] for i in idx], 2.0)):
            out[i] = n
    return torch.stack(out)                   # promoted to the widest dtype, as clip_grad_norm_ does


class Trainer:
    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, corpus, dist: DistInfo,
                 callbacks: list[Callback] | None = None, ckpt_path: Path | None = None):
        self.cfg, self.corpus, self.dist = cfg, corpus, dist
        self.device = dist.device
        self.callbacks = list(callbacks or [])
        self.ckpt_path = ckpt_path
        self.raw = model                                   # uncompiled, unwrapped: eval, recording
        self.model = model
        self.fsdp = dist.world > 1 and cfg.train.parallel == "fsdp"
        if self.fsdp:                                      # FSDP2: sharded in place (fsdp.py)
            fsdp.shard(model)
        elif dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DDP(model, device_ids=ids)
        self.compiled = torch.compile(self.model) if cfg.train.compile else None
        self.step_compiled = False
        o = cfg.optim
        fused = self.device.type == "cuda"
        self.opt = torch.optim.AdamW(model.param_groups(o.weight_decay), lr=o.lr,
                                     betas=(o.beta1, o.beta2), fused=fused or None)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_factor(o, cfg.train.max_steps))
        # FSDP: every rank draws the same global batch and trains on its own rows (fsdp.py)
        data_rank = 0 if self.fsdp else dist.rank
        self.gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7919 * (data_rank + 1))
        self.amp = amp_dtype(cfg, self.device)
        self.step = 0                                      # the next step to run
        self.best: dict | None = None                      # best periodic validation so far
        self._consistent = True                            # model/optimizer/RNG describe self.step
        self.quiet = True                                  # final-eval announcement and bar
        self.grad_scale = 1.0 / o.accum                    # what each micro-step's loss is scaled by
        self.train_seconds = 0.0                           # optimizer steps only (this process)
        self.eval_seconds = 0.0                            # periodic validation
        self.eval_tokens = 0                               # targets it read (the final eval's estimate)
        self.steps_run = 0                                 # steps timed in train_seconds
        self.last_eval_tokens = 0                          # targets read by the last evaluate()
        self._ahead = None                                 # (generator state before it, batch drawn ahead)

    # -- pieces ---------------------------------------------------------------------------
    def autocast(self):
        if self.amp is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp)

    def next_batch(self):
        """This micro-step's batch: the one drawn ahead during the previous micro-step (its copy to
        the GPU overlapped that step's compute), then the next one drawn.  The draws come in the
        same order as without prefetching; a checkpoint keeps the generator state from before the
        batch drawn ahead (:meth:`state_dict`), so a resumed run draws that batch again."""
        if self._ahead is None:
            self._ahead = (self.gen.get_state(), self._draw())
        batch = self._ahead[1]
        self._ahead = (self.gen.get_state(), self._draw())
        return batch

    def _draw(self):
        d = self.cfg.data
        if self.fsdp:
            x, y = get_batch(self.corpus.train, d.batch_size * self.dist.world, d.block_size, self.gen,
                             self.device)
            rows = slice(self.dist.rank * d.batch_size, (self.dist.rank + 1) * d.batch_size)
            return x[rows], y[rows]
        return get_batch(self.corpus.train, d.batch_size, d.block_size, self.gen, self.device)

    def evaluate(self, split: str = "valid", max_batches: int | None = None, batch_size: int | None = None,
                 bar: bool = False, desc: str | None = None) -> float:
        """Mean token cross-entropy over a split (:func:`.evaluation.evaluate`)."""
        return evaluate(self, split, max_batches, batch_size, bar, desc)

    # -- one optimizer step ---------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        cfg, accum = self.cfg, self.cfg.optim.accum
        eager = self.compiled is None or any(cb.wants_eager(step) for cb in self.callbacks)
        self.step_compiled = not eager                      # callbacks read it (recording.py)
        net = self.model if eager else self.compiled
        loss_sum = 0.0
        for micro in range(accum):
            x, y = self.next_batch()
            with ExitStack() as stack:
                if self.fsdp:                                       # reduce-scatter once per step
                    self.model.set_requires_gradient_sync(micro == accum - 1)
                elif self.dist.world > 1 and micro < accum - 1:
                    stack.enter_context(self.model.no_sync())      # all-reduce once per step
                for cb in self.callbacks:
                    stack.enter_context(cb.micro_step_context(step, micro))
                with self.autocast():
                    _, loss = net(x, y)
                (loss * self.grad_scale).backward()
            ld = loss.detach()
            loss_sum = loss_sum + (ld if ld.dtype == torch.float64 else ld.float())   # no sync per micro
        loss_t = loss_sum / accum
        if self.dist.world > 1:                             # every rank sees the same (mean) loss
            torch.distributed.all_reduce(loss_t)
            loss_t /= self.dist.world
        clip = cfg.optim.grad_clip
        if self.fsdp:
            gn = fsdp.total_norm(torch.nn.utils.clip_grad_norm_(self.raw.parameters(),
                                                                clip if clip > 0 else float("inf")))
        else:
            gn = self._clip(step, clip if clip > 0 else float("inf"))
        lr = self.opt.param_groups[0]["lr"]
        # the optimizer is launched before the step's one host sync (loss and grad norm together), so
        # the GPU never waits for the host; a non-finite loss stops the run right after (fit), and a
        # model stepped on it is never checkpointed
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        loss_v, gn_v = torch.stack([loss_t.detach().double(), gn.detach().double()]).tolist()
        return {"loss": loss_v, "lr": lr, "grad_norm": gn_v}

    @torch.no_grad()
    def _clip(self, step: int, max_norm: float) -> torch.Tensor:
        """``clip_grad_norm_`` (the same arithmetic: one fused norm pass, total norm, coefficient
        clamped to 1, in-place scale) whose per-parameter norms are handed to the callbacks first,
        so per-group norms come from this pass instead of a second one."""
        params = [p for p in self.raw.parameters() if p.grad is not None]
        if not params:
            return torch.zeros((), device=self.device)
        grads = [p.grad for p in params]
        norms = _norms(grads)                                                       # (n,)
        for cb in self.callbacks:                   # callbacks may duck-type the base class
            hook = getattr(cb, "on_gradients", None)
            if hook is not None:
                hook(step, params, norms)
        total = torch.linalg.vector_norm(norms, 2.0)
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_(grads, coef.to(grads[0].device))
        return total

    # -- the loop -------------------------------------------------------------------------
    def _evaluate_state(self) -> dict:
        return evaluate_state(self)

    def _wants_eval(self) -> bool:
        return (self.dist.is_main or self.fsdp) and bool(self.cfg.train.eval_every)

    def _one_step(self, stop: int, tokens: int) -> None:
        """Train step ``self.step`` with its evaluation, callbacks and periodic checkpoint.

        Step numbers count optimizer steps taken (docs/FORMAT.md): the validation of the model
        after s steps runs before update s and goes into row s, with that update's training loss
        (which the same model gave); the state after the last step is evaluated by :meth:`fit`."""
        cfg = self.cfg.train
        step = self.step
        ev = self._evaluate_state() if self._wants_eval() and step and step % cfg.eval_every == 0 else None
        t0 = time.perf_counter()
        for cb in self.callbacks:
            cb.on_step_start(step)
        metrics = self.train_step(step)
        dt = time.perf_counter() - t0
        metrics["tokens_per_s"] = tokens / dt
        metrics["step_time"] = dt
        self.step = step + 1
        if not math.isfinite(metrics["loss"]):
            self._consistent = False                 # no checkpoint of a diverged model
            for cb in self.callbacks:
                cb.on_step_end(step, metrics)
            raise NonFiniteLossError(step, f"loss = {metrics['loss']}")
        self.train_seconds += dt
        self.steps_run += 1
        if ev is not None:
            metrics.update(ev)
        for cb in self.callbacks:
            cb.on_step_end(step, metrics)
        if self.ckpt_path is not None and cfg.checkpoint_every and \
                self.step % cfg.checkpoint_every == 0 and self.step < stop:
            self.save_checkpoint(self.ckpt_path)

    def fit(self) -> dict:
        cfg = self.cfg.train
        stop = min(cfg.stop_at or cfg.max_steps, cfg.max_steps)
        tokens = self.cfg.data.batch_size * self.cfg.data.block_size * self.cfg.optim.accum * self.dist.world
        for cb in self.callbacks:
            cb.on_train_start(self)
        self.raw.train()
        try:
            while self.step < stop:
                # a SIGTERM/SIGINT lands between steps: the checkpoint below is at the step reached
                with critical_section():
                    self._consistent = False
                    self._one_step(stop, tokens)
                    self._consistent = True
        except KeyboardInterrupt:
            # single process only: under DDP the ranks could be at different steps
            if self._consistent and self.ckpt_path is not None and self.dist.world == 1:
                self.save_checkpoint(self.ckpt_path)
            raise
        if self.ckpt_path is not None:
            self.save_checkpoint(self.ckpt_path)
        if self._wants_eval() and self.step == cfg.max_steps:     # the last state: its own row
            ev = self._evaluate_state()
            for cb in self.callbacks:
                getattr(cb, "on_final_state", lambda step, metrics: None)(self.step, ev)
        final = {"steps": self.step, "param_sha256": self.param_digest(),
                 "train_seconds": round(self.train_seconds, 3), "eval_seconds": round(self.eval_seconds, 3)}
        if self.best is not None:
            final.update(best_val_loss=self.best["val_loss"], best_val_ppl=self.best["val_ppl"],
                         best_val_step=self.best["step"])
        if self.dist.world > 1 and not self.fsdp:           # proof that DDP's replicas agree (FSDP's
            # ranks hold shards: param_sha256 is already the gathered whole, rank 0's)
            digests = [None] * self.dist.world
            torch.distributed.all_gather_object(digests, final["param_sha256"])
            final["param_sha256_ranks"] = digests
        for cb in self.callbacks:                           # e.g. the step bar closes before the final eval
            getattr(cb, "on_steps_done", lambda: None)()
        if (self.dist.is_main or self.fsdp) and cfg.final_eval != "off" and self.step == cfg.max_steps:
            final.update(self.final_evaluation())
        for cb in self.callbacks:
            cb.on_train_end(final)
        return final

    def final_evaluation(self) -> dict:
        """The end-of-run evaluation as ``train.final_eval`` says (:mod:`.final_eval`)."""
        return final_eval.run(self)

    def final_eval_batch(self) -> int:
        return final_eval.batch_size(self.cfg)

    def param_digest(self) -> str:
        """sha256 of every parameter's bytes (in state_dict order): equal digests = equal models."""
        if self.fsdp:
            return fsdp.digest(self.raw)                          # collective: the full parameters
        h = hashlib.sha256()
        for name, t in self.raw.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    # -- checkpoints ----------------------------------------------------------------------
    def _gather(self, obj):
        if self.dist.world == 1:
            return [obj]
        out = [None] * self.dist.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def state_dict(self) -> dict:
        """Plain tensors/numbers only (``weights_only`` loadable); collective under DDP."""
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        if self.fsdp:                                      # full tensors, keyed by name (fsdp.py)
            model_sd, optim_sd = fsdp.full_state(self.raw, self.opt)
        else:
            model_sd, optim_sd = self.raw.state_dict(), self.opt.state_dict()
        return {"step": self.step, "model": model_sd, "optim": optim_sd,
                "sched": self.sched.state_dict(), "data_gen": self._gather(self._gen_state()),
                "rng": {**ckpt.capture_rng(), "cuda": self._gather(cuda)},
                "best": dict(self.best) if self.best else None}

    def _gen_state(self) -> torch.Tensor:
        """The data generator's state as if no batch had been drawn ahead (see :meth:`next_batch`)."""
        return self._ahead[0] if self._ahead is not None else self.gen.get_state()

    def load_state_dict(self, sd: dict) -> None:
        gens = sd["data_gen"]
        if len(gens) != self.dist.world:
            raise ValueError(f"checkpoint was written by {len(gens)} rank(s), resuming on {self.dist.world}")
        if self.fsdp:
            fsdp.load_full_state(self.raw, self.opt, sd["model"], sd["optim"])
        else:
            self.raw.load_state_dict(sd["model"])
            self.opt.load_state_dict(sd["optim"])
        self.sched.load_state_dict(sd["sched"])
        self.step = int(sd["step"])
        # the lr of the next step under *this* config's schedule (max_steps may have been raised;
        # unchanged, this is bitwise the value the scheduler stored)
        for g, base in zip(self.opt.param_groups, self.sched.base_lrs):
            g["lr"] = base * self.sched.lr_lambdas[0](self.step)
        self.gen.set_state(gens[self.dist.rank])
        self._ahead = None
        r = sd["rng"]
        ckpt.restore_rng(r)
        cuda = r.get("cuda") or []
        if self.device.type == "cuda" and len(cuda) > self.dist.rank and cuda[self.dist.rank] is not None:
            torch.cuda.set_rng_state(cuda[self.dist.rank], self.device)     # this rank's own state
        self.best = sd.get("best")

    def save_checkpoint(self, path: Path) -> None:
        sd = self.state_dict()                              # collective under DDP: all ranks call
        if self.dist.is_main:
            ckpt.save(sd, path)                             # atomic: never a half-written checkpoint
