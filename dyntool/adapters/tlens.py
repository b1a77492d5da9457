"""TransformerLens: ``HookedTransformer`` (3.x) and ``TransformerBridge`` (3.9+ and 4.x).

HookedTransformer (``transformer_lens.components.AbstractAttention``), per block ``blocks.{l}.attn``:

- q, k: the tensors ``calculate_attention_scores(q, k)`` receives, read by wrapping that method on
  the instance while a Capture is open.  No hook point holds them: ``hook_q``/``hook_k`` fire before
  QK-norm (``use_qk_norm``, OLMo's full-width norm) and ``clip_qkv``, ``hook_rot_q`` before Qwen's
  log-n query scaling (``use_logn_attn``).  k stays per key/value head (grouped-query attention is
  repeated per query head the TransformerLens way, ``repeat_interleave``, like the observer's).
- v: the tensor ``calculate_z_scores(v, pattern)`` receives (after ``clip_qkv``; ``hook_v`` is before).
- scale ``1 / attn.attn_scale`` (``attn_scale``, ``use_attn_scale=False``,
  ``scale_attn_by_inverse_layer_idx`` all live there); ``softcap`` = ``cfg.attn_scores_soft_cap``
  when positive (TransformerLens caps before adding the ALiBi bias and the mask, as dyntool does);
  ``sinks`` = ``attn.sinks`` (``use_attention_sinks``, GPT-OSS); ``bias`` = ALiBi (``attn.alibi``),
  ``position_bias`` and the finite part of ``additive_attention_mask`` (forward keyword arguments,
  read by a forward pre-hook).
- ``hook_attn_scores``: only to read the mask TransformerLens applied (causal, local window,
  padding: −inf there); ``hook_z`` (B, T, nh, d), the per-head output ``W_O`` consumes, gets the
  tensor hook for U.

Everything is computed from the model's own configuration and tensors, never from the scores it
produced, so a score edit dyntool is not told about (a hook on ``hook_attn_scores`` adding a bias,
a patched softmax) fails the capture's self-check instead of being recorded as if it were the model.

TransformerBridge (HF models wrapped with TransformerLens hook names; the only model class of
TransformerLens 4): see :class:`BridgeAdapter`.
"""
from __future__ import annotations

import inspect

import torch

from . import tlens_bridge
from .base import AdapterError, BlocksAdapter

_WRAPPED = ("calculate_attention_scores", "calculate_z_scores")


class TLAdapter(BlocksAdapter):
    name = "tlens"

    def attach(self, observer) -> None:
        for site, a in zip(self.sites(), self.attns):
            if any(n in a.__dict__ for n in _WRAPPED):
                raise AdapterError(f"blocks.{site.layer}.attn: its score/z methods are already wrapped "
                                   "(nested Capture?)")
            box: dict = {}

            def scores_fn(q, k, a=a, box=box):
                box["q"], box["k"] = q, k                   # (B, T, nh, d), (B, Tk, nh_kv, d)
                return type(a).calculate_attention_scores(a, q, k)

            def z_fn(v, pattern, a=a, box=box):
                box["v"] = v
                return type(a).calculate_z_scores(a, v, pattern)

            def pre(mod, args, kwargs, box=box, sig=inspect.signature(a.forward)):
                given = sig.bind_partial(*args, **kwargs).arguments      # positional or keyword
                box["extra"] = [given.get(n) for n in ("position_bias", "additive_attention_mask")]

            def keep_scores(mod, args, out, box=box):
                box["scores"] = out

            def on_z(mod, args, z, box=box, a=a, site=site):
                if torch.compiler.is_compiling() or "q" not in box:
                    return
                q, k, v = (box[n].transpose(1, 2) for n in ("q", "k", "v"))    # (B, h, T, d)
                allowed = torch.isfinite(box["scores"].detach())               # (B, nh, T, Tk)
                observer.observe(site, q, k, v, z, allowed, 1.0 / float(a.attn_scale), heads_dim=2,
                                 **_modifiers(a, q.shape[-2], k.shape[-2], box.get("extra") or ()))
                box.clear()

            a.calculate_attention_scores, a.calculate_z_scores = scores_fn, z_fn   # instance attrs
            self._handles += [a.register_forward_pre_hook(pre, with_kwargs=True),
                              a.hook_attn_scores.register_forward_hook(keep_scores),
                              a.hook_z.register_forward_hook(on_z)]

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for a in self.attns:
            for n in _WRAPPED:
                a.__dict__.pop(n, None)

    def attrs(self):
        cfg = self.model.cfg
        return {"adapter": self.name, "attn_types": list(getattr(cfg, "attn_types", None) or []),
                "window_size": getattr(cfg, "window_size", None),
                "positional_embedding_type": getattr(cfg, "positional_embedding_type", None)}


def _modifiers(a, T: int, Tk: int, extra) -> dict:
    """The score modifiers of one AbstractAttention forward, from its config and arguments."""
    cfg, out = a.cfg, {}
    cap = getattr(cfg, "attn_scores_soft_cap", None)
    if cap is not None and cap > 0:                  # TransformerLens: -1 / 0 / None = off
        out["softcap"] = float(cap)
    if getattr(cfg, "use_attention_sinks", False):
        out["sinks"] = a.sinks
    bias = None
    if cfg.positional_embedding_type == "alibi":
        bias = a.alibi[:, -T:, :Tk]                  # (nh, T, Tk), built on the first forward
    for b in extra:
        if b is not None:
            b = b.masked_fill(~torch.isfinite(b), 0.0)   # −inf entries are masked: in `allowed`
            bias = b if bias is None else bias + b
    if bias is not None:
        out["bias"] = bias
    return out


def detect(model):
    if not type(model).__module__.startswith("transformer_lens"):
        return None
    if tlens_bridge.is_bridge(model):
        return tlens_bridge.detect(model)
    blocks = getattr(model, "blocks", None)
    if not blocks or not all(hasattr(b, "attn") and hasattr(b.attn, "hook_z") for b in blocks):
        return None
    if not all(all(hasattr(b.attn, n) for n in _WRAPPED) for b in blocks):
        return None
    return TLAdapter(model)
