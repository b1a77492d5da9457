"""The wind tunnel's training step, eager or compiled (issue 46: the paper preset is launch-bound).

A 6 × 6 × 192 GPT on sequences of 39 tokens, batch 128, is a few hundred small kernels per step:
on a GPU the step time is launch overhead (0.0128 s per step on an H200, eager), not arithmetic.
So there the step runs

* on batches **drawn on the device** (:func:`dyntool.sims.bijection_data.sample` with a generator
  on the model's device: no host→device copy per step), and
* with the forward + loss **compiled** by ``torch.compile(mode="reduce-overhead")``, which replays
  the forward and the backward as CUDA graphs.  Chosen over a hand-captured ``torch.cuda.graph``
  because the same compiled code (inductor, without the graphs) runs on the CPU, so the compiled
  step is tested against the eager one without a GPU (tests/unit/test_bijection_step.py), and
  because a hand capture of the whole step would need a capturable AdamW with a tensor lr, the
  clip and the data drawn inside the graph; here the optimizer, the clip and the sampling stay
  eager (a few fused multi-tensor kernels) and the lr stays a Python float.

``compile = "auto"`` compiles on CUDA only: on the CPU the step is compute-bound and compiling it
did not pay (docs/performance.md, measured with bench/bijection_step.py), so the CPU run stays
the eager one, byte for byte.
"""
from __future__ import annotations

import math

import torch

from ..errors import NonFiniteLossError
from . import bijection_data as data


def lr_at(cfg, step: int) -> float:
    """Linear warm-up over ``cfg.warmup`` steps, then cosine to ``min_lr_frac``·lr at ``cfg.steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def wants_compile(setting: str, dev: torch.device) -> bool:
    """``compile`` = auto | on | off: auto compiles on CUDA only (see the module docstring)."""
    return setting == "on" or (setting == "auto" and dev.type == "cuda")


class Step:
    """``step(i, gen, check)`` -> (loss, lr, grad norm): one AdamW step on a fresh batch from ``gen``
    (drawn on the generator's device) at the scheduled lr, gradients clipped; with ``check`` a
    non-finite loss stops the run before the update (a host sync: the CPU's behaviour).  The loss
    and the norm are tensors, read only on logged steps."""

    def __init__(self, model, opt, cfg, loss_of, compiled: bool = False, backend: str = "inductor"):
        self.model, self.opt, self.cfg, self.compiled = model, opt, cfg, compiled
        self.graphs = compiled and next(model.parameters()).device.type == "cuda"
        if compiled:
            # mode reduce-overhead = CUDA graphs on a GPU; on the CPU it is inductor's default
            # (backend: inductor; a test may trace without code generation, "aot_eager", in seconds)
            self.loss = torch.compile(lambda x, y: loss_of(model, x, y), dynamic=False, backend=backend,
                                      mode="reduce-overhead" if self.graphs and backend == "inductor" else None)
        else:
            self.loss = lambda x, y: loss_of(model, x, y)

    def __call__(self, step: int, gen: torch.Generator, check: bool = True):
        cfg, opt = self.cfg, self.opt
        lr = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = data.sample(cfg.batch_size, cfg.V, cfg.L, gen, cfg.with_replacement)
        if self.graphs:        # a new iteration: the previous replay's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        loss = self.loss(x, y)
        if check and not torch.isfinite(loss):
            raise NonFiniteLossError(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        opt.step()
        if self.graphs:        # no .grad left pointing into graph memory for the eager probe's backward
            opt.zero_grad(set_to_none=True)
        return loss, lr, gnorm
