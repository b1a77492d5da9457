"""The tracer of the dataflow adapter: a ``TorchFunctionMode`` that finds one attention inside one
module's forward by what its tensors do, not by what the code is called.

Pushed only while a found module runs on a recording step (:mod:`dyntool.adapters.dataflow`), it
sees every torch call of that forward and keeps three facts:

- **score producers**: each ``matmul``/``bmm``/``baddbmm``/``@`` output (its autograd node, its two
  operands, ``baddbmm``'s ``alpha``).  The model gets a clone of the product, so that later in-place
  score ops (``/=``, ``*=``) leave the product itself untouched for the scale probe below;
- **α**: the output of a last-dimension softmax, with S its actual input (padding, ALiBi, relative
  biases and ``finfo.min`` rows included as the model computed them), followed through ops that
  keep its element count and order (views, reshapes, casts, dropout) to
- **α · V**: the first matmul that takes a follower of α as its left operand; its output is handed
  back to the model as a view of a (B, H, T, d_v) tensor, so a tensor hook on that tensor sees U.

S's producer is found by walking S's autograd graph back to the nearest recorded product; τ, the
factor on q·kᵀ, is then measured by autograd itself (∂S/∂(q kᵀ) on a random probe), not read from
the code.  Anything the tracer cannot follow exactly raises :class:`DataflowRefusal` with the
reason: the adapter refuses rather than guesses.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_SOFTMAX = {F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax}
# F.softmax dispatches under whatever ``torch.nn.functional.softmax`` is at call time (a wrapper a
# user or a library installed), so a softmax is also known by its name
_PRODUCTS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm}
_BADDBMM = {torch.baddbmm, torch.Tensor.baddbmm}
# ops that keep α's elements in α's order (reshapes, casts, dropout): its followers stay α
_KEEP = {torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.view_as, torch.Tensor.reshape_as,
         torch.Tensor.contiguous, torch.Tensor.to, torch.Tensor.type, torch.Tensor.type_as, torch.Tensor.float,
         torch.Tensor.double, torch.Tensor.half, torch.Tensor.bfloat16, torch.Tensor.clone, torch.Tensor.flatten,
         torch.flatten, torch.Tensor.unflatten, torch.Tensor.squeeze, torch.Tensor.unsqueeze, F.dropout,
         torch.dropout}
_DEPTH = 64                      # autograd nodes walked back from S to its producer


def _einsum_as_matmul(args, kwargs, followers):
    """``(x', y', perm)`` with ``einsum(eq, x, y) == (x' @ y').permute(perm)`` (perm None: no
    permute) for the two-operand forms attention is written in (``bhid,bhjd->bhij``,
    ``bhij,bhjd->bhid``, XLNet's ``ibnd,jbnd->bnij`` and ``bnij,jbnd->ibnd``, any label names and
    operand layouts): one contracted label, one free label per operand, the other labels on both
    operands and the output.  Operands are permuted views, so the matmul reads the same tensors.
    The output may be reordered only for α·V (its x a follower of α); scores must come out
    (batch…, i, j), the layout S keeps.  None for anything else (the einsum then runs unfollowed)."""
    if kwargs or len(args) < 2 or not isinstance(args[0], str) or "." in args[0] or "->" not in args[0]:
        return None
    ops = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
    if len(ops) != 2 or not all(torch.is_tensor(t) for t in ops):
        return None
    ins, out = args[0].replace(" ", "").split("->")
    parts = ins.split(",")
    if len(parts) != 2:
        return None
    lx, ly = parts
    c = set(lx) & set(ly) - set(out)
    fx, fy = set(lx) - set(ly), set(ly) - set(lx)
    if (len(c) != 1 or len(fx) != 1 or len(fy) != 1 or len(set(lx)) != len(lx) or len(set(ly)) != len(ly)
            or len(set(out)) != len(out) or set(out) != (set(lx) | set(ly)) - c):
        return None
    (c,), (i,), (j,) = c, fx, fy
    batch = "".join(n for n in out if n not in (i, j))
    x, y = ops
    follows = id(x) in followers
    px = [lx.index(n) for n in batch + i + c]
    py = [ly.index(n) for n in batch + c + j]
    canon = batch + i + j
    if follows and px != list(range(x.dim())):
        return None                          # α reordered before V: not followed
    if canon != out and not follows:
        return None
    perm = None if canon == out else [canon.index(n) for n in out]
    return ((x if px == list(range(x.dim())) else x.permute(px)),
            (y if py == list(range(y.dim())) else y.permute(py)), perm)


class DataflowRefusal(RuntimeError):
    """This module's attention cannot be recorded exactly; the message says why (one line)."""


class NoQK(DataflowRefusal):
    """q and k cannot be had exactly (no product seen, a relative term on q or k): α, V, U, B and
    ∂L/∂S still can, and are recorded where the observer takes dQ/dK as unavailable."""


class Found:
    """One attention found in one forward: the tensors the adapter hands the observer."""

    def __init__(self, S, alpha, producer):
        self.S, self.alpha, self.producer = S, alpha, producer
        self.dropout_p = 0.0
        self.value = self.out4 = None


class Tracer(TorchFunctionMode):
    """Active inside one module's forward; ``found`` is the attention it saw (or None)."""

    def __init__(self, n_heads: int | None):
        super().__init__()
        self.n_heads = n_heads
        self.products: dict = {}          # autograd node of a product -> (a, b, alpha, product, views)
        self.followers: dict = {}         # id(tensor) -> (tensor, Found): α and what keeps it
        self.found: Found | None = None
        self.calls: list = []             # every torch function the forward ran, in order (its shape)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append(func)
        if (func in _PRODUCTS or func in _BADDBMM) and torch.is_grad_enabled():
            return self._product(func, args, kwargs)
        if func is torch.einsum and torch.is_grad_enabled():
            as_matmul = _einsum_as_matmul(args, kwargs, self.followers)
            if as_matmul is not None:
                out = self._product(torch.matmul, as_matmul[:2], {})
                return out if as_matmul[2] is None else out.permute(as_matmul[2])   # a view: U still reaches out4
        out = func(*args, **kwargs)
        if not torch.is_grad_enabled():
            return out
        if (func in _SOFTMAX or getattr(func, "__name__", "") == "softmax") and torch.is_tensor(out):
            self._softmax(args, kwargs, out)
        elif func in _KEEP and args and torch.is_tensor(args[0]) and id(args[0]) in self.followers:
            src, found = self.followers[id(args[0])]
            if torch.is_tensor(out) and out.numel() == src.numel() and src is not out:
                if func in (F.dropout, torch.dropout):
                    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
                    train = kwargs.get("training", kwargs.get("train", args[2] if len(args) > 2 else True))
                    found.dropout_p = max(found.dropout_p, float(p) if train else 0.0)
                self.followers[id(out)] = (out, found)
        return out

    # -- the three facts ------------------------------------------------------------------
    def _product(self, func, args, kwargs):
        baddbmm = func in _BADDBMM
        ia, ib = (1, 2) if baddbmm else (0, 1)
        ka, kb = ("batch1", "batch2") if baddbmm else ("input", "other")
        args = list(args)
        get = lambda i, k: args[i] if len(args) > i else kwargs.get(k)        # noqa: E731
        a, b = get(ia, ka), get(ib, kb)
        if not (torch.is_tensor(a) and torch.is_tensor(b)) or id(a) in self.followers:
            out = func(*args, **kwargs)
            return self._alpha_v(a, b, out) if torch.is_tensor(a) and id(a) in self.followers else out
        views = self._graph_views(a, b)
        if views is not None:                       # the product reads q, k through views dyntool can hook
            a_in, b_in = views[2], views[3]
            for i, k, t in ((ia, ka, a_in), (ib, kb, b_in)):
                if len(args) > i:
                    args[i] = t
                else:
                    kwargs[k] = t
        out = func(*args, **kwargs)
        # a score product multiplies two batched operands (a weight is 2-D: a projection, not scores)
        if out.requires_grad and out.grad_fn is not None and a.dim() >= 3 and b.dim() >= 3:
            alpha = float(kwargs.get("alpha", 1.0)) if baddbmm else 1.0
            self.products[out.grad_fn] = (a, b, alpha, out, views)
            return out.clone()              # in-place score ops act on the clone; `out` stays the product
        return out

    def _graph_views(self, a, b):
        """(q (B, H, T, d), k (B, H, Tk, d), a', b'): views of the operands that the product then reads,
        so tensor hooks on q and k receive autograd's own dQ and dK (used where S is not τ q·kᵀ plus a
        bias everywhere α weighs).  None where the heads cannot be told (3-D without a head count)."""
        if not (a.requires_grad and b.requires_grad) or a.dim() != b.dim() or a.dim() not in (3, 4):
            return None
        if a.dim() == 4:
            q = a.view_as(a)
            k = b.transpose(-1, -2)
            return q, k, q, k.transpose(-1, -2)
        H = self.n_heads
        if H is None or a.shape[0] % H or b.shape[0] != a.shape[0]:
            return None
        q = a.unflatten(0, (a.shape[0] // H, H))
        k = b.transpose(-1, -2).unflatten(0, (b.shape[0] // H, H))
        return q, k, q.flatten(0, 1), k.flatten(0, 1).transpose(-1, -2)

    def _softmax(self, args, kwargs, alpha):
        S = args[0] if args else kwargs.get("input")
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if not torch.is_tensor(S) or dim is None or dim not in (-1, S.dim() - 1) or S.dim() < 3:
            return
        if not S.requires_grad:
            return
        found = Found(S, alpha, self._producer_of(S))
        self.followers[id(alpha)] = (alpha, found)

    def _producer_of(self, S):
        """The nearest recorded product upstream of S in its autograd graph (breadth first)."""
        seen, frontier = set(), [S.grad_fn]
        for _ in range(_DEPTH):
            nxt = []
            for node in frontier:
                if node is None or node in seen:
                    continue
                seen.add(node)
                if node in self.products:
                    return self.products[node]
                nxt.extend(n for n, _ in node.next_functions)
            if not nxt:
                return None
            frontier = nxt
        return None

    def _alpha_v(self, a, v, out):
        _, found = self.followers[id(a)]
        if self.found is not None:
            raise DataflowRefusal("a second softmax·V in one forward of this module (two attentions in one "
                                  "module are not told apart); name the inner module instead")
        B, H, T, Tk = self.heads(found.alpha)
        if out.numel() % (B * H * T) or out.shape[-2] != T:
            raise DataflowRefusal(f"α·V output {tuple(out.shape)} is not (B·H, T, d_v) for α {(B, H, T, Tk)}")
        dv = out.numel() // (B * H * T)
        out4 = out.reshape(B, H, T, dv)                     # U is read off this tensor's gradient
        found.value, found.out4 = v, out4
        self.found = found
        return out4.reshape(out.shape)

    def signature(self) -> tuple:
        """What makes two forwards of one module the same computation for the adapter's checks: the
        torch functions called, in order, and the shapes and dtypes of the tensors it takes."""
        f = self.found
        ts = (f.S, f.alpha, f.value, f.out4) + (() if f.producer is None else tuple(f.producer[:2]))
        # by name: a wrapper re-made per call (a user's patched softmax) is still the same function
        names = tuple(getattr(c, "__qualname__", None) or getattr(c, "__name__", None) or repr(c) for c in self.calls)
        return (names, f.dropout_p, f.producer is None,
                tuple((tuple(t.shape), t.dtype) for t in ts))

    def heads(self, t) -> tuple[int, int, int, int]:
        """(B, H, T, Tk) of α: a 4-D softmax names its heads; a 3-D one (B·H, T, Tk) is unfolded by
        the module's head count, refused where that does not divide."""
        if t.dim() == 4:
            return tuple(t.shape)
        lead = 1
        for n in t.shape[:-2]:
            lead *= n
        H = self.n_heads
        if H is None or lead % H:
            raise DataflowRefusal(f"softmax over {tuple(t.shape)}: cannot unfold batch·heads {lead} by the "
                                  f"module's head count ({H})")
        return lead // H, H, t.shape[-2], t.shape[-1]
