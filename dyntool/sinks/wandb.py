"""Weights & Biases, optional: only imported when asked for; honours WANDB_MODE (e.g. offline)."""
from __future__ import annotations

from ..export import ExportError
from ..extras import need


class WandbSink:
    def __init__(self, project: str, run=None, **init_kwargs):
        wandb = need("wandb", "--to-wandb", ExportError)
        kw = {"project": project, **init_kwargs}
        if run is not None:                       # a dyntool run: its id, config and kind travel along
            kw.setdefault("name", run.id)
            kw.setdefault("config", run.config)
            kw.setdefault("tags", [run.kind])
        try:
            self.run = wandb.init(**kw)
        except Exception as e:                    # no login, no network, a refused project name
            why = " ".join(str(e).split())[:200] or type(e).__name__
            raise ExportError(f"W&B run in project {project!r} could not start ({type(e).__name__}: {why}); "
                              "log in with `wandb login`, or set WANDB_MODE=offline") from None

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(dict(scalars), step=int(step))

    def close(self, remove: bool = False) -> None:
        self.run.finish()
