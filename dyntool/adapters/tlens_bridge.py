"""TransformerLens ``TransformerBridge``: a Hugging Face model wrapped with TransformerLens hook names.

TransformerBridge is the only model class of TransformerLens 4 (``HookedTransformer`` was removed)
and already ships in 3.9.  It does *not* run the Hugging Face attention: each ``blocks.{l}.attn``
(an ``AttentionBridge``) takes the HF module's projections and recomputes the attention itself
(RoPE, GQA, soft-capping, sinks, mask, softmax), so Hugging Face's attention-function registry
(dyntool's ``hf`` adapter) never sees a call.  This adapter reads the bridge's own hook points
with plain PyTorch forward hooks (the raw tensors, not TransformerLens's reshaped views):

- q, k: the *last* of ``q.hook_out`` / ``hook_rot_q`` / ``hook_q_normed`` (k likewise) to fire
  before ``hook_attn_scores``, i.e. after projection, QK-norm and RoPE in whichever order the
  architecture applies them; v: ``v.hook_out``;
- ``hook_attn_scores``: only for the mask (masked entries are −inf or the dtype's minimum);
- the per-head output: ``o.hook_in`` (B, T, nh·d), handed on as a (B, T, nh, d) view that the
  output projection consumes, so the tensor hook for U sees per-head gradients;
- scale: the HF module's ``scaling`` (``head_dim^-½`` for fused-QKV bridges such as GPT-2's, over
  ``layer + 1`` with ``scale_attn_by_inverse_layer_idx``), ``softcap``: its
  ``attn_logit_softcapping``, ``sinks``: its ``sinks`` (GPT-OSS).

Anything else a bridge variant does to the scores (or an attention it delegates to Hugging Face
unchanged, where ``hook_attn_scores`` carries the pattern) fails the capture's self-check: refused
with a one-line reason, never recorded wrong.
"""
from __future__ import annotations

import torch

from .base import AdapterError, BlocksAdapter

_Q = ("q.hook_out", "hook_q_normed", "hook_rot_q")
_K = ("k.hook_out", "hook_k_normed", "hook_rot_k")


def is_bridge(model) -> bool:
    return any(c.__name__ == "TransformerBridge" for c in type(model).__mro__)


def _get(mod, path: str):
    for p in path.split("."):
        mod = getattr(mod, p, None) if p in getattr(mod, "_modules", {}) or hasattr(mod, p) else None
        if mod is None:
            return None
    return mod if isinstance(mod, torch.nn.Module) else None


def _heads(x: torch.Tensor, n: int | None, T: int, d: int | None = None) -> torch.Tensor:
    """(B, n, T, d) from a raw hook tensor: flat (B, T, n·d), HF (B, n, T, d) or TL (B, T, n, d)."""
    if x.dim() == 3:
        B, t, w = x.shape
        d = d or w // n
        return x.reshape(B, t, w // d, d).transpose(1, 2)
    if x.shape[2] == T and (n is None or x.shape[1] == n):
        return x
    return x.transpose(1, 2)


class BridgeAdapter(BlocksAdapter):
    name = "tlens-bridge"

    def attach(self, observer) -> None:
        for site, a in zip(self.sites(), self.attns):
            box: dict = {}

            def keep(key):
                def hook(mod, args, out, box=box):
                    box[key] = out
                return hook

            for names, key in ((_Q, "q"), (_K, "k"), (("v.hook_out",), "v"), (("hook_attn_scores",), "scores")):
                for n in names:      # registration order is irrelevant: the last to fire wins
                    hp = _get(a, n)
                    if hp is not None:
                        self._handles.append(hp.register_forward_hook(keep(key)))

            def on_z(mod, args, z, box=box, a=a, site=site):
                if torch.compiler.is_compiling() or "scores" not in box:
                    return None
                s = box["scores"].detach()                          # (B, nh, T, Tk)
                nh, T = s.shape[1], s.shape[2]
                q = _heads(box["q"], nh, T)
                d = q.shape[-1]
                k, v = _heads(box["k"], None, s.shape[3], d), _heads(box["v"], None, s.shape[3], d)
                z4 = z.reshape(z.shape[0], z.shape[1], nh, -1)       # what o consumes, per head
                allowed = s > torch.finfo(s.dtype).min / 2           # −inf or the dtype's minimum
                observer.observe(site, q, k, v, z4, allowed, _scale(a, d), heads_dim=2, **_modifiers(a))
                box.clear()
                return z4.reshape(z.shape)

            o_in = _get(a, "o.hook_in")
            if o_in is None:
                raise AdapterError(f"blocks.{site.layer}.attn ({type(a).__name__}): no o.hook_in (hook_z)")
            self._handles.append(o_in.register_forward_hook(on_z))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def attrs(self):
        cfg = getattr(self.model, "cfg", None)
        return {"adapter": self.name, "architecture": getattr(cfg, "architecture", None),
                "attention": sorted({type(a).__name__ for a in self.attns})}


def _hf(a):
    return getattr(a, "original_component", None)


def _scale(a, d: int) -> float:
    hf = _hf(a)
    if type(a).__name__ == "JointQKVAttentionBridge" or getattr(hf, "scaling", None) is None:
        scale = d ** -0.5        # what JointQKVAttentionBridge._reconstruct_attention uses
        layer = getattr(a, "_layer_idx", None)
        if getattr(a.config, "scale_attn_by_inverse_layer_idx", False) and layer is not None:
            scale /= float(layer + 1)
        return scale
    return float(hf.scaling)


def _modifiers(a) -> dict:
    hf, out = _hf(a), {}
    cap = getattr(hf, "attn_logit_softcapping", None)
    if cap:
        out["softcap"] = float(cap)
    sinks = getattr(hf, "sinks", None)
    if torch.is_tensor(sinks):
        out["sinks"] = sinks
    return out


def detect(model):
    blocks = getattr(model, "blocks", None)
    if not blocks or not all(hasattr(b, "attn") and hasattr(b.attn, "hook_attn_scores") for b in blocks):
        return None
    return BridgeAdapter(model)
