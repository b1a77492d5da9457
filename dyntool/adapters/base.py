"""What every adapter is (:class:`Adapter`), the TransformerLens layout (:class:`BlocksAdapter`) and
the one error an adapter raises (:class:`AdapterError`).  Below the adapters and their package,
so no adapter imports the package that imports it."""
from __future__ import annotations

from ..errors import CaptureError
from ..observe import Observer, Site


class AdapterError(CaptureError):
    """dyntool cannot reach this model's attention (a CaptureError: one line, the reason, the way out)."""


class Adapter:
    name = "?"

    def sites(self) -> list[Site]:
        """Every site that must report on a captured step, in layer order."""
        raise NotImplementedError

    def attach(self, observer: Observer) -> None:
        raise NotImplementedError

    def detach(self) -> None:
        raise NotImplementedError

    def attrs(self) -> dict:
        """Facts stored with a recording (implementation, kv-head map, ...)."""
        return {"adapter": self.name}


class BlocksAdapter(Adapter):
    """TransformerLens layouts (``HookedTransformer`` and ``TransformerBridge``): one attention per
    ``model.blocks[i].attn``, one site each."""

    def __init__(self, model):
        self.model = model
        self.attns = [b.attn for b in model.blocks]
        self._handles: list = []

    def sites(self):
        return [Site(i, id(a), type(a).__name__, name=f"blocks.{i}.attn") for i, a in enumerate(self.attns)]
