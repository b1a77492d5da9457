"""A PyTorch Lightning ``Callback`` that records a probe batch every N optimizer steps.

Usage::

    trainer = L.Trainer(callbacks=[LightningRecorder("runs", probe=probe, every=50)], ...)

``probe`` goes through ``loss_fn(pl_module, probe)`` (default: the LightningModule's
``training_step(probe, 0)``, which must return the loss or a dict with ``"loss"``), in eval mode,
with training gradients set aside and restored, at the first micro-batch of each scheduled
optimizer step (``trainer.global_step``).  Logged metrics (``trainer.callback_metrics``) are
written at every optimizer step.  With ``cheap_every=N`` the cheap tier (:mod:`dyntool.flight`)
watches the training micro-batches of every N-th step, from the first one's start to
``on_before_optimizer_step``, and its per-head statistics join that step's row.  Only global
rank 0 writes.
"""
from __future__ import annotations

import torch

from ..extras import MissingExtra, need

try:
    pl = need("lightning.pytorch", "LightningRecorder")
except MissingExtra as missing:         # the standalone package name, else the one-line hint
    try:
        import pytorch_lightning as pl
    except ImportError:
        raise missing from None

from .loop import RunRecorder


def training_step_loss(module, batch):
    out = module.training_step(batch, 0)
    return out["loss"] if isinstance(out, dict) else out


class LightningRecorder(pl.Callback):
    def __init__(self, out_dir="runs", probe=None, every: int = 50, steps=None, name=None, seqs: int = 1,
                 loss_fn=training_step_loss, config: dict | None = None, tokens=None, **record_kw):
        self.kw = dict(out_dir=out_dir, probe=probe, every=every, steps=steps, name=name, seqs=seqs,
                       loss_fn=loss_fn, config=config, tokens=tokens, **record_kw)
        self.rec: RunRecorder | None = None
        self._last = -1

    def on_train_start(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        probe = self.kw["probe"]
        if probe is not None:
            probe = pl_module.transfer_batch_to_device(probe, pl_module.device, 0)
        max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else \
            int(trainer.estimated_stepping_batches)
        self.rec = RunRecorder(pl_module, max_steps=max_steps, kind="lightning", **{**self.kw, "probe": probe})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step
        if self.rec is not None and step != self._last:      # first micro-batch of the step
            self._last = step
            self.rec.probe_step(step, pl_module)
            self.rec.cheap_begin(step)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.rec is not None:
            self.rec.cheap_end(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.rec is None:
            return
        m = {k: float(v) for k, v in trainer.callback_metrics.items()
             if torch.is_tensor(v) and v.numel() == 1}
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if torch.is_tensor(loss):
            m.setdefault("loss", float(loss))
        self.rec.log(trainer.global_step - 1 if trainer.global_step else 0, **m)

    def on_train_end(self, trainer, pl_module):
        if self.rec is not None:
            self.rec.close()

    @property
    def path(self):
        return self.rec.path if self.rec is not None else None
