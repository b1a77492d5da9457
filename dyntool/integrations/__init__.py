"""Record any model while it trains, into a dyntool run directory (``dyntool ls/info/app`` work).

- :class:`RunRecorder` (``loop.py``): a plain training loop, record every N steps / a schedule,
  on a fixed probe batch or on the training batch;
- :class:`HFRecorderCallback` (``hf.py``): a Hugging Face ``TrainerCallback`` (probe batch);
- :class:`LightningRecorder` (``lightning.py``): a PyTorch Lightning ``Callback`` (probe batch).

All three write from rank 0 only under DDP (the others do nothing) and find the model's
attention through :class:`dyntool.Capture`'s adapters.
"""
from .loop import RunRecorder

__all__ = ["RunRecorder", "HFRecorderCallback", "LightningRecorder"]


def __getattr__(name):          # the framework callbacks import their framework only when asked
    if name == "HFRecorderCallback":
        from .hf import HFRecorderCallback  # deferred: an optional extra (transformers: hf.py imports it)
        return HFRecorderCallback
    if name == "LightningRecorder":
        from .lightning import LightningRecorder  # deferred: an optional extra (lightning)
        return LightningRecorder
    raise AttributeError(name)
