"""torch's own ``nn.MultiheadAttention`` (alone, or inside ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer`` / ``nn.Transformer``), found automatically.

The module's forward runs untouched (its fused or math path, ``need_weights`` either way); a
forward hook with kwargs reads what it was given and recomputes, detached, the per-head
``q, k, v`` (B, nh, T, hd) from ``in_proj_weight`` (or ``q/k/v_proj_weight`` when kdim/vdim differ)
and the biases.  The per-head output ``o`` never leaves ``F.multi_head_attention_forward``; only
``y = out_proj(o)`` does.  out_proj is linear, so dyntool works in y's space:

- the self-check compares ``out_proj(α V)`` with the y the module returned (``out_map``);
- U = ∂L/∂o = (∂L/∂y) W_out, split per head, from a tensor hook on y (``grad_map``).

Masks follow nn.MultiheadAttention's conventions: ``attn_mask`` (T, Tk) or (B·nh, T, Tk), boolean
True = *not* allowed, or float additive; ``key_padding_mask`` (B, Tk), the same two forms;
``is_causal`` without a mask means causal.  Finite float-mask entries are a score bias.  The
decoder layer's ``multihead_attn`` is a cross-attention site.  Refused (one line, at
``Capture.__enter__``): ``add_bias_kv`` and ``add_zero_attn`` (extra keys dyntool does not
reconstruct).  Dropout is refused while recording, as for every adapter.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..observe import Site
from .base import Adapter, AdapterError

_MHA_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
             "average_attn_weights", "is_causal")


def _kind(name: str, module, parents: dict) -> tuple[str, str]:
    parent = parents.get(name.rsplit(".", 1)[0] if "." in name else "")
    leaf = name.rsplit(".", 1)[-1]
    cross = leaf == "multihead_attn" and isinstance(parent, nn.TransformerDecoderLayer)
    parts = name.split(".")
    stack = ("decoder" if isinstance(parent, nn.TransformerDecoderLayer) or "decoder" in parts else
             "encoder" if isinstance(parent, nn.TransformerEncoderLayer) or "encoder" in parts else "")
    return ("cross" if cross else "self"), stack


def _projections(m: nn.MultiheadAttention, dtype):
    E = m.embed_dim
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.split(E)
    else:
        wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
    b = m.in_proj_bias.split(E) if m.in_proj_bias is not None else (None, None, None)
    return [(w.detach().to(dtype), None if bb is None else bb.detach().to(dtype)) for w, bb in zip((wq, wk, wv), b)]


def _heads(x, w, b, nh):
    """(B, T, E_in) → (B, nh, T, hd) through one projection."""
    y = torch.nn.functional.linear(x, w, b)
    B, T, E = y.shape
    return y.view(B, T, nh, E // nh).transpose(1, 2)


def _mask(mask, padding: bool, B, nh, T, Tk, dtype, device):
    """One MHA mask → (allowed (B|1, nh|1, T, Tk) or None, additive bias or None)."""
    if mask is None:
        return None, None
    if padding:
        mask = mask[:, None, None, :]                       # key_padding_mask (B, Tk)
    elif mask.dim() == 2:
        mask = mask[None, None]                             # attn_mask (T, Tk)
    else:
        mask = mask.view(B, nh, T, Tk)                      # attn_mask (B·nh, T, Tk)
    if mask.dtype == torch.bool:
        return ~mask, None
    finite = mask > torch.finfo(mask.dtype).min / 2
    bias = torch.where(finite, mask, torch.zeros((), dtype=mask.dtype, device=device)).to(dtype)
    return finite, (bias if bool(bias.ne(0).any()) else None)


class TorchMHAAdapter(Adapter):
    name = "torch-mha"

    def __init__(self, model, named):
        self.model = model
        self.names, self.modules = [n for n, _ in named], [m for _, m in named]
        parents = dict(model.named_modules())
        self.kinds = [_kind(n, m, parents) for n, m in named]
        self._handles: list = []

    def sites(self):
        return [Site(i, id(m), type(m).__name__, *kind, name=n)
                for i, (n, m, kind) in enumerate(zip(self.names, self.modules, self.kinds))]

    def attach(self, observer) -> None:
        for site, m in zip(self.sites(), self.modules):
            if m.bias_k is not None or m.add_zero_attn:
                raise AdapterError(f"{_what(site)}: add_bias_kv / add_zero_attn append keys dyntool does not "
                                   "reconstruct; refused (build the module without them to record it)")

            def hook(mod, args, kwargs, output, site=site):
                if torch.compiler.is_compiling() or not torch.is_grad_enabled():
                    return
                self._observe(observer, site, mod, {**dict(zip(_MHA_ARGS, args)), **kwargs}, output[0])
            self._handles.append(m.register_forward_hook(hook, with_kwargs=True))

    def _observe(self, observer, site, m, a, y) -> None:
        if m.training and m.dropout:
            raise AdapterError(f"{_what(site)}: attention dropout p={m.dropout} is on while recording; "
                               "recorded α would not be the one used (model.eval() or dropout=0)")
        bf = m.batch_first
        q_in, k_in, v_in = (t if bf else t.transpose(0, 1) for t in (a["query"], a["key"], a["value"]))
        B, T, Tk, nh = q_in.shape[0], q_in.shape[1], k_in.shape[1], m.num_heads
        dt = y.dtype
        (wq, bq), (wk, bk), (wv, bv) = _projections(m, dt)
        with torch.no_grad():
            q, k, v = (_heads(x.detach().to(dt), w, b, nh) for x, (w, b) in
                       zip((q_in, k_in, v_in), ((wq, bq), (wk, bk), (wv, bv))))
        allowed = torch.ones(1, 1, T, Tk, dtype=torch.bool, device=y.device)
        bias = None
        attn_mask = a.get("attn_mask")
        if attn_mask is None and a.get("is_causal"):
            # bottom-right aligned (query i sees keys j <= i + Tk − T: the last query sees every key), which
            # masks.causal() is not when Tk > T; equal to it when T == Tk (tests/unit/test_masks.py)
            allowed = allowed & torch.ones(T, Tk, dtype=torch.bool, device=y.device).tril(Tk - T)
        for mask, padding in ((attn_mask, False), (a.get("key_padding_mask"), True)):
            ok, b = _mask(mask, padding, B, nh, T, Tk, dt, y.device)
            if ok is not None:
                allowed = allowed & ok
            if b is not None:
                bias = b if bias is None else bias + b
        w_out = m.out_proj.weight.detach()
        b_out = None if m.out_proj.bias is None else m.out_proj.bias.detach()
        hd = m.embed_dim // nh

        def out_map(o):                          # (S, nh, T, hd) → y's layout, narrowed to S
            z = o.transpose(1, 2).reshape(o.shape[0], T, nh * hd)
            yy = torch.nn.functional.linear(z, w_out.to(o.dtype), None if b_out is None else b_out.to(o.dtype))
            return yy if bf else yy.transpose(0, 1)

        def grad_map(g):                         # ∂L/∂y → U = ∂L/∂o per head: (B, nh, T, hd)
            g = g if bf else g.transpose(0, 1)
            return (g @ w_out.to(g.dtype)).view(B, T, nh, hd).transpose(1, 2)

        observer.observe(site, q, k, v, y, allowed, hd ** -0.5, bias=bias, out_map=out_map, grad_map=grad_map,
                         out_batch_dim=0 if bf else 1)

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _what(site: Site) -> str:
    return f"layer {site.layer} ({site.name}, {site.label})"


def detect(model):
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    return TorchMHAAdapter(model, named) if named else None
