"""How tools name a recorded layer index: ``L3`` or, when the record says which site it is
(``record.zarr`` attribute ``sites``, written by :class:`dyntool.Capture` for encoder–decoders and
any model with more than one kind of attention), ``L3 · decoder cross``."""
from __future__ import annotations

from .selection import model_head, model_layer


def site_label(attrs: dict | None, layer: int) -> str:
    """``L{layer}`` plus the site's stack and kind when the record has them; ``layer`` is the
    stored index, named by the model layer it holds (a head selection stores some layers only)."""
    name = f"L{model_layer(attrs, layer)}"
    sites = (attrs or {}).get("sites")
    if isinstance(sites, list) and 0 <= layer < len(sites) and isinstance(sites[layer], dict):
        s = sites[layer]
        words = [str(w) for w in (s.get("stack"), s.get("kind")) if isinstance(w, str) and w]
        if words and not (len(sites) and all(isinstance(x, dict) and x.get("kind") == "self" and not x.get("stack")
                                                for x in sites)):
            return f"{name} · {' '.join(words)}"
    return name


def head_label(attrs: dict | None, layer: int, head: int) -> str:
    """``H{head}`` for stored (layer, head) indices, by the model head the slot holds."""
    h = model_head(attrs, layer, head)
    return f"H{h}" if h >= 0 else f"(empty slot {head})"


def site_lines(attrs: dict | None) -> list[str]:
    """One line per site for ``dyntool info``: label, module path, (T, Tk)."""
    sites = (attrs or {}).get("sites")
    if not isinstance(sites, list):
        return []
    out = []
    for i, s in enumerate(sites):
        if isinstance(s, dict):
            out.append(f"{site_label(attrs, i)}  {s.get('name', '')}  ({s.get('label', '')}, "
                       f"T={s.get('T')}, Tk={s.get('Tk')})")
    return out
