"""Adapters: how :class:`dyntool.Capture` reaches the attention of a model it did not build.

Each adapter finds the attention layers of one family of models and, while a Capture is open,
makes them call the observer contract of :mod:`dyntool.observe`; on exit everything is put back,
so a non-recording step runs the model exactly as before.  ``find_adapter`` tries, in order:

- ``core``: dyntool's own :class:`~dyntool.attention.AttentionCore` modules;
- ``tlens``: TransformerLens ``HookedTransformer`` and ``TransformerBridge`` (hook points); tried
  before ``hf`` because a bridge holds Hugging Face modules whose attention it recomputes itself;
- ``hf``: Hugging Face transformers models (attention-function registry, any implementation);
- ``torch_mha``: torch's ``nn.MultiheadAttention`` (alone or in ``nn.Transformer*`` layers);
- ``sdpa``: nanoGPT-style modules calling ``F.scaled_dot_product_attention`` (found by their
  source, or named with ``Capture(model, attention="CausalSelfAttention")``).
"""
from __future__ import annotations

import torch

from .base import Adapter, AdapterError, BlocksAdapter  # noqa: F401  (the package's public names)


def find_adapter(model: torch.nn.Module, attention=None) -> Adapter:
    """The adapter for ``model``; ``attention`` (class name(s) or classes) forces the SDPA one."""
    from . import core, hf, sdpa, tlens, torch_mha
    if attention is not None:
        return sdpa.SDPAAdapter(model, attention)
    for mod in (core, tlens, hf, torch_mha, sdpa):
        ad = mod.detect(model)
        if ad is not None:
            return ad
    unreachable = _attention_like(model)
    if unreachable:
        names = ", ".join(sorted(unreachable))
        raise AdapterError(
            f"{type(model).__name__}: refused: its attention ({names}) computes the attention weights itself "
            "(it neither dispatches through transformers' attention registry nor calls "
            "F.scaled_dot_product_attention), so dyntool cannot see its scores; a module whose own code "
            "calls F.scaled_dot_product_attention can be named: Capture(model, attention='ClassName')")
    raise AdapterError(
        f"no attention found in {type(model).__name__} that dyntool can record: supported are dyntool's "
        "own modules, Hugging Face transformers models, TransformerLens HookedTransformer/TransformerBridge, "
        "torch's nn.MultiheadAttention, and modules "
        "calling F.scaled_dot_product_attention (name them: Capture(model, attention='ClassName'))")


def _attention_like(model) -> set[str]:
    """Class names of innermost modules that look like attention (``*Attention`` with projection
    weights), for the refusal message of a model dyntool cannot reach."""
    out = set()
    for m in model.modules():
        name = type(m).__name__
        if name.endswith(("Attention", "SelfAttention", "Attn")) and not any(
                type(c).__name__.endswith(("Attention", "Attn")) for c in m.children()):
            if any(isinstance(c, torch.nn.Linear) for c in m.children()):
                out.add(name)
    return out
