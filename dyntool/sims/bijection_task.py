"""The authors' wind tunnel as options of ``dyntool sim bijection`` (the ``[task]`` section; issue 26).

The authors' ``experiments/paper1_bijection/train.py`` (github.com/vishalmisra/bayesian-wind-tunnel,
the REPRODUCE command) differs from dyntool's default task in several ways
(``docs/wind_tunnel_differences.md`` has the full table).  Each difference that changes what is
trained or measured is an option here; the defaults are dyntool's task, unchanged:

* ``head``: ``logits`` (default) predicts every target from the value-token logits ids V..2V-1;
  ``pointer`` replaces the query's prediction by the authors' pointer head
  (:func:`pointer_logprobs`): a softmax over the similarity of the query's final *normed* hidden
  state to those of the L key positions, ``w_j = softmax_j(h_q · h_{x_j} / sqrt(C))``, whose mass
  is summed onto the paired values, ``p(v) = Σ_j w_j [π(x_j) = v]``.  The key positions keep the
  value logits.  (The authors ``scatter_`` ``log(w_j + 1e-9)`` onto the value ids, so with a
  repeated key one of its copies' weights survives and the log-softmax renormalises; here the
  copies' weights add up, which is the distribution the pointer defines.)
* ``loss``: ``keys_query`` (default): cross-entropy at the L key positions and the query;
  ``query``: at the query only (the authors' default); ``all_values``: the authors'
  ``--train_all_values``: the main loss averages the query and the L value positions (whose
  target is the value token sitting there, as in their script), plus ``aux_weight`` × the
  cross-entropy at the key positions (predicting the value that follows; their "aux" loss).
* ``readout``: ``resid_keys`` (default): the per-layer geometry of the residual stream and head
  outputs at the key positions, H in nats; ``normed_values`` adds the authors' read-out: the
  final normed hidden state (``ln_f`` output) at the L value positions, labelled with H_Bayes of
  that pair's value given the earlier pairs, in bits, logged as ``manifold/normed_values/…``
  beside the same position one-hot baseline (partial R² beyond it, ordering null).

Keys with replacement are the top-level ``with_replacement`` (it predates this section).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F

from ..config import NonNegFloat, Pattern
from .bijection_data import IGNORE

HEADS = ("logits", "pointer")
LOSSES = ("keys_query", "query", "all_values")
READOUTS = ("resid_keys", "normed_values")


def _choice(names: tuple[str, ...]) -> Pattern:
    return Pattern("|".join(names), " or ".join(names))


@dataclass
class BijectionTask:
    head: Annotated[str, _choice(HEADS)] = "logits"
    loss: Annotated[str, _choice(LOSSES)] = "keys_query"
    aux_weight: NonNegFloat = 1.0       # loss = all_values: weight of the key-position (aux) loss
    readout: Annotated[str, _choice(READOUTS)] = "resid_keys"

    def validate(self, prefix: str = "") -> None:
        pass                            # the choices and bounds are checked on the annotations

    @property
    def is_default(self) -> bool:
        return self == BijectionTask()


def pointer_logprobs(h_query: torch.Tensor, h_keys: torch.Tensor, values: torch.Tensor, V: int) -> torch.Tensor:
    """The pointer head's log-distribution over the V value classes.

    ``h_query`` (B, C), ``h_keys`` (B, L, C) (final normed hidden states), ``values`` (B, L) the
    value class 0..V-1 paired with each key position -> (B, V) log p(v), ``-inf`` for a value that
    no context key points to.  Differentiable everywhere it is finite (no log of 0 in the graph)."""
    C = h_query.shape[-1]
    logw = torch.log_softmax(torch.einsum("bc,blc->bl", h_query, h_keys) / math.sqrt(C), dim=-1)  # (B, L)
    hit = values[:, None, :] == torch.arange(V, device=values.device)[None, :, None]            # (B, V, L)
    fill = torch.finfo(logw.dtype).min / 4                          # finite: exp() underflows to 0 exactly
    lse = torch.logsumexp(torch.where(hit, logw[:, None, :], fill), dim=-1)                      # (B, V)
    return torch.where(hit.any(-1), lse, torch.full_like(lse, -math.inf))


def value_scores(model, tokens: torch.Tensor, V: int, head: str = "logits") -> torch.Tensor:
    """(B, T, V) scores of the value classes at every position (log-softmax gives the model's
    predictive distribution): the value-token logits, and with ``head = "pointer"`` the query row
    replaced by :func:`pointer_logprobs` of the final normed hidden states."""
    if head == "logits":
        return model(tokens)[0][..., V:2 * V]
    normed: list[torch.Tensor] = []
    hook = model.ln_f.register_forward_hook(lambda m, i, o: normed.append(o))
    try:
        logits = model(tokens)[0]
    finally:
        hook.remove()
    h = normed[0]                                                    # (B, T, C)
    L = (tokens.shape[1] - 1) // 2
    lp = pointer_logprobs(h[:, -1], h[:, 0:2 * L:2], tokens[:, 1:2 * L:2] - V, V)
    return torch.cat([logits[:, :-1, V:2 * V], lp[:, None].to(logits.dtype)], dim=1)


def query_only(targets: torch.Tensor) -> torch.Tensor:
    """Targets of the query-only loss: every position but the last set to IGNORE."""
    out = torch.full_like(targets, IGNORE)
    out[:, -1] = targets[:, -1]
    return out


def value_position_targets(tokens: torch.Tensor, V: int) -> torch.Tensor:
    """The authors' ``--train_all_values`` main targets besides the query: at each value position
    2k+1 the value class of the token sitting there (B, T), IGNORE elsewhere."""
    L = (tokens.shape[1] - 1) // 2
    out = torch.full_like(tokens, IGNORE)
    out[:, 1:2 * L:2] = tokens[:, 1:2 * L:2] - V
    return out


def _ce(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(scores.reshape(-1, scores.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def task_loss(scores: torch.Tensor, tokens: torch.Tensor, targets: torch.Tensor, V: int,
              task: BijectionTask) -> torch.Tensor:
    """The training loss of ``task`` from :func:`value_scores` (B, T, V) and the sampled targets
    (:func:`dyntool.sims.bijection_data.sample`: the key positions and the query)."""
    if task.loss == "keys_query":
        return _ce(scores, targets)
    q = query_only(targets)
    if task.loss == "query":
        return _ce(scores, q)
    main = value_position_targets(tokens, V)
    main[:, -1] = q[:, -1]
    aux = targets.clone()
    aux[:, -1] = IGNORE                                              # the key positions only
    return _ce(scores, main) + task.aux_weight * _ce(scores, aux)
