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
  source, or named with ``Capture(model, attention="CausalSelfAttention")``);
- ``dataflow``: modules that compute their own softmax (BLOOM, MPT, GPT-Neo, Falcon's eager path,
  XGLM, OpenAI-GPT, a manual nanoGPT path), found by what their tensors do
  (:mod:`.dataflow`).

A class named with ``attention=`` goes to the adapter that fits what it does (``_named``).
"""
from __future__ import annotations

import torch

from . import core, dataflow, hf, sdpa, tlens, torch_mha
from .base import Adapter, AdapterError, BlocksAdapter  # noqa: F401  (the package's public names)


def find_adapter(model: torch.nn.Module, attention=None) -> Adapter:
    """The adapter for ``model``; ``attention`` (class name(s) or classes) names the modules to
    record, and the adapter is chosen by what those modules do (:func:`_named`)."""
    if attention is not None:
        return _named(model, attention)
    # checked before any adapter: a model mixing dense and non-dense attention (BigBird-Pegasus: a
    # block-sparse encoder, dense decoder attention through the registry) must not be recorded in part
    # (Reformer's LSH too: it calls no softmax a later adapter could find)
    dataflow.refuse_non_dense(model.named_modules())
    for mod in (core, tlens, hf, torch_mha):
        ad = mod.detect(model)
        if ad is not None:
            return ad
    ad = sdpa.detect(model)
    if ad is not None:
        eager = [m for m in ad.modules if _eager_hf(m) and dataflow.computes_softmax(m)]
        if not eager:
            return ad
        # Falcon-style: the module calls SDPA only under attn_implementation="sdpa"; eager runs its softmax
        return dataflow.DataflowAdapter(model, [(n, m) for n, m in model.named_modules()
                                                if any(m is e for e in eager)])
    ad = dataflow.detect(model)
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


def _eager_hf(m) -> bool:
    cfg = getattr(m, "config", None)
    return type(m).__module__.startswith("transformers.") and getattr(cfg, "_attn_implementation", None) == "eager"


def _named(model, attention) -> Adapter:
    """A user-named class, recorded by the adapter that fits what its forward does (not its name):
    torch's ``nn.MultiheadAttention`` (it, or inside it), the attention registry (it, or a module
    inside it: ``ViTAttention`` holds ``ViTSelfAttention``), an ``F.scaled_dot_product_attention``
    call in its code, else its own softmax (the dataflow adapter)."""
    named = dataflow.candidates(model, attention)
    if not named:
        raise AdapterError(f"no module of class {attention!r} in {type(model).__name__}")
    inside = [(n + ("." if n and c else "") + c, m) for name, top in named
              for c, m in top.named_modules() for n in (name,)]
    mha = [(n, m) for n, m in inside if isinstance(m, torch.nn.MultiheadAttention)]
    if mha:
        return torch_mha.TorchMHAAdapter(model, mha)
    registry = [(n, m) for n, m in inside if hf.uses_registry(m)]
    if registry:
        return hf.HFAdapter(model, registry)
    if any(sdpa.calls_sdpa(m, include_hf=True) and not _eager_hf(m) for _, m in named):
        return sdpa.SDPAAdapter(model, attention)
    return dataflow.DataflowAdapter(model, named)


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
