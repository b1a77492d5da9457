"""The flight recorder: the cheap tier, every head on every step, through the observer seam.

Usage (the same for dyntool's modules, Hugging Face, TransformerLens and nanoGPT-style models)::

    flight = FlightRecorder(model, grad_scale=1 / accum)
    with flight:                          # around forward + backward (several micro-steps add up)
        loss = loss_fn(model(x))
        loss.backward()
    stats = flight.result()               # name -> (L, nh) tensor, see dyntool.cheap_stats
    row = flight.metrics()                # {"attn_entropy/L0H0": ..., "score_grad_norm/L0H0": ...}

Why it is cheap and what it keeps:
- during the forward it keeps *references* to q, k, v, the output and the mask (autograd keeps
  them alive for the attention's backward anyway: no copy, no extra memory);
- a *tensor* hook on the output (the same seam as :class:`dyntool.capture.Capture`) receives
  U = ∂L/∂out in the backward; the statistics are reduced right there in query-row blocks
  (:func:`dyntool.cheap_stats.accumulate`) and the references are dropped, so nothing T × T
  outlives a block and nothing per-token outlives the backward;
- score modifiers (bias, soft-cap, sinks) enter exactly as in the full tier; rows with no
  visible key follow the attention's own semantics, read off its output (0 or uniform);
- the result is a few (L, nh) tensors: one host sync when read.

The path (``kernel``, :mod:`dyntool.fused_path`): ``auto`` reduces in the fused Triton kernel
(:mod:`dyntool.kernels`) where it serves (dyntool's own attention on CUDA) and eagerly as above
elsewhere; ``eager`` always eagerly; ``fused`` demands the kernel (one-line refusal naming the site
and why not).  :meth:`FlightRecorder.paths` says which path each site took.  On a fused site the
kernel computes the attention itself and writes per-program partial sums; they are reduced when
:meth:`result` is called, so the step itself never waits on the host.

There is no self-check here (it would cost a T × T pass per layer on every step): the same seam
with a Capture checks the model on the full tier's steps, and the tests pin the cheap tier to the
full tier's reductions in float64.  With a Capture on the same step, :meth:`FlightRecorder.alongside`
feeds both from one adapter (Hugging Face and the SDPA adapter take one observer at a time).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from . import cheap_stats
from . import fused_path
from .adapters import AdapterError, find_adapter
from .capture import site_where
from .observe import Fanout, Observer, Site, expand_kv
from .pending import PendingMetrics
from .record import metric_names as mn
from .selfcheck import SelfCheckError, verify
from .tier_reduction import full_tier_reduction  # noqa: F401  (public here: the tiers side by side)

# the fused ops' per-head sums, by name, without importing Triton (a core install has none)
from .kernels import stats as kstats
from .kernels import stats_names as kstats_names

STATS = mn.CHEAP_TIER           # the statistics' names (= their metric bases), formulas in cheap_stats
# the block path's backward columns (kernels.stats.BACKWARD_SUMS order) → statistic names
_BLOCK_NAMES = tuple(cheap_stats.SUMS[n].stat for n in kstats_names.BACKWARD_SUMS)


class FlightError(RuntimeError):
    pass


class KernelRefused(FlightError):
    """record.kernel=fused where the kernel cannot serve a site (a user's choice, not a bug)."""


class _Pending:
    __slots__ = ("q", "k", "v", "o", "allowed", "scale", "bias", "softcap", "sinks", "uniform", "alpha", "maxima")


def _mapped_uniform_rows(site, p: "_Pending", out: torch.Tensor, out_map):
    """Empty rows of attention whose output is ``out_map(o)``: 0 or uniform, told by the self-check
    (:func:`dyntool.selfcheck.verify`, which also refuses an output it can't reproduce)."""
    nh = p.q.shape[1]
    sinks = None if p.sinks is None else p.sinks.reshape(1, -1, 1, 1)
    try:
        return verify(p.q, expand_kv(p.k, nh), expand_kv(p.v, nh), out, p.allowed, p.scale, p.bias,
                      p.softcap, sinks, what=site_where(site), out_map=out_map)
    except SelfCheckError as e:
        raise FlightError(str(e)) from None


class FlightRecorder(Observer):
    takes_alpha = True        # observe(alpha=…): the dataflow adapter's model-made α, reduced as it is

    def __init__(self, model: torch.nn.Module, *, grad_scale: float = 1.0, seqs: int | None = None,
                 max_block_mib: float = 0.0, attention=None, kernel: str = "auto"):
        try:
            self.adapter = find_adapter(model, attention)
        except AdapterError as e:
            raise FlightError(str(e)) from None
        self.sites: list[Site] = self.adapter.sites()
        if not self.sites:
            raise FlightError(f"model has no attention modules to record ({self.adapter.name} adapter)")
        if not max_block_mib >= 0:              # 0: sized for the device (cheap_stats.block_budget_mib)
            raise FlightError(f"record.max_block_mib must be > 0 (MiB) or 0 (sized for the device), "
                              f"got {max_block_mib}")
        self.grad_scale, self.seqs, self.max_block_mib = float(grad_scale), seqs, float(max_block_mib)
        self._sums: dict[Site, cheap_stats.Sums] = {}
        self._pending = 0                 # forwards whose backward has not reached the hook yet
        self._handles: list = []
        self._attached = False
        try:
            self.kernel = fused_path.check_kernel(kernel)
        except ValueError as e:
            raise FlightError(str(e)) from None
        self._paths = fused_path.decide(self.adapter, model, self.kernel)
        if self.kernel == "fused":
            for i, s in enumerate(self.sites):
                if self._paths[s] != "fused":
                    raise KernelRefused(f"record.kernel=fused: {fused_path.site_name(i, s)}: "
                                      f"{self._paths[s].removeprefix('eager: ')}")
        self._fused = fused_path.sites_for(self.adapter, self._paths,
                                           lambda s, *call: self._calls.append((s, *call, self.grad_scale)),
                                           self.kernel)
        for fs in self._fused.values():
            fs.seqs = seqs or 0
        if hasattr(self.adapter, "fused"):          # Hugging Face: the dyntool_fused registry entry
            self.adapter.fused = bool(self._fused)
        self._calls: list = []            # fused forwards: (site, forward sums, token, sequences, T, sinks?, grad scale)
        self._token_sizes: dict = {}      # site -> the token's length for a compiled step (prepare)
        self._device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self._pinned: dict = {}          # shape -> pinned host buffers, reused (PendingMetrics)
        self._divisors: dict = {}        # (grad scale, rows, seqs, device) -> the block path's divisors
        self._block: tuple | None = None  # (calls it read, result() of the block path), until reset()

    def prepare(self, batch: int, T: int) -> None:
        """Make compiled steps of (batch, T) recordable: every site must be on the fused path of
        dyntool's own attention (a compiled graph cannot hold the observer seam's Python work).
        Reads each mask at length T now and, from then on, makes the kernel's token for each site
        in :meth:`__enter__`, outside the graph.  One forward per ``with`` on a compiled step."""
        bad = [fused_path.site_name(i, s) for i, s in enumerate(self.sites)
               if not isinstance(self._fused.get(s), fused_path.FusedSite) or self._fused[s].failed]
        if bad:
            raise FlightError(f"a compiled step is recorded through the fused kernel of dyntool's attention only; "
                              f"not on {', '.join(bad)} ({self.paths()[bad[0]]})")
        try:
            self._token_sizes = {s: fs.prepare(batch, T) for s, fs in self._fused.items()}
        except ValueError as e:
            raise FlightError(str(e)) from None

    @property
    def compilable(self) -> bool:
        """:meth:`prepare` succeeded and no site fell back since: a compiled step can be recorded."""
        return bool(self._token_sizes) and not any(fs.failed for fs in self._fused.values())

    def paths(self) -> dict[str, str]:
        """{site: "fused" | "eager: <reason>"}: the path each site's statistics take."""
        failed = {s: "eager: " + fs.failed for s, fs in self._fused.items() if fs.failed}
        return {fused_path.site_name(i, s): failed.get(s, self._paths[s]) for i, s in enumerate(self.sites)}

    def _arm(self, on: bool) -> None:
        for fs in self._fused.values():
            fs.arm(on and not fs.failed)

    # -- context management -------------------------------------------------------------
    def __enter__(self) -> "FlightRecorder":
        if self._token_sizes:                     # fresh tokens, made outside a compiled graph:
            # one allocation for the step, each site's slice its own leaf; never filled, since
            # only a token's gradient is ever read (the op takes it for its autograd edge)
            sizes = list(self._token_sizes.values())
            block = torch.empty(sum(sizes), device=self._device)
            for s, t in zip(self._token_sizes, block.split(sizes)):
                self._fused[s].token = t.detach().requires_grad_()
        self.adapter.attach(self)
        self._arm(True)
        self._attached = True
        return self

    def __exit__(self, *exc) -> None:
        self._arm(False)
        for fs in self._fused.values():
            fs.token = None
        self._drop_handles()
        if self._attached:
            self.adapter.detach()
            self._attached = False

    def _drop_handles(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @contextmanager
    def alongside(self, capture):
        """Feed this recorder and ``capture`` (a :class:`~dyntool.capture.Capture` of the same
        model) from one adapter: ``with flight.alongside(cap): ...`` replaces ``with cap:``."""
        if hasattr(capture.adapter, "fused"):
            capture.adapter.fused = bool(self._fused)
        capture.adapter.attach(Fanout([capture, self]))
        self._arm(True)
        try:
            yield capture
        finally:
            self._arm(False)
            self._drop_handles()
            capture.__exit__(None, None, None)
            if hasattr(capture.adapter, "fused"):
                capture.adapter.fused = False         # its handles and the adapter

    @contextmanager
    def logits(self):
        """Only the per-step max |logit| of each head, from the fused kernel's forward statistics
        (no observer, no backward statistics, nothing read): what a compiled step that records
        no cheap tier still reports (``train.logit_stat = exact``).  Read with :meth:`logit_max`."""
        for fs in self._fused.values():
            fs.mode = "logits"
        self._arm(True)
        try:
            yield self
        finally:
            self._arm(False)
            for fs in self._fused.values():
                fs.mode = "stats"

    def logit_max(self) -> torch.Tensor:
        """(L, nh) max |τ q·k| of the forwards run under :meth:`logits` since the last call (NaN
        for a site that ran none); those forwards are consumed."""
        per: dict = {}
        keep = []
        for call in self._calls:
            if call[2] is not None:
                keep.append(call)
                continue
            m = call[1][:, 2]                                                 # (H,)
            per[call[0]] = m if call[0] not in per else torch.maximum(per[call[0]], m)
        self._calls = keep
        if not per:
            raise FlightError("no attention ran through the fused kernel under FlightRecorder.logits()")
        return self._by_site(per)

    # -- the observer contract (dyntool.observe), called during the forward ----------------
    def observe(self, site: Site, q, k, v, out, allowed, scale, heads_dim: int = 1, grads: str = "standard",
                scores=None, bias=None, softcap=None, sinks=None, out_map=None, grad_map=None,
                out_batch_dim: int = 0, alpha=None, logits=None) -> None:
        """As :meth:`dyntool.capture.Capture.observe`; ``out_map``/``grad_map`` (torch's
        ``nn.MultiheadAttention``, whose per-head output is never exposed): the empty-row decision
        comes from the self-check against ``out_map`` and U from ``grad_map(∂L/∂out)``.  ``alpha``
        with ``logits`` (τ q kᵀ) and ``scores`` (all (B, nh, T, Tk); the dataflow adapter between its
        checks): the model's own α is reduced as it is and ``scale`` is not read (no host read)."""
        fs = self._fused.get(site)
        if not out.requires_grad or not torch.is_grad_enabled() or (fs is not None and fs.last == id(out)):
            return                        # an evaluation forward (no U will come), or the kernel's
        sl = slice(None) if self.seqs is None else slice(0, self.seqs)
        p = _Pending()
        p.q, p.k, p.v = q[sl].detach(), k[sl].detach(), v[sl].detach()
        if out_map is None:
            o = out[sl].detach()
            p.o = o.transpose(1, 2) if heads_dim == 2 else o                # (S, nh, T, d_v)
        else:
            p.o = None                      # not exposed (and the statistics never read it)
        allowed = allowed if allowed.dim() == 4 else allowed.reshape((1,) * (4 - allowed.dim()) + allowed.shape)
        p.allowed = allowed[sl] if allowed.shape[0] > 1 else allowed        # (S|1, nh|1, T, Tk)
        if bias is not None:
            bias = bias.detach()
            bias = bias if bias.dim() == 4 else bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
            bias = bias[sl] if bias.shape[0] > 1 else bias
        p.bias, p.softcap, p.alpha, p.maxima = bias, (float(softcap) if softcap else None), None, None
        p.sinks = None if sinks is None else sinks.detach().reshape(-1)     # (nh,)
        p.scale = None if alpha is not None else float(scale)
        if alpha is not None:             # empty rows are in α as the model made them
            p.alpha, p.uniform = alpha[sl].detach(), None
            p.maxima = cheap_stats.given_maxima(logits[sl], scores.detach()[sl], p.allowed)
        # empty rows: 0 (SDPA) or uniform (additive mask)? decided from the output, now
        elif out_map is None:
            p.uniform = cheap_stats.uniform_rows(p.v, p.o, p.allowed, p.sinks, p.q.shape[1])
        else:
            p.uniform = _mapped_uniform_rows(site, p, out.detach().narrow(out_batch_dim, 0, p.q.shape[0]), out_map)
        self._pending += 1

        def on_u(grad, p=p, site=site, sl=sl, hd=heads_dim):
            if grad_map is not None:
                self._reduce(site, p, grad_map(grad.detach())[sl])          # (S, nh, T, d_v)
                return
            u = grad[sl].detach()
            self._reduce(site, p, u.transpose(1, 2) if hd == 2 else u)      # (S, nh, T, d_v)
        self._handles.append(out.register_hook(on_u))

    def _reduce(self, site: Site, p: _Pending, u: torch.Tensor) -> None:
        sums = self._sums.get(site)
        if sums is None:
            sums = self._sums[site] = cheap_stats.Sums(p.q.shape[1], cheap_stats.compute_dtype(p.q.dtype),
                                                       p.q.device)
        # in their own dtype (bf16 under autocast): accumulate casts each block's slice to fp32 as it
        # reads it, so no fp32 copy of q, k, v, U or a bias is held through the backward
        cheap_stats.accumulate(sums, p.q, p.k, p.v, p.o, u, p.allowed, p.scale, bias=p.bias, softcap=p.softcap,
                               sinks=p.sinks, uniform=p.uniform, max_block_mib=self.max_block_mib,
                               grad_scale=self.grad_scale, alpha=p.alpha, maxima=p.maxima)
        for f in _Pending.__slots__:       # the references go now: memory back during the backward
            setattr(p, f, None)
        self._pending -= 1

    # -- after backward -----------------------------------------------------------------
    def result(self) -> dict[str, torch.Tensor]:
        """Statistics since the last :meth:`reset`: name -> (L, nh) tensor, rows in ``sites``
        order (NaN for a site that recorded nothing, e.g. a head count that differs)."""
        if self._block is None or self._block[0] != len(self._calls):    # new forwards since: again
            self._block = (len(self._calls), self._fused_block())
        if self._block[1] is not None:
            return self._block[1]
        self._reduce_fused()
        waiting = self._pending + sum(c[2] is not None for c in self._calls)
        if waiting:
            raise FlightError(f"{waiting} attention output(s) never received their gradient: call backward() inside "
                              "the recorder, and compile a recorded step only after FlightRecorder.prepare()")
        if not self._sums:
            raise FlightError("no attention ran with gradients inside the flight recorder")
        per = {s: self._sums[s].finish() for s in self.sites if s in self._sums}
        ref = next(iter(per.values()))
        return {name: self._by_site({s: d[name] for s, d in per.items() if name in d}) for name in ref}

    def _by_site(self, per: dict) -> torch.Tensor:
        """{site: (nh_site,)} → (L, nh), rows in ``sites`` order, NaN where a site has no value
        (it recorded nothing, or has fewer heads than the widest)."""
        ref = next(iter(per.values()))
        out = torch.full((len(self.sites), max(x.shape[0] for x in per.values())), float("nan"),
                         dtype=ref.dtype, device=ref.device)
        for i, s in enumerate(self.sites):
            if s in per:
                out[i, : per[s].shape[0]] = per[s]
        return out

    def _reduce_fused(self) -> None:
        """The fused sites' per-head sums (forward's, and the backward's in each token's grad) → Sums."""
        if all(call[2] is None for call in self._calls):
            return                          # no fused site ran: the eager path works without Triton
        left, seen = [], set()
        for call in self._calls:
            site, fst, token, seqs, T, has_sinks, grad_scale = call
            if token is None:               # a logits() forward: read by logit_max()
                left.append(call)
                continue
            if id(token) in seen:           # its gradient would hold two forwards' partials, summed
                raise FlightError("two forwards of one site inside one `with` of a compiled step: "
                                  "enter the flight recorder once per forward")
            seen.add(id(token))
            if token.grad is None:          # no backward yet: counted as pending in result()
                left.append(call)
                continue
            S, H = seqs, fst.shape[0]
            parts = kstats.head_sums(fst, token.grad)
            sums = self._sums.get(site)
            if sums is None:
                sums = self._sums[site] = cheap_stats.Sums(H, torch.float32, fst.device)
            kstats.add_to(sums, parts, S, T, grad_scale, has_sinks)
        self._calls = left

    def _fused_block(self) -> dict[str, torch.Tensor] | None:
        """Every site fused, each forward in rounds of the sites' order with one shape: all sites'
        statistics from a fixed handful of device ops (two stacks, two reductions, one division, one
        sqrt), no per-site loop and no host read.  None where that does not hold (the general path)."""
        calls, L = self._calls, len(self.sites)
        if (self._sums or self._pending or not calls or len(calls) % L or len(self._fused) != L
                or any(fs.failed for fs in self._fused.values())):
            return None
        first = calls[0]
        if any(c[0] != self.sites[i % L] or c[2] is None or c[2].grad is None or c[1].shape != first[1].shape
               or c[3:] != first[3:] for i, c in enumerate(calls)):
            return None
        if len({id(c[2]) for c in calls}) != len(calls):
            raise FlightError("two forwards of one site inside one `with` of a compiled step: "
                              "enter the flight recorder once per forward")
        R, H = len(calls) // L, first[1].shape[0]
        _, _, _, seqs, T, has_sinks, g = first
        f = torch.stack([c[1] for c in calls]).view(R, L, H, len(kstats_names.FORWARD_SUMS))
        b = torch.stack([c[2].grad for c in calls]).view(R, L, H, len(kstats_names.BACKWARD_SUMS)).sum(0)
        fs, fm = f.sum(0), f.amax(0)
        div, roots = self._block_divisors(g, R * seqs * T, R * seqs, b.device)
        b = b / div
        b = torch.where(roots, b.clamp_min(0).sqrt(), b)                # the norms' columns
        rows = float(R * seqs * T)
        out = dict(zip(_BLOCK_NAMES, b.unbind(-1)))
        col = {n: i for i, n in enumerate(kstats_names.FORWARD_SUMS)}
        out.update({mn.SCORE_MAX: fm[..., col["score_max"]], mn.LOGIT_MAX: fm[..., col["logit_max"]],
                    cheap_stats.SUMS["ent"].stat: fs[..., col["ent"]] / rows})
        if has_sinks:
            out[cheap_stats.SUMS["sink"].stat] = fs[..., col["sink"]] / rows
        return out

    def _block_divisors(self, g: float, rows: int, seqs: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(7,) each: what each backward sum is divided by (its count, times the power of the grad
        scale U carries) and which take a square root, made once per (g, rows, seqs, device): no
        host-to-device copy per step."""
        key = (float(g), rows, seqs, str(device))
        if key not in self._divisors:
            count = {"rows": rows, "seqs": seqs}
            specs = [cheap_stats.SUMS[n] for n in kstats_names.BACKWARD_SUMS]
            self._divisors[key] = (torch.tensor([float(count[s.per] * g ** s.u_power) for s in specs], device=device),
                                   torch.tensor([s.root for s in specs], device=device))
        return self._divisors[key]

    def metrics(self, result: dict | None = None) -> dict[str, float]:
        """``{base/L{l}H{h}: value}`` for every statistic (names from record.metric_names): one read."""
        return self.metrics_later(result).get()

    def metrics_later(self, result: dict | None = None) -> PendingMetrics:
        """:meth:`metrics` without waiting: the values leave the device by a non-blocking copy into
        pinned memory (CUDA) and :meth:`PendingMetrics.get` waits for that copy alone, so a trainer
        launches its optimizer first and reads the row at the step's own sync."""
        res = self.result() if result is None else result
        names = [n for n in STATS if n in res]
        vals = torch.stack([res[n] for n in names]).to(torch.float64)                  # (n, L, nh)
        return PendingMetrics(names, vals, self._pinned)

    def reset(self) -> None:
        self._block = None
        self._sums.clear()
        self._calls.clear()
        self._pending = 0
        self._drop_handles()
