"""nanoGPT-style modules that call ``F.scaled_dot_product_attention`` themselves.

Point dyntool at them in one of two ways:

- by class: ``Capture(model, attention="CausalSelfAttention")`` (a name, a class, or a list);
  without it, modules whose ``forward`` source calls ``scaled_dot_product_attention`` are found
  automatically;
- by a one-line wrap in the model code: ``y = dyntool.adapters.sdpa.attention(q, k, v,
  is_causal=True)`` instead of ``F.scaled_dot_product_attention(...)`` (same arguments).

While a Capture is open, a forward pre-hook on each such module swaps
``torch.nn.functional.scaled_dot_product_attention`` for a recording wrapper during that module's
forward only (a forward hook swaps it back); the wrapper calls the real SDPA and feeds the
observer with q, k, v (B, nh, T, d), the output (B, nh, T, d), the mask and the scale.  Non-recording
steps: no hooks, no swap.  The module must call SDPA once per forward through ``F.`` /
``torch.nn.functional.`` (an import-time alias is not swapped; the Capture then reports that the
layer never ran).  Dropout inside SDPA is refused while recording.

With the cheap tier's fused kernel (``record.kernel``, :mod:`dyntool.fused_path`), a call without
``attn_mask`` (``is_causal`` or full, GQA through ``enable_gqa``) of an armed module (``ARMED``)
runs in the kernel instead of SDPA; a call with a mask runs SDPA and is recorded eagerly.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from ..observe import Site, additive_bias, allowed_from
from .base import Adapter, AdapterError

_REAL = F.scaled_dot_product_attention
_STATE: dict = {"obs": None, "site": None, "seen": False}
ARMED: dict[int, object] = {}         # Site.key (id of the module) -> fused_path.SDPAFusedSite: its arm() writes it


def _observe(q, k, v, out, attn_mask, is_causal, scale, dropout_p):
    obs, site = _STATE["obs"], _STATE["site"]
    if obs is None or torch.compiler.is_compiling():
        return
    if dropout_p:
        raise AdapterError(f"layer {site.layer}: SDPA dropout_p={dropout_p} while recording; use 0")
    T, Tk = q.shape[-2], k.shape[-2]
    if attn_mask is not None:
        attn_mask = attn_mask.expand(*q.shape[:-2], T, Tk) if attn_mask.dim() < 4 else attn_mask
    allowed = allowed_from(attn_mask, T, Tk, causal=is_causal, device=q.device)
    # a float mask's finite entries are added to the scores (ALiBi folded into the mask: Falcon)
    bias = additive_bias(None, attn_mask, T, Tk) if attn_mask is not None else None
    obs.observe(site, q, k, v, out, allowed, q.shape[-1] ** -0.5 if scale is None else scale, bias=bias)
    _STATE["site"] = None          # one call per module forward
    _STATE["seen"] = True


def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """Drop-in for ``F.scaled_dot_product_attention`` that reports to an open Capture."""
    site = _STATE["site"]
    run = None if site is None else ARMED.get(site.key)
    out = None
    if run is not None and attn_mask is None and not dropout_p and set(kw) <= {"enable_gqa"}:
        out = run(q, k, v, is_causal, scale)
    if out is None:
        out = _REAL(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)
    if _STATE["site"] is not None:
        _observe(q, k, v, out, attn_mask, is_causal, scale, dropout_p)
    return out


def calls_sdpa(m, include_hf: bool = False) -> bool:
    skip = ("torch.", "dyntool.") if include_hf else ("torch.", "transformers.", "dyntool.")
    if type(m).__module__.startswith(skip):
        return False
    try:
        src = inspect.getsource(type(m).forward)
    except (OSError, TypeError):
        return False
    return "scaled_dot_product_attention" in src or "sdpa.attention(" in src


def _matches(m, attention) -> bool:
    wanted = attention if isinstance(attention, (list, tuple)) else [attention]
    return any(type(m).__name__ == w if isinstance(w, str) else isinstance(m, w) for w in wanted)


class SDPAAdapter(Adapter):
    name = "sdpa"

    def __init__(self, model, attention=None, include_hf: bool = False):
        pick = (lambda m: _matches(m, attention)) if attention is not None else (lambda m: calls_sdpa(m, include_hf))
        self.modules = [m for m in model.modules() if pick(m)]
        if attention is not None and not self.modules:
            raise AdapterError(f"no module of class {attention!r} in {type(model).__name__}")
        self._handles: list = []

    def sites(self):
        return [Site(i, id(m), type(m).__name__) for i, m in enumerate(self.modules)]

    def attach(self, observer) -> None:
        for site, m in zip(self.sites(), self.modules):
            def pre(mod, args, site=site):
                _STATE["obs"], _STATE["site"], _STATE["seen"] = observer, site, False
                F.scaled_dot_product_attention = attention

            def post(mod, args, out, site=site):
                F.scaled_dot_product_attention = _REAL
                _STATE["site"] = None
                if not _STATE["seen"] and torch.is_grad_enabled() and not torch.compiler.is_compiling():
                    # refuse now, before any backward, rather than "did not run" after it
                    raise AdapterError(
                        f"layer {site.layer} ({site.label}) ran without calling F.scaled_dot_product_attention "
                        "(it computed its attention itself, e.g. attn_implementation='eager', or through an "
                        "alias dyntool cannot swap); dyntool cannot see its scores: use the SDPA path "
                        "(attn_implementation='sdpa') or wrap the call with dyntool.adapters.sdpa.attention")
            self._handles.append(m.register_forward_pre_hook(pre))
            self._handles.append(m.register_forward_hook(post))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        F.scaled_dot_product_attention = _REAL
        _STATE["obs"] = _STATE["site"] = None


def detect(model):
    ad = SDPAAdapter(model, include_hf=True)
    return ad if ad.modules else None
