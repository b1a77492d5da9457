"""The atlas probe: a training callback that measures every head's atlas scores on fixed batches.

On every ``every``-th step, *before* the step's update (so row ``step`` describes the model that
the step's training loss is of, and step 0 is the initial model), it runs two extra
forward/backward passes of the uncompiled model in eval mode (no dropout, no RNG drawn):

- ``probe_seqs`` WikiText windows (``data.probe_split``, evenly spread, as the full tier's probe):
  first-position mass, previous-token score, their advantages, the first column's share of
  ‖∂L/∂S‖, the first token's value gradient, the per-position loss (Olsson's ICL score);
- ``rep_seqs`` repeated random sequences ``[r, r]`` of length 2L = T (r: L distinct tokens drawn
  uniformly from the ``rep_vocab`` most frequent training tokens, seed ``seed``, the same for
  every run): induction (prefix matching), the copy key's advantage, the loss of the repeat minus
  the loss of the first half.

U = ∂L/∂(head output) comes from ``torch.autograd.grad`` on the outputs the observer seam hands
out, so no parameter's ``.grad`` is touched and the training step is unaffected (tested).  The
copying score (Olsson's OV eigenvalues) needs parameters only.  Formulas: :mod:`.atlas_scores`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .. import quantities as Q
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
    every: int = 1             # probe every N steps (1: every step)
    probe_seqs: int = 4        # WikiText windows of the probe
    rep_seqs: int = 4          # repeated random sequences
    rep_vocab: int = 2000      # r is drawn from this many most frequent training tokens
    seed: int = 1234           # of the repeated sequences: the same in every run and arm
    copying: bool = True       # the OV eigenvalue score (C×C eigenvalues per head)

    def validate(self, prefix: str = "atlas.") -> None:
        from ..errors import ConfigError
        for k in ("every", "probe_seqs", "rep_seqs", "rep_vocab"):
            if getattr(self, k) < 1:
                raise ConfigError(prefix + k, f"must be >= 1, got {getattr(self, k)}")


class _Keep(Observer):
    """Keeps each layer's q, k, v and output (references) of one forward."""

    def __init__(self):
        self.sites: list = []

    def observe(self, site, q, k, v, out, allowed, scale, heads_dim=1, grads="standard", scores=None,
                **modifiers):
        if modifiers or heads_dim != 1:       # the atlas formulas assume plain softmax attention
            raise ValueError(f"the atlas probe takes plain attention, got {sorted(modifiers) or 'heads_dim=2'}")
        self.sites.append((site.layer, q, k, v, out, allowed, scale))


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
        from ..data.wikitext import fixed_batch
        self.tr = trainer
        cfg, corpus = trainer.cfg, trainer.corpus
        T = cfg.data.block_size
        self.L = T // 2
        self.wiki = fixed_batch(corpus.split(cfg.data.probe_split), self.s.probe_seqs, T,
                                cfg.data.probe_offset, trainer.device)
        train = corpus.split("train")
        self.rep = repeated_batch(train, corpus.vocab_size, self.s.rep_seqs, self.L, self.s.rep_vocab,
                                  self.s.seed).to(trainer.device)
        self.top = torch.as_tensor(np.argsort(-np.bincount(np.asarray(train, dtype=np.int64),
                                                           minlength=corpus.vocab_size),
                                              kind="stable")[:self.s.rep_vocab].copy()).to(trainer.device)
        self.windows = S.icl_windows(T)
        self.chance = {"first_mass": S.chance_first_mass(T), "prev_token": S.chance_prev_token(T),
                       "induction": S.chance_induction(self.L)}
        self.eps_ours = S.OURS_FACTOR * self.chance["first_mass"]

    def on_step_start(self, step: int) -> None:
        self.rows = self.measure() if step % self.s.every == 0 else {}

    def on_step_end(self, step: int, metrics: dict) -> None:
        metrics.update(self.rows)

    # -- the measurement ------------------------------------------------------------------
    def measure(self) -> dict[str, float]:
        model = self.tr.raw
        was = model.training
        keep = _Keep()
        cores = [blk.attn.core for blk in model.h]
        for c in cores:
            c.attach(keep)
        model.eval()
        try:
            with torch.enable_grad():
                out = self._wiki(model, keep)
                out.update(self._rep(model, keep))
            if self.s.copying:
                out.update(self._copying(model))
        finally:
            for c in cores:
                c.detach(keep)
            for blk in model.h:       # the logit statistic's q, k reference (GPT.track_qk): not ours
                blk.clear_qk()
            model.train(was)
        return out

    def _pass(self, model, keep, x, y):
        """Forward, per-token loss (B, T'), and per layer (α, A, dS, U) in float32/64."""
        keep.sites.clear()
        logits, _ = model(x)
        n = y.shape[1]
        lg = logits[:, :n]
        lg = lg if lg.dtype in (torch.float32, torch.float64) else lg.float()     # bf16 logits: CE in fp32
        tl = F.cross_entropy(lg.reshape(-1, lg.size(-1)), y.reshape(-1), reduction="none").view(y.shape)
        outs = [s[4] for s in keep.sites]
        us = torch.autograd.grad(tl.mean(), outs)
        layers = []
        for (l, q, k, v, _, allowed, scale), u in zip(keep.sites, us):
            dt = Q.compute_dtype(q.dtype)
            q, k, v, u = (t.detach().to(dt) for t in (q, k, v, u))
            a, _ = Q.masked_softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, allowed)
            b = Q.compatibility(u, v, allowed)
            adv = Q.advantage(a, b, allowed)
            layers.append((l, a, adv, Q.score_grad(a, b), u))
        keep.sites.clear()
        return tl.detach(), layers

    def _wiki(self, model, keep) -> dict[str, float]:
        x, y = self.wiki
        tl, layers = self._pass(model, keep, x, y)
        out = {PROBE_LOSS: float(tl.mean()), ICL_GAP: S.position_loss_gap(tl, *self.windows)}
        firsts = []
        for l, a, adv, ds, u in layers:
            dv = S.value_grads(a, u)
            fm = S.first_mass(a)
            firsts.append(fm)
            per = {"atlas_first_mass": fm, "atlas_prev_token": S.prev_token(a), "atlas_first_adv": S.first_adv(adv),
                   "atlas_first_ds_share": S.first_ds_share(ds), "atlas_first_value_grad": S.first_value_grad(dv),
                   "atlas_first_value_share": S.first_value_share(dv), "atlas_prev_adv": S.prev_adv(adv)}
            out.update(_heads(l, per))
        fm = torch.stack(firsts)
        out[SINK_GU], out[SINK_OURS] = S.sink_share(fm, S.GU_EPS), S.sink_share(fm, self.eps_ours)
        return out

    def _rep(self, model, keep) -> dict[str, float]:
        x = self.rep
        tl, layers = self._pass(model, keep, x, x[:, 1:])
        L = self.L                          # targets 0..L−2 are random, L−1..2L−2 are the repeat
        out = {REP_LOSS: float(tl.mean()), REP_GAP: float(tl[:, L - 1:].mean() - tl[:, :L - 1].mean())}
        for l, a, adv, _, _ in layers:
            out.update(_heads(l, {"atlas_induction": S.induction(a, L), "atlas_copy_adv": S.copy_adv(adv, L)}))
        return out

    @torch.no_grad()
    def _copying(self, model) -> dict[str, float]:
        # one C×C Gram matrix of the top tokens' embeddings for every head (the V'×C product is the cost)
        gram = model.wte.weight[self.top].double().T @ model.lm_head.weight[self.top].double()
        gf = model.ln_f.weight if model.ln_f.weight is not None else None
        out = {}
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
                out[mn.head("atlas_copying", l, h)] = S.copying_gram(ov, gram)
        return out


def _heads(l: int, per: dict[str, torch.Tensor]) -> dict[str, float]:
    names = list(per)
    vals = torch.stack([per[n].double() for n in names]).cpu().tolist()      # one host copy
    return {mn.head(n, l, h): (v if math.isfinite(v) else float("nan"))
            for n, row in zip(names, vals) for h, v in enumerate(row)}
