"""dyntool's own attention: every :class:`~dyntool.attention.AttentionCore` reports itself."""
from __future__ import annotations

from ..attention import attention_cores
from ..observe import Site
from .base import Adapter


class CoreAdapter(Adapter):
    name = "dyntool"

    def __init__(self, cores):
        self.cores = cores
        self._obs = None

    def sites(self):
        return [c.site() for c in self.cores]

    def attach(self, observer) -> None:
        self._obs = observer
        for c in self.cores:
            c.attach(observer)

    def detach(self) -> None:
        for c in self.cores:
            c.detach(self._obs)
        self._obs = None

    def attrs(self):
        spans = any(c.attend_fn is not None for c in self.cores)
        return {"adapter": self.name, "qk_grads": "applied" if spans else "standard"}


def detect(model):
    cores = attention_cores(model)
    return CoreAdapter(cores) if cores else None
