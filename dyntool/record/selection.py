"""Which attention heads the full tier records: ``record.heads`` selectors and the stored layout.

``record.heads`` is ``all`` (the default) or comma-separated selectors ``L{layer}H{head}`` where
either number may be ``*``: ``L0H3`` (one head), ``L5H*`` (every head of layer 5), ``L*H0`` (head 0
of every layer).  :func:`parse_heads` checks the syntax (no model needed); :func:`resolve` checks
the numbers against the model and gives a :class:`Selection`.

Stored layout (a selection is any set of (layer, head) pairs, not a product, and a (layer, head)
grid of the product would store heads nobody asked for): the ``layer`` axis indexes the selected
layers in order, the ``head`` axis the *slots* of each layer's selected heads in order, as many
slots as the layer with the most selected heads.  A layer with fewer heads leaves its last slots
empty (stored as padding: 0 in α/B/A/∂L/∂S, NaN elsewhere, as padded encoder–decoder sites are).
The record's attributes say what each index means: ``layers`` (the model layer of each layer
index) and ``heads`` (per layer index, the model head of each slot, −1 for an empty slot).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

ALL = "all"
KEY = "record.heads"
_SELECTOR = re.compile(r"L(\d+|\*)H(\d+|\*)")


def parse_heads(spec: str, key: str = KEY) -> list[tuple[int | None, int | None]] | None:
    """``"L0H3,L5H*"`` → ``[(0, 3), (5, None)]`` (None = every); ``"all"`` → None (everything).
    An unknown selector or an empty selection is a :class:`ConfigError` (one line)."""
    spec = spec.strip()
    if spec.lower() == ALL:
        return None
    parts = [p.strip() for p in spec.split(",")]
    if not any(parts):
        raise ConfigError(key, "empty head selection; give selectors like L0H3,L5H* or 'all'")
    out = []
    for p in parts:
        m = _SELECTOR.fullmatch(p)
        if m is None:
            raise ConfigError(key, f"unknown head selector {p!r}; expected L<layer>H<head> with numbers "
                                   "or * (e.g. L0H3, L5H*, L*H0), comma-separated, or 'all'")
        out.append(tuple(None if g == "*" else int(g) for g in m.groups()))
    return out


@dataclass(frozen=True)
class Selection:
    """The resolved selection: ``layers`` (model layers, in order) and, per selected layer, its
    selected heads in order; ``slots`` = the length of the stored ``head`` axis."""
    layers: tuple[int, ...]
    heads: tuple[tuple[int, ...], ...]
    n_layer: int
    n_head: int

    @property
    def slots(self) -> int:
        return max(len(h) for h in self.heads)

    @property
    def everything(self) -> bool:
        return len(self.layers) == self.n_layer and all(len(h) == self.n_head for h in self.heads)

    def attrs(self) -> dict:
        """What each stored (layer, head) index means; −1 marks an empty slot."""
        return {"layers": list(self.layers),
                "heads": [list(h) + [-1] * (self.slots - len(h)) for h in self.heads]}


def resolve(spec: str, n_layer: int, n_head: int, key: str = KEY) -> Selection:
    """The selectors of ``spec`` against a model of ``n_layer`` layers × ``n_head`` heads; a layer
    or head out of range is a :class:`ConfigError` naming it."""
    sel = parse_heads(spec, key)
    if sel is None:
        return Selection(tuple(range(n_layer)), (tuple(range(n_head)),) * n_layer, n_layer, n_head)
    picked: dict[int, set[int]] = {}
    for layer, head in sel:
        if layer is not None and layer >= n_layer:
            raise ConfigError(key, f"L{layer}: the model has layers 0..{n_layer - 1}")
        if head is not None and head >= n_head:
            raise ConfigError(key, f"H{head}: the model has heads 0..{n_head - 1}")
        for l in (range(n_layer) if layer is None else (layer,)):
            picked.setdefault(l, set()).update(range(n_head) if head is None else (head,))
    layers = tuple(sorted(picked))
    return Selection(layers, tuple(tuple(sorted(picked[l])) for l in layers), n_layer, n_head)


def model_layer(attrs: dict | None, index: int) -> int:
    """The model layer that stored layer index ``index`` holds (itself without a selection)."""
    layers = (attrs or {}).get("layers")
    if isinstance(layers, list) and 0 <= index < len(layers) and isinstance(layers[index], int):
        return layers[index]
    return index


def model_head(attrs: dict | None, index: int, slot: int) -> int:
    """The model head in slot ``slot`` of stored layer ``index`` (−1: an empty slot)."""
    heads = (attrs or {}).get("heads")
    if isinstance(heads, list) and 0 <= index < len(heads) and isinstance(heads[index], list) \
            and 0 <= slot < len(heads[index]) and isinstance(heads[index][slot], int):
        return heads[index][slot]
    return slot
