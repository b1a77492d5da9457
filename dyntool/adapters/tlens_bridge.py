"""TransformerLens ``TransformerBridge`` (filled in below)."""
from __future__ import annotations


def is_bridge(model) -> bool:
    return any(c.__name__ == "TransformerBridge" for c in type(model).__mro__)


def detect(model):
    return None
