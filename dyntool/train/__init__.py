"""Training GPTs on WikiText-2 with recording: model (gpt), config, loop (trainer), recording
callbacks (recording), DDP (ddp), studies (studies), and the ``train``/``study`` commands (cli).

``run_training(cfg, out_dir, ...)`` trains one model and returns ``(run_path, final)``.
"""


def __getattr__(name):           # lazy: `import dyntool.train` stays cheap for the CLI
    if name in ("run_training", "load_config"):
        from . import cli
        return getattr(cli, name)
    if name == "TrainConfig":
        from .config import TrainConfig
        return TrainConfig
    raise AttributeError(name)
