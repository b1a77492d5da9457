"""Attention found by its dataflow: modules that compute their own softmax (BLOOM, MPT, GPT-Neo,
Falcon's eager path, XGLM, OpenAI-GPT, a nanoGPT-style manual path, a user's own ``nn.Module``).

The last adapter :func:`dyntool.adapters.find_adapter` tries.  Its sites are the innermost modules
whose class code runs a softmax and whose name says attention (``*Attention``, ``*Attn``), or the
class a user names.  While a Capture is open, each site's forward (and only it: never the whole
model, never a non-recording step) runs under a :class:`~.dataflow_trace.Tracer`, which finds S, α,
the α·V product and S's producer by what the tensors do.  Then, before any backward:

- q, k come from the producer's operands (k from kᵀ), V from α·V's right operand, heads from a 4-D
  softmax or by unfolding B·H with the module's head count; K/V with fewer heads (MQA/GQA) stay per
  k/v head, as :mod:`dyntool.observe` wants them;
- τ, the factor on q·kᵀ, is measured by autograd (∂S/∂(q kᵀ) on a random probe) and must be one
  number on every entry α weighs; everything else in S (ALiBi, masks, relative biases, casts) is
  the additive ``bias = S − τ q kᵀ``, so the recorded scores are exactly the softmax's input;
- ``allowed`` is where α > 0: the model's own mask, ``finfo.min`` rows included as it computed them;
- the forward check (α V is the output the model used) and, on the first recorded step and every
  N-th, the backward check (:mod:`.dataflow_check`) refuse the site with the residual.

Between those check steps, an observer that takes the model's own α (the cheap tier,
``takes_alpha``) gets it with τ q kᵀ and S, and nothing is read on the host (no sync on a GPU):
that needs the module's forward to be the computation a check step passed (the same torch calls
on the same shapes and dtypes, :meth:`Tracer.signature`); τ itself is taken again on the device
every step (a learned temperature moves).  Anything else
runs the checked path, host reads and all.

Refused, one line each: reentrant activation checkpointing (the layer runs again inside backward
with nothing recorded in its first forward), compiled recording steps, a softmax whose output
never meets V, scores not produced by a matmul/bmm/baddbmm/einsum dyntool saw, scores that reach q
or k outside their product (DeBERTa's relative terms), a factor on q·kᵀ that varies (soft-capping)
where q and k cannot be hooked for autograd's own dQ/dK.
"""
from __future__ import annotations

import inspect
import weakref

import torch

from ..observe import Site, expand_kv
from ..quantities import compute_dtype
from .base import Adapter, AdapterError
from .dataflow_check import BackwardCheck, check_forward
from .dataflow_trace import DataflowRefusal, NoQK, Tracer
from .hf import site_kind          # the same self/cross naming as the registry adapter

_HEAD_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nheads")
_NAMES = ("Attention", "Attn", "attention", "attn")
_SOURCES: dict[type, bool] = {}
_RECORDED = weakref.WeakKeyDictionary()     # model -> recorded forwards so far (backward-check schedule)
# |τ_ij − τ| / |τ| over the entries α weighs: the probe's gradient is computed in the product's dtype
_TAU_TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def computes_softmax(m) -> bool:
    """Does this module's class code (its own or a parent's below torch) call a softmax?"""
    cls = type(m)
    if cls not in _SOURCES:
        found = False
        for c in cls.__mro__:
            if c.__module__.startswith(("torch.", "dyntool.")) or c is object:
                continue
            try:
                found = found or "softmax" in inspect.getsource(c)
            except (OSError, TypeError):
                pass
        _SOURCES[cls] = found
    return _SOURCES[cls]


# what a module holds when its attention is not one softmax over every key a query may see: it is
# refused by name of what it does (the tracer would find softmaxes of gathered blocks or buckets)
_NON_DENSE = (
    ("one_sided_attn_window_size", "banded attention computed in overlapping chunks (Longformer, LED)"),
    ("num_random_blocks", "block-sparse attention over window, global and random key blocks (BigBird; "
                          "attention_type='original_full' is dense and recorded)"),
    ("num_hashes", "LSH attention: each query sees the keys hashed into its bucket (Reformer)"),
    ("num_chunks_before", "chunked local attention (Reformer)"),
)


def non_dense(m) -> str | None:
    """Why ``m``'s attention is not dense (None: dense as far as its attributes say)."""
    return next((why for attr, why in _NON_DENSE if hasattr(m, attr)), None)


def refuse_non_dense(named) -> None:
    """One line naming the first non-dense attention among ``(path, module)`` pairs, if any."""
    for n, m in named:
        why = non_dense(m)
        if why is not None:
            raise AdapterError(f"{n} ({type(m).__name__}): non-dense attention, {why}; dyntool records "
                               "dense attention only, nothing recorded")


def n_heads(m) -> int | None:
    for owner in (m, getattr(m, "config", None)):
        for a in _HEAD_ATTRS:
            v = getattr(owner, a, None) if owner is not None else None
            if isinstance(v, int) and v > 0:
                return v
    return None


def candidates(model, wanted=None) -> list[tuple[str, torch.nn.Module]]:
    """``(path, module)`` of the sites: the named classes, or innermost attention-named modules whose
    class code runs a softmax (a MoE router's module is not named attention: never a site)."""
    if wanted is not None:
        return [(n, m) for n, m in model.named_modules() if matches(m, wanted)]
    found = [(n, m) for n, m in model.named_modules()
             if type(m).__name__.endswith(_NAMES) and computes_softmax(m)]
    ids = {id(m) for _, m in found}
    return [(n, m) for n, m in found if not any(id(c) in ids for c in m.modules() if c is not m)]


def matches(m, wanted) -> bool:
    wanted = wanted if isinstance(wanted, (list, tuple)) else [wanted]
    return any(type(m).__name__ == w if isinstance(w, str) else isinstance(m, w) for w in wanted)


class DataflowAdapter(Adapter):
    name = "dataflow"

    def __init__(self, model, named, check_every: int = 10):
        refuse_non_dense(named)
        self.model = model
        self.names, self.modules = [n for n, _ in named], [m for _, m in named]
        self.check_every = max(1, int(check_every))
        self._handles: list = []
        self._checks: list[BackwardCheck] = []
        self._seen: set = set()
        self.residuals: dict[int, tuple[float, float]] = {}
        self._passed: dict = {}             # (site key, Tracer.signature) a check step passed -> τ uniform?
        self.qk_grads = "standard"          # "autograd" once a site's dQ/dK came from hooks on q and k
        self.no_qk: str | None = None       # why q, k are unavailable ("unavailable": at some site)

    def sites(self):
        return [Site(i, id(m), type(m).__name__, *site_kind(n, m), name=n)
                for i, (n, m) in enumerate(zip(self.names, self.modules))]

    def attach(self, observer) -> None:
        count = _RECORDED.get(self.model, 0)
        _RECORDED[self.model] = count + 1
        check_backward = count % self.check_every == 0
        light = not check_backward and getattr(observer, "takes_alpha", False)
        self._seen.clear()
        for site, m in zip(self.sites(), self.modules):
            tracers: list = []

            def pre(mod, args, site=site, tracers=tracers):
                if torch.compiler.is_compiling():
                    raise AdapterError(f"{_where(site)}: a compiled recording step; the dataflow adapter "
                                       "traces eager torch calls (record uncompiled steps)")
                if not torch.is_grad_enabled():
                    return
                if torch._C._current_graph_task_id() != -1:          # running inside a backward
                    if site.key in self._seen:
                        return                     # non-reentrant checkpointing recomputes: recorded already
                    raise AdapterError(
                        f"{_where(site)}: reentrant activation checkpointing runs this layer without gradients "
                        "and again inside backward, where nothing can be recorded; refused (use "
                        "use_reentrant=False, or turn checkpointing off for recorded steps)")
                tr = Tracer(n_heads(mod))
                tr.__enter__()
                tracers.append(tr)

            def post(mod, args, out, site=site, tracers=tracers):
                if not tracers:
                    return
                tr = tracers.pop()
                tr.__exit__(None, None, None)
                if out is None:                    # the forward raised (always_call): nothing to record
                    return
                self._seen.add(site.key)
                try:
                    self._observe(observer, site, tr, check_backward, light)
                except DataflowRefusal as e:
                    raise AdapterError(f"{_where(site)}: {e}; refused, nothing recorded") from None

            self._handles.append(m.register_forward_pre_hook(pre))
            self._handles.append(m.register_forward_hook(post, always_call=True))

    def _observe(self, observer, site, tr: Tracer, check_backward: bool, light: bool) -> None:
        f = tr.found
        if f is None:
            raise DataflowRefusal("ran without a last-dimension softmax whose output reaches a matmul with V "
                                  "(through views, casts and dropout only)")
        B, H, T, Tk = tr.heads(f.alpha)
        alpha4 = f.alpha.detach().reshape(B, H, T, Tk)
        v4 = _heads_of(f.value.detach(), B, H, Tk, "V")
        passed = (site.key, tr.signature())
        if light and passed in self._passed:
            return self._observe_light(observer, site, f, alpha4, v4, self._passed[passed])
        check_forward(_where(site), alpha4, v4, f.out4, f.dropout_p)
        allowed = alpha4 > 0
        try:
            q4, k4, scale, grads = self._qk(f, allowed, (B, H, T, Tk))
        except NoQK as e:
            # α, V, U (so B, ∂L/∂S, dV) need no q or k: S itself is recorded as the scores' bias
            # over zero q, k, and the observer marks dQ, dK and the logit statistics unavailable
            if not getattr(observer, "qk_optional", False):
                raise DataflowRefusal(f"{e}, and this recorder needs q and k") from None
            q4 = v4.new_zeros(B, H, T, v4.shape[-1])
            k4 = v4.new_zeros(B, v4.shape[1], Tk, v4.shape[-1])
            scale, grads, self.qk_grads = 1.0, "unavailable", "unavailable"
            self.no_qk = str(e)
        dt = compute_dtype(torch.promote_types(q4.dtype, f.S.dtype))
        with torch.no_grad():
            logits = torch.matmul(q4.to(dt), expand_kv(k4.to(dt), H).transpose(-1, -2)) * scale
            bias = (f.S.detach().to(dt).reshape(B, H, T, Tk) - logits).masked_fill(~allowed, 0.0)
            # a float64 finfo.min row over float32 q·k (GPT-Neo) must stay finite where it is recorded
            bias = bias.clamp_min(torch.finfo(compute_dtype(q4.dtype)).min / 4)
            # only rounding left (no ALiBi, no mask values): record plain τ q·k
            if grads != "unavailable" and float(bias.abs().max()) <= 16 * torch.finfo(dt).eps * max(
                    float(logits.abs().max()), 1.0):
                bias = None
        observer.observe(site, q4, k4, v4, f.out4, allowed, scale, bias=bias, grads=grads)
        if grads != "unavailable" and not f.dropout_p:
            if len(self._passed) >= 256:        # a new shape every step (varying lengths): stay bounded
                self._passed.clear()
            self._passed[passed] = grads == "standard"
        if check_backward:
            self._checks.append(BackwardCheck(_where(site), f.S, f.alpha, f.out4, v4, (B, H, T, Tk)))

    def _observe_light(self, observer, site, f, alpha4, v4, uniform: bool) -> None:
        """A forward the same as one a check step passed, for an observer that takes α: no host read."""
        shape = B, H, T, Tk = alpha4.shape
        q4 = _heads_of(f.producer[0].detach(), B, H, T, "q")
        k4 = _heads_of(f.producer[1].detach().transpose(-1, -2), B, H, Tk, "k")
        allowed = alpha4 > 0
        dt = compute_dtype(torch.promote_types(q4.dtype, f.S.dtype))
        # τ = ∂S/∂(q kᵀ) over the entries α weighs: one number where the check step found it so (its
        # largest, exactly it), else their median as there (a selection: kept to such modules)
        (d,) = torch.autograd.grad(f.S, f.producer[3], torch.ones_like(f.S), retain_graph=True)
        with torch.no_grad():
            d = d.to(dt).reshape(shape)
            tau = (d.masked_fill(~allowed, float("-inf")).amax() if uniform
                   else d.masked_fill(~allowed, float("nan")).nanmedian()) * f.producer[2]
            logits = torch.matmul(q4.to(dt), expand_kv(k4.to(dt), H).transpose(-1, -2)) * tau
        observer.observe(site, q4, k4, v4, f.out4, allowed, tau, alpha=alpha4, logits=logits,
                         scores=f.S.detach().reshape(shape))

    def _qk(self, f, allowed, shape):
        """(q4, k4, τ, grads) from S's producer; :class:`NoQK` where they cannot be had exactly."""
        if f.producer is None:
            raise NoQK("its scores come from no matmul/bmm/baddbmm/@/einsum dyntool follows in this module "
                       "(a fused op, another einsum form), so q and k are unknown")
        B, H, T, Tk = shape
        q4 = _heads_of(f.producer[0].detach(), B, H, T, "q", NoQK)
        k4 = _heads_of(f.producer[1].detach().transpose(-1, -2), B, H, Tk, "k", NoQK)
        tau, uniform = _tau(f, allowed, shape)
        grads = "standard"
        if not uniform:
            # e.g. a row with no visible key whose uniform α includes entries masked by a product
            # (OpenAI-GPT, GPT-Neo, XGLM under left padding): dQ, dK straight from autograd
            q4, k4, grads = _hooked(f.producer[4], q4, k4, H)
            if self.qk_grads != "unavailable":
                self.qk_grads = "autograd"
        return q4, k4, tau * f.producer[2], grads

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for c in self._checks:
            if c.residuals is not None:
                self.residuals[len(self.residuals)] = c.residuals
            c.remove()
        self._checks.clear()

    def attrs(self):
        cfg = getattr(self.model, "config", None)
        out = {"adapter": self.name, "qk_grads": self.qk_grads, "model_type": getattr(cfg, "model_type", None),
               "attention": sorted({type(m).__name__ for m in self.modules})}
        if self.no_qk:
            out["qk_unavailable"] = self.no_qk
        return out


def _where(site: Site) -> str:
    what = ", ".join(x for x in (site.name, site.label) if x)
    return f"layer {site.layer}" + (f" ({what})" if what else "")


def _heads_of(t, B, H, n, what, error=DataflowRefusal) -> torch.Tensor:
    """(B, H|H_kv, n, d) from a product operand: (B·H, n, d), (B, H, n, d) or a broadcast (B|1, H_kv, n, d)."""
    d = t.shape[-1]
    if t.shape[-2] == n and t.numel() == B * H * n * d:
        return t.reshape(B, H, n, d)
    if t.dim() == 4 and t.shape[-2] == n and t.shape[0] in (1, B) and H % t.shape[1] == 0:
        return t.expand(B, t.shape[1], n, d)
    raise error(f"{what} of shape {tuple(t.shape)} does not unfold to (B={B}, H={H}, {n}, d)")


def _tau(f, allowed, shape) -> tuple[float, bool]:
    """``(τ, uniform)``: the factor with S = τ·(q kᵀ) + (terms without q, k), measured as ∂S/∂(q kᵀ)
    by autograd on a random positive probe (one backward through the score ops only), and whether
    it is the same on every entry α weighs (else dQ/dK must come from autograd, see ``_hooked``)."""
    P = f.producer[3]
    g = torch.Generator(device="cpu").manual_seed(0)
    probe = (1 + torch.rand(f.S.shape, generator=g, dtype=torch.float64)).to(f.S.device, f.S.dtype)
    (d,) = torch.autograd.grad(f.S, P, probe, retain_graph=True)
    if d.numel() != probe.numel():
        raise NoQK("the scores are not a reshape of the q·kᵀ product (their element counts differ)")
    _only_through_product(f, probe, d)
    tau_map = (d.to(torch.float64).reshape(shape) / probe.to(torch.float64).reshape(shape))[allowed]
    if tau_map.numel() == 0:
        if not bool(torch.isfinite(f.alpha).any()):
            raise DataflowRefusal("the model's own attention weights are NaN everywhere here (its scores are not "
                                  "finite), so nothing about them can be checked")
        raise DataflowRefusal("α weighs no key")
    tau = float(tau_map.median())
    if tau == 0:
        raise NoQK("the scores α weighs do not depend on q·kᵀ")
    spread = float(((tau_map - tau).abs() / abs(tau)).max())
    return tau, spread <= _TAU_TOL.get(P.dtype, 1e-5)


def _only_through_product(f, probe, d) -> None:
    """S must reach q and k through the product only: autograd's ∂S/∂q, ∂S/∂k on the probe equal the
    product's own backward of ∂S/∂(q kᵀ).  DeBERTa's c2p/p2c terms (q·pos_k, k·pos_q) fail here,
    and dQ/dK from τ dS k would miss them."""
    a, b, _, P, _ = f.producer
    ins = [t for t in (a, b) if t.requires_grad]
    if not ins:
        return
    full = torch.autograd.grad(f.S, ins, probe, retain_graph=True, allow_unused=True)
    own = torch.autograd.grad(P, ins, d, retain_graph=True, allow_unused=True)
    for x, y in zip(full, own):
        if x is None and y is None:
            continue
        if not all(bool(torch.isfinite(t).all()) for t in (x, y) if t is not None):
            raise DataflowRefusal("the model's own scores are not finite here (NaN/inf rows: e.g. a float32 "
                                  "softmax of float64's finfo.min), so nothing about them can be checked")
        err = 1.0 if x is None or y is None else float((x - y).norm() / y.norm().clamp_min(torch.finfo(y.dtype).tiny))
        if not err <= _TAU_TOL.get(y.dtype if y is not None else x.dtype, 1e-5):
            raise NoQK(f"the scores depend on q or k outside their product q·kᵀ (relative {err:.2g}: a "
                       "relative-position term such as DeBERTa's c2p/p2c), so dQ/dK would miss it")


def _hooked(views, q4, k4, H):
    """q, k as the hookable views the product read (:meth:`Tracer._graph_views`), for dQ/dK by autograd."""
    if views is None or views[0].shape != q4.shape or views[1].shape[1] != H:
        raise NoQK("the factor on q·kᵀ is not one number over the entries α weighs (soft-capping, a "
                   "per-entry scale, a masked row weighted uniformly) and q, k cannot be hooked here "
                   "(fewer k/v heads, or 3-D operands without a head count)")
    return views[0], views[1], "applied"


def detect(model, wanted=None, check_every: int = 10):
    named = candidates(model, wanted)
    return DataflowAdapter(model, named, check_every) if named else None
