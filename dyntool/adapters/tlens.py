"""TransformerLens ``HookedTransformer`` (3.x) through its hook points.

Per block ``blocks.{l}.attn``: ``hook_q``/``hook_k`` (``hook_rot_q``/``hook_rot_k`` with rotary
embeddings: after RoPE), ``hook_v``, ``hook_attn_scores`` (only to read the mask TransformerLens
applied: causal, local window, padding; masked scores are −inf there) and ``hook_z``, the per-head
output (B, T, nh, d) that ``W_O`` consumes, which gets the tensor hook for U.  The scale is
``1 / attn.attn_scale``.  Grouped-query attention: ``hook_k``/``hook_v`` hold the k/v heads, repeated
per query head the TransformerLens way (``repeat_interleave``).  Forward hooks are plain PyTorch
hooks on the HookPoint modules, added on ``__enter__`` and removed on ``__exit__``.
"""
from __future__ import annotations

import torch

from ..observe import Site
from . import Adapter


class TLAdapter(Adapter):
    name = "tlens"

    def __init__(self, model):
        self.model = model
        self.attns = [b.attn for b in model.blocks]
        self._handles: list = []

    def sites(self):
        return [Site(i, id(a), type(a).__name__) for i, a in enumerate(self.attns)]

    def attach(self, observer) -> None:
        for site, a in zip(self.sites(), self.attns):
            box: dict = {}
            rot = hasattr(a, "hook_rot_q") and a.cfg.positional_embedding_type == "rotary"

            def keep(name, box=box):
                def hook(mod, args, out):
                    box[name] = out
                return hook

            def on_z(mod, args, z, box=box, a=a, site=site):
                if torch.compiler.is_compiling():
                    return
                q, k, v = (box[n].transpose(1, 2) for n in ("q", "k", "v"))    # (B, h, T, d)
                allowed = torch.isfinite(box["scores"].detach())               # (B, nh, T, Tk)
                observer.observe(site, q, k, v, z, allowed, 1.0 / float(a.attn_scale), heads_dim=2)
                box.clear()
            for n, hp in (("q", a.hook_rot_q if rot else a.hook_q), ("k", a.hook_rot_k if rot else a.hook_k),
                          ("v", a.hook_v), ("scores", a.hook_attn_scores)):
                self._handles.append(hp.register_forward_hook(keep(n)))
            self._handles.append(a.hook_z.register_forward_hook(on_z))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def attrs(self):
        cfg = self.model.cfg
        return {"adapter": self.name, "attn_types": list(getattr(cfg, "attn_types", None) or []),
                "window_size": getattr(cfg, "window_size", None)}


def detect(model):
    if not type(model).__module__.startswith("transformer_lens"):
        return None
    blocks = getattr(model, "blocks", None)
    if not blocks or not all(hasattr(b, "attn") and hasattr(b.attn, "hook_z") for b in blocks):
        return None
    return TLAdapter(model)
