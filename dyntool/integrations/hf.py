"""A Hugging Face ``TrainerCallback`` that records a probe batch every N optimizer steps.

Usage::

    rec = HFRecorderCallback("runs", probe={"input_ids": ids, "labels": ids}, every=50)
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[rec]).train()

On ``on_step_begin`` of a scheduled step (``state.global_step``, the optimizer step about to run)
the probe batch goes through the unwrapped model in eval mode with a Capture; training gradients
are set aside and restored.  ``on_log`` rows (loss, learning rate, ...) go to ``metrics.jsonl``.
With ``cheap_every=N`` the cheap tier (:mod:`dyntool.flight`) watches the training batches of every
N-th step, from ``on_step_begin`` to ``on_pre_optimizer_step`` (all micro-batches, after the
probe), and its per-head statistics join that step's metrics row.  Its gradients are of the loss
the Trainer backpropagates (divided by the accumulation steps unless the model takes
``num_items_in_batch``).  The run directory is created at ``on_train_begin`` with ``max_steps``
from the Trainer state.  Under DDP only the world-process-zero writes.  Under FSDP2 (a model
sharded at load time, ``from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N))``,
or by ``fully_shard``) every rank runs the probe forward/backward together and records its own
shard of it into the same run (:mod:`dyntool.integrations.ranked`); ``seqs`` must then be the
probe's number of sequences, a multiple of the world size.  The cheap tier watches rank 0's
training batches.
"""
from __future__ import annotations

import torch
from ..extras import need

TrainerCallback = need("transformers", "HFRecorderCallback").TrainerCallback

from .loop import RunRecorder
from .ranked import is_sharded, world_rank


class HFRecorderCallback(TrainerCallback):
    """Record a Hugging Face ``Trainer`` run into a dyntool run directory (kind ``hf-callback``).

    ``out_dir``/``name``: where the run goes (``runs/NAME``; a fresh name when None).
    ``probe``: the batch recorded on scheduled steps, a dict of model keyword arguments with
    ``labels`` (moved to the model's device).  ``every``/``steps``: the full tier's schedule in
    optimizer steps (``state.global_step``); ``seqs``: probe sequences recorded.  ``config``:
    extra keys for the run's ``config.json``; ``tokens``: the probe's words (labels the app's
    matrix axes).  ``record_kw``: any :class:`dyntool.record.policy.RecordConfig` option, e.g.
    ``cheap_every=1`` (per-head statistics of the training batches on every step), ``heads``,
    ``dtype``.  ``path``: the run directory once training has begun.  Example: docs/recording.md,
    "Four short examples"."""

    def __init__(self, out_dir="runs", probe=None, every: int = 50, steps=None, name=None, seqs: int = 1,
                 config: dict | None = None, tokens=None, **record_kw):
        self.kw = dict(out_dir=out_dir, probe=probe, every=every, steps=steps, name=name, seqs=seqs,
                       config=config, tokens=tokens, **record_kw)
        self.rec: RunRecorder | None = None

    def on_train_begin(self, args, state, control, model=None, **kw):
        if not state.is_world_process_zero and not (world_rank()[0] > 1 and is_sharded(model)):
            return
        probe = self.kw["probe"]
        if isinstance(probe, dict):
            dev = next(model.parameters()).device
            self.kw["probe"] = {k: v.to(dev) if torch.is_tensor(v) else v for k, v in probe.items()}
        cfg = {"trainer": {"learning_rate": args.learning_rate, "per_device_train_batch_size":
                           args.per_device_train_batch_size, "seed": args.seed,
                           "gradient_accumulation_steps": args.gradient_accumulation_steps},
               "seed": args.seed, "world_size": args.world_size, **(self.kw.pop("config") or {})}
        self.rec = RunRecorder(model, max_steps=state.max_steps, config=cfg, kind="hf-callback", **self.kw)

    def on_step_begin(self, args, state, control, model=None, **kw):
        if self.rec is not None:
            self.rec.probe_step(state.global_step, model)
            self.rec.cheap_begin(state.global_step)

    def on_pre_optimizer_step(self, args, state, control, **kw):
        if self.rec is not None:
            self.rec.cheap_end(state.global_step)

    def on_log(self, args, state, control, logs=None, **kw):
        if self.rec is not None and logs:
            self.rec.log(max(state.global_step - 1, 0),
                         **{k: v for k, v in logs.items() if isinstance(v, (int, float))})

    def on_train_end(self, args, state, control, **kw):
        if self.rec is not None:
            self.rec.close()

    @property
    def path(self):
        return self.rec.path if self.rec is not None else None
