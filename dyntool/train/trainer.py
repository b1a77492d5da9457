"""The training loop (nanoGPT's train.py as a class) and its callback seam (minGPT style).

The loop knows nothing about recording or logging: it calls, in list order,

- ``on_train_start(trainer)``, ``on_train_end(final)``;
- ``on_step_start(step)``, then for each micro-step ``micro_step_context(step, micro)`` (a context
  manager entered around that micro-step's forward *and* backward), then
  ``on_step_end(step, metrics)`` (callbacks may add keys; the last one writes them);
- ``on_eval(step, metrics)`` after a validation pass (its keys are also in that step's metrics);
- ``wants_eager(step)``: True makes the step run on the uncompiled model (hooks need eager).

Training: AdamW (decay on 2-D weights) with linear warmup + cosine decay, global-norm clipping,
gradient accumulation (loss / accum), bf16 autocast on CUDA, optional ``torch.compile``, DDP.
Checkpoints hold model, optimizer, scheduler, step and every RNG state (torch, CUDA, numpy, python,
and each rank's data generator), so ``resume`` continues bit for bit (tested on CPU).
"""
from __future__ import annotations

import hashlib
import math
import os
import random
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

import numpy as np
import torch

from ..data.wikitext import eval_batches, get_batch
from ..errors import NonFiniteLossError
from .config import OptimConfig, TrainConfig
from .ddp import DistInfo


class Callback:
    def on_train_start(self, trainer: "Trainer") -> None: ...
    def on_step_start(self, step: int) -> None: ...
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


def amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None (plain float32/float64 training)."""
    if cfg.train.dtype == "bfloat16" or (cfg.train.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


class Trainer:
    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, corpus, dist: DistInfo,
                 callbacks: list[Callback] | None = None, ckpt_path: Path | None = None):
        self.cfg, self.corpus, self.dist = cfg, corpus, dist
        self.device = dist.device
        self.callbacks = list(callbacks or [])
        self.ckpt_path = ckpt_path
        self.raw = model                                   # uncompiled, unwrapped: eval, recording
        self.model = model
        if dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DDP(model, device_ids=ids)
        self.compiled = torch.compile(self.model) if cfg.train.compile else None
        o = cfg.optim
        fused = self.device.type == "cuda"
        self.opt = torch.optim.AdamW(model.param_groups(o.weight_decay), lr=o.lr,
                                     betas=(o.beta1, o.beta2), fused=fused or None)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_factor(o, cfg.train.max_steps))
        self.gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7919 * (dist.rank + 1))
        self.amp = amp_dtype(cfg, self.device)
        self.step = 0                                      # the next step to run
        self.grad_scale = 1.0 / o.accum                    # what each micro-step's loss is scaled by

    # -- pieces ---------------------------------------------------------------------------
    def autocast(self):
        if self.amp is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp)

    def next_batch(self):
        d = self.cfg.data
        return get_batch(self.corpus.train, d.batch_size, d.block_size, self.gen, self.device)

    @torch.no_grad()
    def evaluate(self, split: str = "valid", max_batches: int | None = None) -> float:
        """Mean token cross-entropy over a split (non-overlapping windows; exact when uncapped)."""
        d = self.cfg.data
        total, n = 0.0, 0
        for x, y in eval_batches(self.corpus.split(split), d.eval_batch_size, d.block_size,
                                 max_batches or None, self.device):
            with self.autocast():
                _, loss = self.raw(x, y)
            total += loss.item() * y.numel()
            n += y.numel()
        return total / max(n, 1)

    # -- one optimizer step ---------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        cfg, accum = self.cfg, self.cfg.optim.accum
        eager = self.compiled is None or any(cb.wants_eager(step) for cb in self.callbacks)
        net = self.model if eager else self.compiled
        loss_sum = 0.0
        for micro in range(accum):
            x, y = self.next_batch()
            with ExitStack() as stack:
                if self.dist.world > 1 and micro < accum - 1:
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
        params = self.raw.parameters()
        gn = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        lr = self.opt.param_groups[0]["lr"]
        loss_v = loss_t.item()
        if math.isfinite(loss_v):
            self.opt.step()
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return {"loss": loss_v, "lr": lr, "grad_norm": gn.item()}

    # -- the loop -------------------------------------------------------------------------
    def fit(self) -> dict:
        cfg = self.cfg.train
        stop = min(cfg.stop_at or cfg.max_steps, cfg.max_steps)
        tokens = self.cfg.data.batch_size * self.cfg.data.block_size * self.cfg.optim.accum * self.dist.world
        for cb in self.callbacks:
            cb.on_train_start(self)
        self.raw.train()
        while self.step < stop:
            step = self.step
            t0 = time.perf_counter()
            for cb in self.callbacks:
                cb.on_step_start(step)
            metrics = self.train_step(step)
            dt = time.perf_counter() - t0
            metrics["tokens_per_s"] = tokens / dt
            metrics["step_time"] = dt
            self.step = step + 1
            if not math.isfinite(metrics["loss"]):
                for cb in self.callbacks:
                    cb.on_step_end(step, metrics)
                raise NonFiniteLossError(step, f"loss = {metrics['loss']}")
            last = self.step == cfg.max_steps
            if self.dist.is_main and cfg.eval_interval and (self.step % cfg.eval_interval == 0 or last):
                vl = self.evaluate("valid", self.cfg.data.eval_max_batches)
                ev = {"val_loss": vl, "val_ppl": math.exp(min(vl, 700.0))}
                metrics.update(ev)
                for cb in self.callbacks:
                    cb.on_eval(step, ev)
            for cb in self.callbacks:
                cb.on_step_end(step, metrics)
            if self.ckpt_path is not None and cfg.checkpoint_interval and \
                    self.step % cfg.checkpoint_interval == 0 and self.step < stop:
                self.save_checkpoint(self.ckpt_path)
        if self.ckpt_path is not None:
            self.save_checkpoint(self.ckpt_path)
        final = {"steps": self.step, "param_sha256": self.param_digest()}
        if self.dist.world > 1:                             # proof that the replicas agree
            digests = [None] * self.dist.world
            torch.distributed.all_gather_object(digests, final["param_sha256"])
            final["param_sha256_ranks"] = digests
        if self.dist.is_main and cfg.final_eval and self.step == cfg.max_steps:
            for split in ("valid", "test"):
                loss = self.evaluate(split)
                final[f"{split}_loss"], final[f"{split}_ppl"] = loss, math.exp(min(loss, 700.0))
        for cb in self.callbacks:
            cb.on_train_end(final)
        return final

    def param_digest(self) -> str:
        """sha256 of every parameter's bytes (in state_dict order): equal digests = equal models."""
        h = hashlib.sha256()
        for name, t in self.raw.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        gens = [self.gen.get_state()]
        if self.dist.world > 1:                             # every rank's data order
            gens = [None] * self.dist.world
            torch.distributed.all_gather_object(gens, self.gen.get_state())
        return {"step": self.step, "model": self.raw.state_dict(), "optim": self.opt.state_dict(),
                "sched": self.sched.state_dict(), "data_gen": gens,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                        "python": random.getstate(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}

    def load_state_dict(self, sd: dict) -> None:
        self.raw.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["optim"])
        self.sched.load_state_dict(sd["sched"])
        self.step = int(sd["step"])
        gens = sd["data_gen"]
        if len(gens) != self.dist.world:
            raise ValueError(f"checkpoint was written by {len(gens)} rank(s), resuming on {self.dist.world}")
        self.gen.set_state(gens[self.dist.rank])
        r = sd["rng"]
        torch.set_rng_state(r["torch"])
        np.random.set_state(r["numpy"])
        random.setstate(r["python"])
        if r.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(r["cuda"])

    def save_checkpoint(self, path: Path) -> None:
        sd = self.state_dict()                              # collective under DDP: all ranks call
        if self.dist.is_main:
            tmp = Path(str(path) + ".tmp")
            torch.save(sd, tmp)
            os.replace(tmp, path)                           # never a half-written checkpoint
