"""Per logged step of an ICL-MC run: KL(strategy ‖ model) on held-out chains and the attention
scores per head with their chance levels.

* KL to each strategy (:mod:`dyntool.sims.icl_markov_task`), averaged over positions and
  held-out sequences, in nats; also the held-out loss on the observed next states.
* previous-token score of a head: α_{i,i−1} averaged over queries i ≥ 1 and sequences; chance
  (uniform causal attention) is the mean of 1/(i+1) over the same queries;
* induction score: the attention mass on keys j ≤ i right after an earlier occurrence of the
  current state (x_{j−1} = x_i), averaged over the queries that have such a key; chance is the
  share of such keys among the i + 1 visible ones, averaged over the same queries.

* key-type lifts (``lift_{type}/L{l}H{h}``): the visible keys j ≤ i of query i split four ways,
  ``same`` (x_j = x_i only), ``induction`` (x_{j−1} = x_i only), ``both`` and ``neither``; a type's
  lift at a query is its attention mass over its share of the visible keys (1: no preference),
  averaged over the queries that have a key of that type.  The induction score mixes attending to
  induction keys with avoiding same-token keys (both raise it); ``induction / neither`` is the
  induction-specific part.

The attention probabilities are recomputed from each layer's q, k seen through the observer seam
(:class:`dyntool.observe.KeepQK`, the same q, k the recorders see), so the scores do not depend on
the attention backend.
"""
from __future__ import annotations

import torch

from .. import masks
from ..observe import KeepQK
from ..record import metric_names as mn
from . import icl_markov_task as task


@torch.no_grad()
def forward_with_attention(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits (B, T, k), per layer α (B, nh, T, T)) for states ``x`` (B, T)."""
    keeps = [KeepQK() for _ in model.cores()]
    for core, keep in zip(model.cores(), keeps):
        core.attach(keep)
    try:
        logits = model(x)
    finally:
        for core, keep in zip(model.cores(), keeps):
            core.detach(keep)
    alphas = []
    for keep in keeps:
        q, k = keep.q.double(), keep.k.double()                         # (B, nh, T, hs)
        s = (q @ k.transpose(-1, -2)) * keep.scale
        s = s.masked_fill(~keep.allowed, float("-inf"))                 # allowed: (1, nh|1, T, T)
        alphas.append(torch.softmax(s, -1))                             # (B, nh, T, T)
    return logits, alphas


def induction_keys(x: torch.Tensor) -> torch.Tensor:
    """(B, T, T) boolean: key j is visible to query i (j ≤ i), j ≥ 1, and x_{j−1} = x_i."""
    B, T = x.shape
    prev = torch.cat([torch.full((B, 1), -1, dtype=x.dtype, device=x.device), x[:, :-1]], 1)   # x_{j-1}
    hit = prev[:, None, :] == x[:, :, None]                               # (B, i, j)
    return hit & masks.causal().dense(T, device=x.device)                 # (1, T, T): j <= i


def chance_levels(x: torch.Tensor) -> dict[str, float]:
    """The scores of uniform causal attention on ``x``: previous token and induction."""
    T = x.shape[1]
    i = torch.arange(1, T, dtype=torch.float64)
    ind = induction_keys(x)
    has = ind.any(-1)                                                     # (B, T)
    share = ind.sum(-1).double() / torch.arange(1, T + 1, dtype=torch.float64)
    return {"prev_token": float((1.0 / (i + 1)).mean()), "induction": float(share[has].mean())}


KEY_TYPES = ("same", "induction", "both", "neither")


def key_types(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four exclusive key types of the visible keys: name -> (B, T, T) boolean (query i, key j)."""
    T = x.shape[1]
    vis = masks.causal().dense(T, device=x.device)                        # (1, T, T)
    same = (x[:, None, :] == x[:, :, None]) & vis
    ind = induction_keys(x)
    return {"same": same & ~ind, "induction": ind & ~same, "both": same & ind, "neither": vis & ~same & ~ind}


def key_type_lifts(alpha: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """α (B, nh, T, T) of one layer -> lift per key type, {type: (nh,)} (NaN where no query has one)."""
    T = x.shape[1]
    n_vis = torch.arange(1, T + 1, dtype=alpha.dtype, device=alpha.device).view(1, T)
    out = {}
    for name, sel in key_types(x).items():
        n = sel.sum(-1).to(alpha.dtype)                                   # (B, T)
        mass = (alpha * sel[:, None].to(alpha.dtype)).sum(-1)            # (B, nh, T)
        has = n > 0
        lift = mass / (n / n_vis).clamp_min(1e-300)[:, None]
        out[name] = (lift * has[:, None]).sum(dim=(0, 2)) / has.sum() if has.any() else \
            torch.full((alpha.shape[1],), float("nan"), dtype=alpha.dtype)
    return out


def attention_scores(alpha: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """α (B, nh, T, T) of one layer -> {"prev_token": (nh,), "induction": (nh,)}."""
    T = x.shape[1]
    i = torch.arange(1, T)
    prev = alpha[:, :, i, i - 1].mean(dim=(0, 2))                         # (nh,)
    ind = induction_keys(x)
    has = ind.any(-1)                                                     # (B, T)
    mass = (alpha * ind[:, None].to(alpha.dtype)).sum(-1)                  # (B, nh, T)
    induction = (mass * has[:, None]).sum(dim=(0, 2)) / has.sum()
    return {"prev_token": prev, "induction": induction}


def evaluate(model, x: torch.Tensor, strategies: dict[str, torch.Tensor], scores: bool = True) -> dict[str, float]:
    """One logged step's metrics on the held-out states ``x`` (B, T): KL to each strategy, the
    held-out loss, and (``scores``) the attention scores and key-type lifts per layer and head
    (metric names from metric_names)."""
    was = model.training
    model.eval()
    try:
        logits, alphas = forward_with_attention(model, x)
    finally:
        model.train(was)
    logq = torch.log_softmax(logits.double(), -1)
    row = {mn.icl_kl(name): v for name, v in task.strategy_kls(logq, strategies).items()}
    row[mn.icl_heldout("loss")] = float(-logq[:, :-1].gather(-1, x[:, 1:, None]).mean())
    if not scores:
        return row
    for l, a in enumerate(alphas):
        for name, per_head in attention_scores(a, x).items():
            for h, v in enumerate(per_head.tolist()):
                row[mn.head(mn.icl_score(name), l, h)] = v
        for name, per_head in key_type_lifts(a, x).items():
            for h, v in enumerate(per_head.tolist()):
                row[mn.head(icl_lift(name), l, h)] = v
    return row


def icl_lift(key_type: str) -> str:
    """The metric base of a key type's lift (per head via metric_names.head)."""
    if key_type not in KEY_TYPES:
        raise ValueError(f"key type must be one of {KEY_TYPES}, got {key_type!r}")
    return f"lift_{key_type}"
