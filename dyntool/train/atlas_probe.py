"""The atlas probe: a training callback that measures every head's atlas scores on fixed batches.

*Before* a step's update (so row ``step`` describes the model that the step's training loss is
of, and step 0 is the initial model), in eval mode (no dropout, no RNG drawn), on two fixed
batches run as one: ``probe_seqs`` WikiText windows (``data.probe_split``, evenly spread, as the
full tier's probe) and ``rep_seqs`` repeated random sequences ``[r, r]`` of length 2L (r: L
distinct tokens drawn uniformly from the ``rep_vocab`` most frequent training tokens, seed
``seed``, the same for every run).  Two schedules (docs/atlas.md, "Schedule"):

- the **forward scores** every ``every`` steps (default: every step): first-position mass and the
  sink metrics, previous-token and induction scores.  They need the attention maps only, so the
  forward stops after the last layer's attention (no lm_head, no grad): cheap;
- the **gradient side** every ``grad_every`` steps: the forward scores, plus the advantages, the
  first column's share of ‖∂L/∂S‖, the first token's value gradient, the per-position loss
  (Olsson's ICL score), the repeat gap and the copying score (OV eigenvalues).  It needs the loss,
  i.e. the full-vocabulary head forward and backward, which costs about a quarter of a training
  step at the cpu preset: thinned so the study stays within 1.05 × the cheap tier alone.

U = ∂L/∂(head output) comes from ``torch.autograd.grad`` on the outputs the observer seam hands
out, so no parameter's ``.grad`` is touched and the training step is unaffected (tested).
Formulas: :mod:`.atlas_scores`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .. import quantities as Q
from ..data.wikitext import fixed_batch
from ..errors import ConfigError
from ..observe import Observer
from ..record import metric_names as mn
from . import atlas_scores as S
from .trainer import Callback

# stable public metric names: per head ``BASE/L{l}H{h}`` for the bases, per model the scalars
HEAD_BASES = ("atlas_first_mass", "atlas_prev_token", "atlas_induction", "atlas_copying",
              "atlas_first_adv", "atlas_first_ds_share", "atlas_first_value_grad", "atlas_first_value_share",
              "atlas_prev_adv", "atlas_copy_adv")
SINK_GU, SINK_OURS = "atlas_sink_gu", "atlas_sink_ours"
ICL_GAP, REP_GAP = "atlas_icl_gap", "atlas_rep_gap"
PROBE_LOSS, REP_LOSS = "atlas_probe_loss", "atlas_rep_loss"


@dataclass
class AtlasSettings:
    every: int = 1             # the forward scores every N steps (1: every step)
    grad_every: int = 16       # the gradient side, the losses and the copying score every N steps
    probe_seqs: int = 4        # WikiText windows of the probe
    rep_seqs: int = 4          # repeated random sequences
    rep_vocab: int = 2000      # r is drawn from this many most frequent training tokens
    seed: int = 1234           # of the repeated sequences: the same in every run and arm
    copying: bool = True       # the OV eigenvalue score (C×C eigenvalues per head)

    def validate(self, prefix: str = "atlas.") -> None:
        for k in ("every", "grad_every", "probe_seqs", "rep_seqs", "rep_vocab"):
            if getattr(self, k) < 1:
                raise ConfigError(prefix + k, f"must be >= 1, got {getattr(self, k)}")

    def probes(self, step: int) -> str | None:
        """What step ``step`` measures: "grad" (everything), "forward" (the forward scores) or None."""
        return "grad" if step % self.grad_every == 0 else "forward" if step % self.every == 0 else None


class _Stop(Exception):
    """Raised by :class:`_Keep` after the last layer's attention on a forward-only probe."""


class _Keep(Observer):
    """Keeps each layer's q, k, v and output (references) of one forward; with ``stop_after`` set,
    ends the forward once that layer's attention ran (the forward scores need no more)."""

    def __init__(self):
        self.sites: list = []
        self.stop_after: int | None = None

    def observe(self, site, q, k, v, out, allowed, scale, heads_dim=1, grads="standard", scores=None,
                **modifiers):
        if modifiers or heads_dim != 1:       # the atlas formulas assume plain softmax attention
            raise ValueError(f"the atlas probe takes plain attention, got {sorted(modifiers) or 'heads_dim=2'}")
        self.sites.append((site.layer, q, k, v, out, allowed, scale))
        if site.layer == self.stop_after:
            raise _Stop


def repeated_batch(train: np.ndarray, vocab_size: int, n: int, L: int, top: int, seed: int) -> torch.Tensor:
    """``n`` sequences ``[r, r]`` (2L tokens), r = L distinct tokens of the ``top`` most frequent."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size)
    ids = torch.as_tensor(np.argsort(-counts, kind="stable")[:max(top, L)].copy())
    g = torch.Generator().manual_seed(seed)
    half = torch.stack([ids[torch.randperm(len(ids), generator=g)[:L]] for _ in range(n)])
    return torch.cat([half, half], dim=1)


class AtlasProbe(Callback):
    def __init__(self, settings: AtlasSettings | None = None):
        self.s = settings or AtlasSettings()
        self.rows: dict = {}

    def on_train_start(self, trainer) -> None:
        self.tr = trainer
        cfg, corpus = trainer.cfg, trainer.corpus
        T = cfg.data.block_size
        self.L = T // 2
        self.wiki = fixed_batch(corpus.split(cfg.data.probe_split), self.s.probe_seqs, T,
                                cfg.data.probe_offset, trainer.device)
        train = corpus.split("train")
        self.rep = repeated_batch(train, corpus.vocab_size, self.s.rep_seqs, self.L, self.s.rep_vocab,
                                  self.s.seed).to(trainer.device)
        # one batch of both (B_w + B_r, T): an odd T pads each repeat with one token whose loss is
        # ignored (causal: nothing before it changes; the rep scores read the first 2L rows only)
        rep = torch.cat([self.rep, self.rep[:, -1:].expand(-1, T - 2 * self.L)], dim=1)
        rep_y = torch.full_like(rep, -100)
        rep_y[:, :2 * self.L - 1] = self.rep[:, 1:]
        self.x = torch.cat([self.wiki[0], rep])
        self.y = torch.cat([self.wiki[1], rep_y])
        self.top = torch.as_tensor(np.argsort(-np.bincount(np.asarray(train, dtype=np.int64),
                                                           minlength=corpus.vocab_size),
                                              kind="stable")[:self.s.rep_vocab].copy()).to(trainer.device)
        self.windows = S.icl_windows(T)
        self.chance = {"first_mass": S.chance_first_mass(T), "prev_token": S.chance_prev_token(T),
                       "induction": S.chance_induction(self.L)}
        self.eps_ours = S.OURS_FACTOR * self.chance["first_mass"]

    def on_step_start(self, step: int) -> None:
        what = self.s.probes(step)
        self.rows = self.measure(grad=what == "grad") if what else {}

    def on_step_end(self, step: int, metrics: dict) -> None:
        metrics.update(self.rows)

    # -- the measurement ------------------------------------------------------------------
    def measure(self, grad: bool = True) -> dict[str, float]:
        """The forward scores, and with ``grad`` everything else (module docstring)."""
        model = self.tr.raw
        was = model.training
        keep = _Keep()
        cores = [blk.attn.core for blk in model.h]
        for c in cores:
            c.attach(keep)
        model.eval()
        try:
            if grad:
                with torch.enable_grad():
                    out = self._grad_pass(model, keep)
                if self.s.copying:
                    out.update(self._copying(model))
            else:
                out = self._forward_pass(model, keep)
        finally:
            for c in cores:
                c.detach(keep)
            for blk in model.h:       # the logit statistic's q, k reference (GPT.track_qk): not ours
                blk.clear_qk()
            model.train(was)
        return out

    @torch.no_grad()
    def _forward_pass(self, model, keep) -> dict[str, float]:
        keep.sites.clear()
        keep.stop_after = len(model.h) - 1
        try:
            model(self.x)
            raise RuntimeError("the atlas probe's forward did not reach the last layer's attention")
        except _Stop:
            pass
        finally:
            keep.stop_after = None
        per = {}
        for l, q, k, v, _, allowed, scale in keep.sites:
            dt = Q.compute_dtype(q.dtype)
            a, _ = Q.masked_softmax(torch.matmul(q.to(dt), k.to(dt).transpose(-1, -2)) * scale, allowed)
            per[l] = self._forward_scores(a)
        keep.sites.clear()
        return self._rows(per)

    def _forward_scores(self, a: torch.Tensor) -> dict[str, torch.Tensor]:
        nw, L2 = self.s.probe_seqs, 2 * self.L
        aw, ar = a[:nw], a[nw:, :, :L2, :L2]
        return {"atlas_first_mass": S.first_mass(aw), "atlas_prev_token": S.prev_token(aw),
                "atlas_induction": S.induction(ar, self.L)}

    def _grad_pass(self, model, keep) -> dict[str, float]:
        """One forward/backward of both batches: per layer α, A, dS, U (float32/64), the scores."""
        keep.sites.clear()
        logits, _ = model(self.x)
        lg = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()   # bf16 logits: CE in fp32
        tl = F.cross_entropy(lg.reshape(-1, lg.size(-1)), self.y.reshape(-1), reduction="none").view(self.y.shape)
        nw, L = self.s.probe_seqs, self.L
        wl, rl = tl[:nw], tl[nw:, :2 * L - 1]           # per-token losses (B, T), (B, 2L − 1)
        # the sum of the two batches' means: each sequence's U is that of its own batch's mean loss,
        # as if the batches ran separately (the sequences do not interact)
        us = torch.autograd.grad(wl.mean() + rl.mean(), [s[4] for s in keep.sites])
        per = {}
        for (l, q, k, v, _, allowed, scale), u in zip(keep.sites, us):
            dt = Q.compute_dtype(q.dtype)
            q, k, v, u = (t.detach().to(dt) for t in (q, k, v, u))
            a, _ = Q.masked_softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, allowed)
            b = Q.compatibility(u, v, allowed)
            adv = Q.advantage(a, b, allowed)
            ds = Q.score_grad(a, b)
            aw, advw, dsw, uw = a[:nw], adv[:nw], ds[:nw], u[:nw]
            dv = S.value_grads(aw, uw)
            per[l] = {**self._forward_scores(a), "atlas_first_adv": S.first_adv(advw),
                      "atlas_first_ds_share": S.first_ds_share(dsw), "atlas_first_value_grad": S.first_value_grad(dv),
                      "atlas_first_value_share": S.first_value_share(dv), "atlas_prev_adv": S.prev_adv(advw),
                      "atlas_copy_adv": S.copy_adv(adv[nw:, :, :2 * L, :2 * L], L)}
        keep.sites.clear()
        wl, rl = wl.detach(), rl.detach()
        scal = torch.stack([wl.mean(), rl.mean(), rl[:, L - 1:].mean() - rl[:, :L - 1].mean()]).tolist()
        out = self._rows(per)
        # targets 0..L−2 of a repeat are random, L−1..2L−2 are the repeat
        out.update({PROBE_LOSS: scal[0], REP_LOSS: scal[1], REP_GAP: scal[2],
                    ICL_GAP: S.position_loss_gap(wl, *self.windows)})
        return out

    def _rows(self, per: dict[int, dict[str, torch.Tensor]]) -> dict[str, float]:
        """Per layer {base: (nh,)} → the row's ``BASE/L{l}H{h}`` floats and the sink metrics, read
        from the device in one copy."""
        names = list(next(iter(per.values())))
        vals = torch.stack([torch.stack([per[l][n].double() for n in names]) for l in per]).cpu()  # (L, n, nh)
        fm = vals[:, names.index("atlas_first_mass")]
        out = {mn.head(n, l, h): (v if math.isfinite(v) else float("nan"))
               for l, rows in zip(per, vals.tolist()) for n, row in zip(names, rows) for h, v in enumerate(row)}
        out[SINK_GU], out[SINK_OURS] = S.sink_share(fm, S.GU_EPS), S.sink_share(fm, self.eps_ours)
        return out

    @torch.no_grad()
    def _copying(self, model) -> dict[str, float]:
        # one C×C Gram matrix of the top tokens' embeddings for every head (the V'×C product is the cost)
        gram = model.wte.weight[self.top].double().T @ model.lm_head.weight[self.top].double()
        gf = model.ln_f.weight if model.ln_f.weight is not None else None
        names, ovs = [], []
        for l, blk in enumerate(model.h):
            a = blk.attn
            C, nh = a.n_embd, a.n_head
            hs = C // nh
            for h in range(nh):
                wv = a.c_attn.weight[2 * C + h * hs: 2 * C + (h + 1) * hs]      # (hs, C): v = W_V x
                wo = a.c_proj.weight[:, h * hs:(h + 1) * hs]                   # (C, hs)
                ov = wo @ wv
                if blk.ln_1.weight is not None:
                    ov = ov * blk.ln_1.weight[None, :]
                if gf is not None:
                    ov = gf[:, None] * ov
                names.append(mn.head("atlas_copying", l, h))
                ovs.append(ov)
        return dict(zip(names, S.copying_batch(torch.stack(ovs), gram).tolist()))
