"""Validation during training: the loss over a split, and the evaluation of the current state.

:func:`evaluate` is the one loop every evaluation uses (periodic, final, the benches): eval mode
(dropout off; train mode restored after) under ``inference_mode`` (``no_grad`` for FSDP),
non-overlapping windows (exact when uncapped), the loss summed on the device and read once at the
end (no sync per batch).
:func:`evaluate_state` is the periodic validation of the model after ``trainer.step`` steps
(step numbers count optimizer steps taken, docs/FORMAT.md): it updates the best so far and the
evaluation time and tokens, and calls the callbacks' ``on_eval``.
"""
from __future__ import annotations

import math
import time

import torch

from ..data.wikitext import eval_batches
from ..progress import progress


def evaluate(trainer, split: str = "valid", max_batches: int | None = None, batch_size: int | None = None,
             bar: bool = False, desc: str | None = None) -> float:
    """Mean token cross-entropy of ``trainer.raw`` over ``split``; ``trainer.last_eval_tokens``
    says how many targets it read."""
    d = trainer.cfg.data
    data = trainer.corpus.split(split)
    bs = batch_size or d.eval_batch_size
    batches = eval_batches(data, bs, d.block_size, max_batches or None, trainer.device)
    if bar:
        n_win = (len(data) - 1) // d.block_size
        total_b = -(-n_win // bs) + (1 if (len(data) - 1) % d.block_size else 0)
        if max_batches:
            total_b = min(total_b, max_batches)
        batches = progress(batches, desc=desc or f"final eval ({split})", total=total_b, unit="batch")
    model = trainer.raw
    was_training = model.training
    model.eval()
    total, n = None, 0
    # FSDP2 allocates its unsharded parameters on the first all-gather: under inference_mode they
    # would be inference tensors that the next training step cannot write (a resumed run evaluates
    # before it trains), so a sharded model evaluates under no_grad
    off = torch.no_grad() if getattr(trainer, "fsdp", False) else torch.inference_mode()
    try:
        with off:
            for x, y in batches:
                with trainer.autocast():
                    _, loss = model(x, y)
                part = loss.double() * y.numel()
                total = part if total is None else total + part
                n += y.numel()
    finally:
        model.train(was_training)
        if bar:
            batches.close()
    trainer.last_eval_tokens = n
    return float(total) / n if n else float("nan")


def evaluate_state(trainer) -> dict:
    """Validation of the model after ``trainer.step`` steps: its metrics (with ``eval_time``), the
    best so far updated, ``on_eval(trainer.step, …)`` called."""
    te = time.perf_counter()
    vl = trainer.evaluate("valid", trainer.cfg.data.eval_max_batches, bar=not trainer.quiet,
                          desc=f"eval (valid) at step {trainer.step}")
    dt = time.perf_counter() - te                  # not in the training rate
    trainer.eval_seconds += dt
    trainer.eval_tokens += trainer.last_eval_tokens
    ev = {"val_loss": vl, "val_ppl": math.exp(min(vl, 700.0))}
    if trainer.best is None or vl < trainer.best["val_loss"]:
        trainer.best = {"val_loss": vl, "val_ppl": ev["val_ppl"], "step": trainer.step}
    for cb in trainer.callbacks:
        cb.on_eval(trainer.step, ev)
    return {**ev, "eval_time": dt}
