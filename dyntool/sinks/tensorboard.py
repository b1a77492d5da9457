"""TensorBoard event files, through ``torch.utils.tensorboard`` (needs the ``tensorboard`` package)."""
from __future__ import annotations

import shutil
from pathlib import Path

from ..export import ExportError
from ..extras import need


class TensorBoardSink:
    def __init__(self, logdir: str | Path):
        need("tensorboard", "--to-tensorboard", ExportError)      # torch's writer imports it
        from torch.utils.tensorboard import SummaryWriter   # deferred: an optional extra (tensorboard)
        self.logdir = Path(logdir)
        p, self._created = self.logdir.absolute(), None
        while not p.exists():                   # the top-most directory we create, for cleanup
            self._created, p = p, p.parent
        try:
            self.writer = SummaryWriter(log_dir=str(self.logdir))
        except OSError as e:
            self._cleanup()
            raise ExportError(f"TensorBoard directory {self.logdir} can't be written: {e.strerror or e}") from None

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for tag, v in scalars.items():
            self.writer.add_scalar(tag, v, global_step=int(step))

    def close(self, remove: bool = False) -> None:
        self.writer.close()
        if remove:
            self._cleanup()

    def _cleanup(self) -> None:
        if self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)
