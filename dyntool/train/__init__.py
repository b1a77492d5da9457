"""Training GPTs on WikiText-2 with recording: model (gpt), config, loop (trainer), recording
callbacks (recording), DDP (ddp), studies (studies); the ``train``/``study`` commands are in ``dyntool/cli/train.py``.

``run_training(cfg, out_dir, ...)`` trains one model and returns ``(run_path, final)``.
"""


def __getattr__(name):           # lazy: `import dyntool.train` stays cheap for the CLI
    if name in ("run_training", "load_config"):
        from . import runner  # deferred: keeps torch off `import dyntool.train`
        return getattr(runner, name)
    if name == "TrainConfig":
        from .config import TrainConfig  # deferred: as runner
        return TrainConfig
    raise AttributeError(name)
