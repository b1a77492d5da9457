"""Hugging Face transformers (5.x) through its attention-function registry.

While a Capture is open, every config of the model gets ``_attn_implementation =
"dyntool_<impl>"``, a registry entry (``AttentionInterface``, plus the matching
``AttentionMaskInterface`` entry so masks are built exactly as for ``<impl>``) that calls the
original function (``sdpa``, ``eager``, ``flash_attention_*``, ...) and then feeds the observer.
On exit the original name is restored: a non-recording step runs the model as you set it up.

What the function sees (``module, query, key, value, attention_mask, scaling=, sliding_window=``):
``query`` (B, nh, T, d) after RoPE / QK-norm, ``key``/``value`` (B, nh_kv, Tk, d) before
``repeat_kv``; it returns ``attn_output`` (B, T, nh, d), the tensor ``o_proj``/``c_proj`` consumes,
which gets the tensor hook for U.  Masks: a 4-D mask (boolean for sdpa, additive for eager) already
holds causal + padding + sliding window; ``None`` means causal (with ``sliding_window`` if given);
flash's 2-D padding mask is combined with causal + window.

With the cheap tier's fused kernel (``record.kernel``, :mod:`dyntool.fused_path`) the entry is
``dyntool_fused`` instead: its mask entry is flash attention's (the 2-D (B, Tk) padding mask, or
None), and the function computes the attention in the kernel for the sites a FlightRecorder armed
(``ARMED``), with causal from the module, ``sliding_window``, ``softcap``, ``s_aux`` (sinks) and
``scaling`` from the keyword arguments; anything else (no grad, an unarmed module) runs the
module's own eager formula on the 4-D mask built from the 2-D one.

Not supported (a clear error): attention dropout while recording (use ``model.eval()`` or 0 dropout),
GPT-2's ``reorder_and_upcast_attn`` under eager (it bypasses the registry).
"""
from __future__ import annotations

import inspect
import sys

import torch

from ..observe import Site, additive_bias, allowed_from
from .base import Adapter, AdapterError

PREFIX = "dyntool_"
_ACTIVE: dict[int, tuple] = {}          # id(attention module) -> (observer, site) while capturing
ARMED: dict[int, object] = {}           # id(attention module) -> fused_path.HFFusedSite: its arm() writes it
FUSED = PREFIX + "fused"


_ROUTES: dict[type, bool] = {}


def uses_registry(m) -> bool:
    """Does this module's forward dispatch through ``ALL_ATTENTION_FUNCTIONS``?  Read from its
    source once per class: it finds every attention transformers routes through the registry
    (decoders, BERT/RoBERTa/ViT encoders, T5/BART self- and cross-attention) without a list."""
    cls = type(m)
    if cls not in _ROUTES:
        try:
            src = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            src = ""
        _ROUTES[cls] = cls.__module__.startswith("transformers.") and "ALL_ATTENTION_FUNCTIONS" in src
    return _ROUTES[cls]


def site_kind(name: str, module) -> tuple[str, str]:
    """``(kind, stack)`` from the module's path and flags: cross-attention reads another sequence."""
    parts = name.lower().split(".")
    cross = bool(getattr(module, "is_cross_attention", False)) or any(
        p in ("encdecattention", "encoder_attn", "crossattention", "cross_attn", "cross_attention") for p in parts)
    stack = "encoder" if "encoder" in parts else "decoder" if "decoder" in parts else ""
    return ("cross" if cross else "self"), stack


def _inner(impl: str, module):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS   # deferred: an optional extra (hf)
    if impl in ALL_ATTENTION_FUNCTIONS and impl != "eager":
        return ALL_ATTENTION_FUNCTIONS[impl]
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise AdapterError(f"{type(module).__name__}: no eager_attention_forward in its module")
    return fn


def _recording_fn(impl: str):
    def attention(module, query, key, value, attention_mask, **kw):
        out, weights = _inner(impl, module)(module, query, key, value, attention_mask, **kw)
        entry = _ACTIVE.get(id(module))
        if entry is not None and not torch.compiler.is_compiling():
            obs, site = entry
            if kw.get("dropout", 0.0):
                raise AdapterError(f"layer {site.layer}: attention dropout p={kw['dropout']} is on while "
                                   "recording; recorded α would not be the one used (model.eval() or 0 dropout)")
            T, Tk = query.shape[-2], key.shape[-2]
            scale = kw.get("scaling") or query.shape[-1] ** -0.5
            mask = attention_mask if torch.is_tensor(attention_mask) else None
            causal = kw.get("is_causal")
            causal = getattr(module, "is_causal", True) if causal is None else causal
            allowed = allowed_from(mask, T, Tk, causal=causal, window=kw.get("sliding_window"), device=query.device)
            # what the softmax adds to τ q·k: T5's relative-position bias, the finite part of a
            # float mask (ALiBi); soft-capping and sinks (gpt-oss s_aux) as the kernels take them
            bias = additive_bias(kw.get("position_bias"), mask, T, Tk)
            obs.observe(site, query, key, value, out, allowed, scale, heads_dim=2, bias=bias,
                        softcap=kw.get("softcap"), sinks=kw.get("s_aux"))
        return out, weights
    attention.__name__ = f"{PREFIX}{impl}"
    return attention


def _fused_attention(module, query, key, value, attention_mask, **kw):
    """The ``dyntool_fused`` entry: the kernel where armed, the module's eager formula elsewhere."""
    entry = _ACTIVE.get(id(module))
    if kw.get("dropout", 0.0) and entry is not None:
        raise AdapterError(f"layer {entry[1].layer}: attention dropout p={kw['dropout']} is on while "
                           "recording; recorded α would not be the one used (model.eval() or 0 dropout)")
    T, Tk = query.shape[-2], key.shape[-2]
    mask = attention_mask if torch.is_tensor(attention_mask) else None           # (B, Tk) or None
    causal = kw.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    run = ARMED.get(id(module))
    out = None if run is None else run(query, key, value, mask, causal, kw)     # (B, T, nh, d)
    allowed = None
    if out is None:
        allowed = allowed_from(mask, T, Tk, causal=causal, window=kw.get("sliding_window"), device=query.device)
        additive = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~allowed, torch.finfo(query.dtype).min)
        out, _ = _inner("eager", module)(module, query, key, value, additive, **kw)
    if entry is not None and not torch.compiler.is_compiling():
        obs, site = entry                   # a Capture alongside (a FlightRecorder skips its fused sites)
        if allowed is None:
            allowed = allowed_from(mask, T, Tk, causal=causal, window=kw.get("sliding_window"), device=query.device)
        obs.observe(site, query, key, value, out, allowed, kw.get("scaling") or query.shape[-1] ** -0.5,
                    heads_dim=2, softcap=kw.get("softcap"), sinks=kw.get("s_aux"))
    return out, None


def _register_fused() -> str:
    # deferred: transformers is an optional extra (hf), asked for only when a model is one of its
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    from transformers.modeling_utils import AttentionInterface
    AttentionInterface.register(FUSED, _fused_attention)
    AttentionMaskInterface.register(FUSED, flash_attention_mask)
    return FUSED


def _register(impl: str) -> str:
    # deferred: an optional extra (hf), as above
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface
    name = PREFIX + impl
    AttentionInterface.register(name, _recording_fn(impl))
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(impl)
    if mask_fn is not None:
        AttentionMaskInterface.register(name, mask_fn)
    return name


def _configs(model) -> list:
    seen, out = set(), []
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_attn_implementation") and id(c) not in seen:
            seen.add(id(c))
            out.append(c)
    return out


class HFAdapter(Adapter):
    name = "hf"

    def __init__(self, model, named):
        self.model = model
        self.names, self.modules = [n for n, _ in named], [m for _, m in named]
        self._saved: list = []
        self.fused = False                  # set by a FlightRecorder with fused sites: dyntool_fused

    def sites(self):
        # registration order = execution order (encoder before decoder, self before cross);
        # layer_idx repeats between an encoder and a decoder, so it cannot order sites
        return [Site(i, id(m), type(m).__name__, *site_kind(n, m), name=n)
                for i, (n, m) in enumerate(zip(self.names, self.modules))]

    def attach(self, observer) -> None:
        for c in _configs(self.model):
            impl = c._attn_implementation or "eager"
            if impl.startswith(PREFIX):
                raise AdapterError("this model is already being recorded (nested Capture)")
            self._saved.append((c, c._attn_implementation))
        for m in self.modules:
            if m.config._attn_implementation == "eager" and getattr(m, "reorder_and_upcast_attn", False):
                raise AdapterError("GPT-2 reorder_and_upcast_attn bypasses the attention registry; turn it off")
        for c, impl in self._saved:
            # the setter recurses into sub-configs; order matters little as we restore all
            c._attn_implementation = _register_fused() if self.fused else _register(impl or "eager")
        for s, m in zip(self.sites(), self.modules):
            _ACTIVE[id(m)] = (observer, s)

    def detach(self) -> None:
        for m in self.modules:
            _ACTIVE.pop(id(m), None)
        for c, impl in reversed(self._saved):
            c._attn_implementation = impl
        self._saved.clear()

    def attrs(self):
        impl = getattr(self.model.config, "_attn_implementation", None) if hasattr(self.model, "config") else None
        cfg = getattr(self.model, "config", None)
        out = {"adapter": self.name, "attn_implementation": self._saved[0][1] if self._saved else impl,
               "model_type": getattr(cfg, "model_type", None)}
        if getattr(cfg, "sliding_window", None):
            out["sliding_window"] = cfg.sliding_window
            out["layer_types"] = list(getattr(cfg, "layer_types", None) or [])
        return out


def detect(model):
    if not any(type(m).__module__.startswith("transformers.") for m in model.modules()):
        return None
    named = [(n, m) for n, m in model.named_modules() if uses_registry(m)]
    if named:
        return HFAdapter(model, named)
    return None
