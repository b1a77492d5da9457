"""Which path each attention site's cheap tier takes: the fused Triton kernel or the eager reduction.

``record.kernel`` (``FlightRecorder(model, kernel=...)``, ``RunRecorder``, the callbacks,
``dyntool train --record.kernel=...``):

- ``auto`` (default): the fused kernel (:mod:`dyntool.kernels`) where it can serve (CUDA with
  Triton), the eager reduction (:mod:`dyntool.cheap_stats`) elsewhere;
- ``eager``: always the eager reduction;
- ``fused``: the kernel or a one-line refusal naming the site and the reason (on the CPU it runs
  under ``TRITON_INTERPRET=1``, set before dyntool.kernels is imported: slow, for tests).

Where the kernel serves, it *computes* the site's attention on recorded steps (output and
gradients from one pass that also writes the statistics); elsewhere the model's own attention
runs and the observer seam feeds the eager reduction.  :func:`decide` gives the map
{site: "fused" | "eager: <reason>"} that ``FlightRecorder.paths()`` returns and runs keep in meta.
Served today: dyntool's own ``AttentionCore`` (mhsa, ls, qknorm) with causal, sliding-window or
full masks (span keeps its own backward, and so the eager path), the Hugging Face decoders
whose attention the tests pin (``HF_MODEL_TYPES``) through the ``dyntool_fused`` registry entry,
and nanoGPT-style modules' mask-free ``F.scaled_dot_product_attention`` calls (SDPA adapter).
"""
from __future__ import annotations

import warnings

import torch

from .adapters import hf, sdpa
from .kernels import unavailable
from .observe import causal_allowed

KERNELS = ("auto", "eager", "fused")
# Hugging Face model types checked against the eager path (tests/kernels/test_hf_fused.py): their
# scores are τ q·k (+ soft-cap), their masks causal + padding (+ window), sinks as s_aux.  Others
# (ALiBi or T5's bias in a float mask, cross-attention, ...) stay eager until tested.
HF_MODEL_TYPES = ("gpt2", "llama", "mistral", "gemma2", "gpt_oss")


def check_kernel(kernel: str) -> str:
    if kernel not in KERNELS:
        raise ValueError(f"record.kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    return kernel


def site_name(index: int, site) -> str:
    """The key of a site in ``paths()``: L{index}, with the module path when the adapter knows it."""
    return f"L{index}" + (f" ({site.name})" if site.name else "")


def mask_spec(mask, n_head: int, T: int):
    """``(causal, windows)`` that reproduce ``mask`` at length T exactly, or a reason string.

    Read off the dense mask on the CPU (no device sync), once per (mask, T): full → not causal;
    causal with a window of w keys per head (w = the last row's visible keys; 0 = none) when each
    head's matrix equals :func:`dyntool.observe.causal_allowed` with that window."""
    dense = mask.dense(T, n_head)                                   # (nh|1, T, T) on the CPU
    if bool(dense.all()):
        return False, None
    wins = []
    for h in range(dense.shape[0]):
        w = int(dense[h, T - 1].sum())
        w = 0 if w == T else w
        if not torch.equal(dense[h], causal_allowed(T, T, w or None)):
            return f"mask {mask.name} is neither causal, a causal sliding window nor full"
        wins.append(w)
    if not any(wins):
        return True, None
    return True, wins if len(wins) > 1 else wins * n_head


def decide(adapter, model, kernel: str) -> dict:
    """{Site: "fused" | "eager: <reason>"} for every site of ``adapter``."""
    sites = adapter.sites()
    if kernel == "eager":
        return {s: "eager: record.kernel=eager" for s in sites}
    cores = getattr(adapter, "cores", None)
    if cores is None and adapter.name not in ("hf", "sdpa"):
        return {s: f"eager: the {adapter.name} adapter has no fused path yet" for s in sites}
    p = next(model.parameters(), None)
    device = p.device if p is not None else torch.device("cpu")
    why = unavailable(device)
    if why is None and kernel == "auto" and device.type != "cuda":
        why = f"auto picks the kernel on CUDA only (device {device.type})"
    if why is None and p is not None and p.dtype == torch.float64:
        why = "float64 model (the kernel computes in fp32)"
    if why is None and p is not None and p.dtype == torch.bfloat16 and device.type != "cuda":
        why = "bfloat16 under the Triton interpreter (numpy has no bfloat16)"
    if adapter.name == "sdpa":              # a call with attn_mask runs SDPA and is recorded eagerly
        return {s: "fused" if why is None else "eager: " + why for s in sites}
    if cores is None:                                               # Hugging Face
        mtype = getattr(getattr(model, "config", None), "model_type", None)
        if why is None and mtype not in HF_MODEL_TYPES:
            why = f"Hugging Face model type {mtype} is not verified with the fused path"
        return {s: "fused" if why is None else "eager: " + why for s in sites}
    out = {}
    for s, core in zip(sites, cores):
        if why is not None:
            out[s] = "eager: " + why
        elif core.attend_fn is not None:
            out[s] = "eager: span keeps its own backward"
        else:
            spec = mask_spec(core.mask, core.n_head, 64)
            out[s] = "fused" if not isinstance(spec, str) else "eager: " + spec
    return out


def sites_for(adapter, paths: dict, on_call, kernel: str = "fused") -> dict:
    """{site: FusedSite | SDPAFusedSite | HFFusedSite} for the sites whose path is "fused".  With
    ``kernel="auto"`` a kernel that fails to build or launch sends its site back to the eager path
    (with a warning and the reason in ``failed``) instead of failing the step."""
    mods = getattr(adapter, "cores", None) or getattr(adapter, "modules", [])
    kind = FusedSite if hasattr(adapter, "cores") else SDPAFusedSite if adapter.name == "sdpa" else HFFusedSite
    return {s: kind(m, lambda *call, s=s: on_call(s, *call), kernel == "auto")
            for s, m in zip(adapter.sites(), mods) if paths[s] == "fused"}


def autocast_inputs(q, k, v):
    """q, k, v in the autocast dtype where autocast is on, as SDPA takes them (it is on autocast's
    lower-precision list; the kernel is not).  Why: CUDA autocast runs LayerNorm in float32, so
    qknorm's normalised q, k arrive in float32 beside a bfloat16 v, which the kernel cannot mix."""
    dev = q.device.type
    if not torch.is_autocast_enabled(dev):
        return q, k, v
    dt = torch.get_autocast_dtype(dev)
    return q.to(dt), k.to(dt), v.to(dt)


class _Fused:
    """What every fused site does per forward: skip evaluation forwards, hand the kernel a token,
    keep (partials, token) through ``on_call``, and remember the output it made (``last``: the
    recorder's observer then knows this output needs no eager reduction).

    Eager, each forward gets a fresh token.  A compiled step cannot make a leaf tensor inside its
    graph, so there the token is made before the step (``token``, set by the flight recorder from
    :meth:`FusedSite.prepare`'s size) and read as a graph input; ``mode = "logits"`` runs the kernel
    with its forward statistics only (no token: the per-step max |logit| of a compiled step)."""

    def __init__(self, target, on_call, fallback: bool):
        self.target, self.on_call, self.fallback = target, on_call, fallback
        self.last, self.failed = None, None
        self.token: torch.Tensor | None = None
        self.mode = "stats"
        self.seqs = 0                          # the statistics see the first seqs sequences (0: all)

    def run(self, q, k, v, has_sinks=False, **kw):
        if self.failed or not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
            return None                        # an evaluation forward: the model's own attention
        from .kernels import op   # deferred: Triton loads only when a fused site runs
        q, k, v = autocast_inputs(q, k, v)
        if torch.compiler.is_compiling():
            return self._run_compiled(op, q, k, v, has_sinks, kw)
        token = None
        if self.mode == "stats":
            # never filled: only its gradient is read (the op takes it for its autograd edge)
            token = torch.empty(op.bwd_stats_size(q, k), device=q.device, requires_grad=True)
        try:
            y, _, fst = op.attention(q, k, v, token=token, stats=True, seqs=self.seqs, **kw)
        except Exception as e:                  # noqa: BLE001  auto: never fail a step for the kernel
            if not self.fallback or isinstance(e, ValueError):
                raise
            self.failed = f"the fused kernel failed ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
            warnings.warn(f"dyntool: {self.failed}; this site's cheap tier runs eagerly", RuntimeWarning, 2)
            self.arm(False)
            return None
        self.on_call(fst, token, self._rows(q), q.shape[-2], has_sinks)
        self.last = id(y)
        return y

    def _rows(self, q) -> int:
        return q.shape[0] if not self.seqs else min(self.seqs, q.shape[0])

    def _run_compiled(self, op, q, k, v, has_sinks, kw):
        token = self.token if self.mode == "stats" else None
        if self.mode == "stats" and (token is None or token.numel() != op.bwd_stats_size(q, k)):
            raise ValueError(f"record.kernel: a compiled step of shape {tuple(q.shape)} needs "
                             "FlightRecorder.prepare(batch, T) with that batch and length first")
        y, _, fst = op.attention(q, k, v, token=token, stats=True, seqs=self.seqs, **kw)
        self.on_call(fst, token, self._rows(q), q.shape[-2], has_sinks)
        return y


class FusedSite(_Fused):
    """One ``AttentionCore`` (dyntool's GPT): causal / window per head read off its mask."""

    def __init__(self, core, on_call, fallback=False):
        super().__init__(core, on_call, fallback)
        self.core = core
        self._specs: dict[int, tuple] = {}

    def arm(self, on: bool) -> None:
        self.core.fused_fn = self if on else None

    def prepare(self, batch: int, T: int) -> int:
        """Read the mask at length T now (a compiled step cannot: it is a host read) and return the
        token's length for a (batch, T) forward."""
        from .kernels import op   # deferred: Triton loads only when a fused site runs
        self._spec(T)
        return op.stats_numel(batch, self.core.n_head, T, T)

    def _spec(self, T: int):
        spec = self._specs.get(T)
        if spec is None:
            if torch.compiler.is_compiling():
                raise ValueError(f"record.kernel: a compiled step at T={T} needs FlightRecorder.prepare(batch, {T}) first")
            spec = self._specs[T] = mask_spec(self.core.mask, self.core.n_head, T)
        if isinstance(spec, str):
            raise ValueError(f"record.kernel=fused: layer {self.core.layer_index}: {spec} at T={T}")
        return spec

    def __call__(self, core, q, k, v, scale):
        causal, windows = self._spec(q.shape[-2])
        return self.run(q, k, v, causal=causal, window=windows, scale=scale)


class _Armed(_Fused):
    """A site its adapter finds by module id in the adapter's ``ARMED`` map (:meth:`armed`)."""

    def armed(self) -> dict:
        raise NotImplementedError

    def arm(self, on: bool) -> None:
        if on:
            self.armed()[id(self.target)] = self
        else:
            self.armed().pop(id(self.target), None)


class SDPAFusedSite(_Armed):
    """One nanoGPT-style module's ``F.scaled_dot_product_attention`` call (``adapters.sdpa``
    hands over the calls without ``attn_mask``)."""

    def armed(self) -> dict:
        return sdpa.ARMED

    def __call__(self, q, k, v, causal, scale):
        return self.run(q, k, v, causal=causal, scale=scale)


class HFFusedSite(_Armed):
    """One Hugging Face attention module (``adapters.hf``'s ``dyntool_fused`` entry passes the 2-D
    padding mask and the registry's keyword arguments)."""

    def armed(self) -> dict:
        return hf.ARMED

    def __call__(self, q, k, v, mask, causal, kw):
        y = self.run(q, k, v, kw.get("s_aux") is not None, causal=causal, scale=kw.get("scaling"),
                     window=kw.get("sliding_window"), softcap=kw.get("softcap"), sinks=kw.get("s_aux"), key_mask=mask)
        if y is None:
            return None
        out = y.transpose(1, 2).contiguous()                          # (B, T, nh, d) as the registry's
        self.last = id(out)
        return out
