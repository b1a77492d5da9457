"""Paper-I analyses of a wind-tunnel GPT on held-out sequences (arXiv 2512.22471, Paper I: the bijection wind tunnel; diagnostics D5–D8).

:class:`Tap` reads every attention core's per-head ``(q, k, v, y)`` through the same seam as
:class:`dyntool.capture.Capture` (the observer contract of :mod:`dyntool.observe`) but without gradients, so the
analyses run on a no-grad forward of any batch.  Attention weights are recomputed from (q, k)
and the core's mask with :mod:`dyntool.quantities` (tested: ``α v`` reproduces the forward's
``y`` in float64).

Per layer ``l`` (0-based, "output of block l"):

* manifold metrics (:mod:`dyntool.manifold`) of two representations at the L key positions
  (where the model predicts π(x_k)), labelled by the exact posterior entropy H_Bayes:
  ``resid`` = the residual stream after block l (Paper I's "value manifold" reads the final one),
  ``g`` = the layer's head outputs g_i = Σ_j α_ij v_j of all heads, concatenated (before c_proj);
* key orthogonality (D8) with three definitions: ``ctx`` = keys k_j of the L (distinct) key tokens
  inside each sequence, per head, mean |cos| over pairs (as in Paper III, arXiv 2512.23752), ``vocab`` = the
  vocabulary keys E W_K^h of the V key tokens (Paper I's ``cmd_orthogonality``, raw embedding, no
  LayerNorm), and ``single`` = the layer's keys of the V key tokens each fed alone (a one-token
  sequence at position 0: D8's "keys of a set of reference inputs"), signed mean and mean |cos|.
  At initialisation ``ctx`` and ``vocab`` sit at the random level (≈ 0.15 mean |cos| for 32-d
  heads) while ``single`` shares the position-0 embedding across its V inputs and reads ≈ 0.43, as
  Paper I's "0.40–0.45 at random init" does (docs/wind_tunnel_differences.md);
* attention entropy (D5): per-head entropy of α_i· averaged over heads and over query positions
  i >= 1 (position 0 always has entropy 0); the uniform level is the mean of log(i+1).

Plus the model's predictive entropy (over the V value classes) per target position, against
H_Bayes.

The model and the tokens may live on a GPU: index tensors are made on the tokens' device and
every tensor handed to numpy is moved to the CPU first (a no-op for CPU tensors).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..attention import attention_cores
from ..manifold import COMPARED, baseline_comparison, key_orthogonality, manifold_metrics, pca
from ..observe import Observer
from ..record import metric_names as mn
from ..quantities import attention_weights, entropy, masked_scores
from .bijection_data import IGNORE, posterior_entropy, target_positions
from .bijection_task import value_scores

REPS = ("resid", "g")


class Tap(Observer):
    """Context manager: a forward-only observer (:mod:`dyntool.observe`) that stashes detached
    per-head (q, k, v, y) of every core during a forward."""

    def __init__(self, model: torch.nn.Module):
        self.cores = attention_cores(model)
        self.out: dict[int, dict] = {}

    def __enter__(self) -> "Tap":
        for c in self.cores:
            c.attach(self)
        return self

    def __exit__(self, *exc) -> None:
        for c in self.cores:
            c.detach(self)

    def observe(self, site, q, k, v, out, allowed, scale, heads_dim=1, grads="standard", scores=None,
                **modifiers) -> None:
        self.out[site.layer] = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "y": out.detach(),
                                "scale": scale, "allowed": allowed}

    def attn(self, layer: int) -> torch.Tensor:
        """α (B, nh, T, T) recomputed from the stashed q, k and the core's mask."""
        s = self.out[layer]
        return attention_weights(masked_scores(s["q"], s["k"], s["allowed"], s["scale"]))


def value_logits(logits: torch.Tensor, V: int) -> torch.Tensor:
    """The model predicts a value class: logits of the value tokens V..2V-1.  # (B, T, V)"""
    return logits[..., V:2 * V]


def value_loss(logits: torch.Tensor, targets: torch.Tensor, V: int) -> torch.Tensor:
    lg = value_logits(logits, V)
    return F.cross_entropy(lg.reshape(-1, V), targets.reshape(-1), ignore_index=IGNORE)


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, targets: torch.Tensor, V: int, batch: int = 256,
             head: str = "logits") -> dict:
    """Held-out loss / accuracy at key positions and at the query; predictive entropy per target
    position (L+1,) in nats.  ``head``: the query's prediction (:func:`value_scores`)."""
    was = model.training
    model.eval()
    L = (tokens.shape[1] - 1) // 2
    pos = torch.as_tensor(target_positions(L), device=tokens.device)
    nll, corr, ent = [], [], []
    for i in range(0, len(tokens), batch):
        lg = value_scores(model, tokens[i:i + batch], V, head)[:, pos].double()   # (b, L+1, V)
        lp = lg.log_softmax(-1)
        y = targets[i:i + batch][:, pos]
        nll.append(-lp.gather(-1, y[..., None])[..., 0])
        corr.append((lg.argmax(-1) == y).double())
        ent.append(-(lp.exp() * lp.masked_fill(lp == -math.inf, 0.0)).sum(-1))   # pointer: p = 0 there
    model.train(was)
    nll, corr, ent = torch.cat(nll), torch.cat(corr), torch.cat(ent)          # (n, L+1)
    return {"loss": nll.mean().item(), "loss_keys": nll[:, :L].mean().item(),
            "loss_query": nll[:, L].mean().item(), "acc_keys": corr[:, :L].mean().item(),
            "acc_query": corr[:, L].mean().item(), "entropy_per_position": ent.mean(0).cpu().numpy()}


@torch.no_grad()
def analyze(model, tokens: torch.Tensor, V: int, n_plot: int = 0, h_bayes: np.ndarray | None = None,
            r2: bool = True, readout: str = "resid_keys") -> dict:
    """All per-layer geometry on ``tokens`` (n, 2L+1); returns scalars (flat dict ``metrics``) and
    arrays for the record (PC1/PC2 scores of the first ``n_plot`` sequences' key positions).
    ``readout = "normed_values"`` adds the authors' read-out (:func:`normed_value_geometry`)."""
    L = (tokens.shape[1] - 1) // 2
    if h_bayes is None:
        h_bayes = posterior_entropy(tokens.cpu().numpy(), V)
    h = np.asarray(h_bayes)[:, :L].reshape(-1)                           # (n·L,) key positions
    tap, resid = _forward(model, tokens, normed=readout == "normed_values")
    metrics: dict[str, float] = {}
    arrays: dict[str, list] = {f"pcs_{r}": [] for r in REPS}
    # baseline: a one-hot of the key position.  H_Bayes is a function of the position here (without
    # replacement), so this baseline has R² = 1 and an R² near 1 from the residual says little by itself
    onehot = np.tile(np.eye(L), (len(tokens), 1))
    base = manifold_metrics(onehot, h, r2=r2)
    pre = mn.bijection_manifold(mn.BIJECTION_BASELINE)
    metrics.update({pre + k: float(getattr(base, k)) for k in COMPARED})
    kpos = torch.arange(0, 2 * L, 2, device=tokens.device)
    single = _single_token_keys(model, V, tokens.device)                 # layer -> (V, nh, 1, hs)
    for l in range(len(model.h)):
        _attention_entropy(metrics, tap.attn(l).double(), l)
        st = tap.out[l]
        B, nh, T, hs = st["q"].shape
        reps = {"resid": resid[l][:, kpos],                                 # (B, L, C)
                "g": st["y"][:, :, kpos].transpose(1, 2).reshape(B, L, nh * hs)}
        for name, x in reps.items():
            sc = _representation(metrics, x.double().reshape(B * L, -1).cpu().numpy(), h, onehot, base,
                                 mn.bijection_manifold(name, l), r2, n_plot * L)
            if sc is not None:
                arrays[f"pcs_{name}"].append(sc)
        _key_orthogonality(metrics, model, st["k"][:, :, kpos], V, l)
        sk = key_orthogonality(single[l][:, :, 0].transpose(0, 1).double().cpu().numpy())   # groups: heads
        metrics[mn.key_orth("single", l)] = sk["mean_abs"]
        metrics[mn.key_orth("single", l, signed=True)] = sk["mean"]
    if readout == "normed_values":
        m, sc = normed_value_geometry(resid["normed"], h_bayes, onehot, r2=r2, n_plot=n_plot)
        metrics.update(m)
        if sc is not None:
            arrays[f"pcs_{mn.BIJECTION_NORMED_VALUES}"] = [sc]
    _entropy_summaries(metrics, len(model.h), tokens.shape[1])
    out_arrays = {k: np.stack(v).astype(np.float32) for k, v in arrays.items() if v}
    return {"metrics": metrics, "arrays": out_arrays}


def _forward(model, tokens: torch.Tensor, normed: bool):
    """One eval-mode forward with the tap and the residual after every block (and ``ln_f``'s output)."""
    was = model.training
    model.eval()
    resid: dict = {}
    hooks = [blk.register_forward_hook(lambda m, i, o, l=li: resid.__setitem__(l, o.detach()))
             for li, blk in enumerate(model.h)]
    if normed:
        hooks.append(model.ln_f.register_forward_hook(lambda m, i, o: resid.__setitem__("normed", o.detach())))
    try:
        with Tap(model) as tap:
            model(tokens)
    finally:
        for hk in hooks:
            hk.remove()
        model.train(was)
    return tap, resid


def _single_token_keys(model, V: int, device) -> dict[int, torch.Tensor]:
    """Every layer's keys of the V key tokens, each fed alone at position 0: layer -> (V, nh, 1, hs)."""
    tap, _ = _forward(model, torch.arange(V, device=device)[:, None], normed=False)
    return {l: tap.out[l]["k"] for l in range(len(model.h))}


def _attention_entropy(metrics: dict, a: torch.Tensor, l: int) -> None:
    """Layer ``l``'s mean attention entropy and each head's (position 0 has one key: left out)."""
    ent = entropy(a)[..., 1:]                                              # (B, nh, T-1)
    metrics[mn.layer(mn.ATTN_ENTROPY, l)] = ent.mean().item()
    for hd in range(ent.shape[1]):
        metrics[mn.head(mn.ATTN_ENTROPY, l, hd)] = ent[:, hd].mean().item()


def _representation(metrics: dict, x: np.ndarray, h: np.ndarray, onehot: np.ndarray, base, pre: str,
                    r2: bool, n_points: int) -> np.ndarray | None:
    """Manifold metrics of ``x`` against H_Bayes beside the position baseline; PC1/PC2 of the first
    ``n_points`` rows for the record (None when none are plotted)."""
    p = pca(x, orient_by=h)                                                # one SVD for both uses
    m = manifold_metrics(x, h, r2=r2, pca_result=p)
    metrics.update({pre + k: v for k, v in m.as_dict().items() if k not in ("n", "d")})
    c = baseline_comparison(x, h, onehot, baseline_metrics=base, pca_result=p)
    metrics.update({pre + k: v for k, v in c.items() if not k.startswith("baseline_")})
    if not n_points:
        return None
    sc = np.full((n_points, 2), np.nan)
    k2 = min(2, p.scores.shape[1])
    sc[:, :k2] = p.scores[:n_points, :k2]
    return sc


def _key_orthogonality(metrics: dict, model, keys: torch.Tensor, V: int, l: int) -> None:
    """Key orthogonality in context (the keys at the key positions) and over the key vocabulary."""
    ko = key_orthogonality(keys.double().cpu().numpy())                          # groups: (B, nh)
    metrics[mn.key_orth("ctx", l)] = ko["mean_abs"]
    metrics[mn.key_orth("ctx", l, signed=True)] = ko["mean"]
    attn = model.h[l].attn
    nh, hs = keys.shape[1], keys.shape[-1]
    wk = attn.c_attn.weight[attn.n_embd:2 * attn.n_embd].double()
    kv = (model.wte.weight[:V].double() @ wk.T).view(V, nh, hs).transpose(0, 1)   # (nh, V, hs)
    kov = key_orthogonality(kv.cpu().numpy())
    metrics[mn.key_orth("vocab", l)] = kov["mean_abs"]
    metrics[mn.key_orth("vocab", l, signed=True)] = kov["mean"]


def _entropy_summaries(metrics: dict, n_layer: int, T: int) -> None:
    """Uniform level, reduction of the last layer vs layer 0 and of the layer mean vs uniform."""
    unif = float(np.mean([math.log(i + 1) for i in range(1, T)]))
    h0, hl = metrics[mn.layer(mn.ATTN_ENTROPY, 0)], metrics[mn.layer(mn.ATTN_ENTROPY, n_layer - 1)]
    metrics[mn.ATTN_ENTROPY_UNIFORM] = unif
    metrics[mn.ATTN_ENTROPY_REDUCTION_LAST] = 1.0 - hl / h0 if h0 > 0 else float("nan")
    metrics[mn.ATTN_ENTROPY_REDUCTION_MEAN] = 1.0 - float(np.mean(
        [metrics[mn.layer(mn.ATTN_ENTROPY, l)] for l in range(n_layer)])) / unif


def normed_value_geometry(normed: torch.Tensor, h_bayes: np.ndarray, onehot: np.ndarray, r2: bool = True,
                          n_plot: int = 0) -> tuple[dict, np.ndarray | None]:
    """The authors' read-out: the final normed hidden state ``normed`` (B, T, C) at the L value
    positions 2k+1, each labelled with H_Bayes of its pair's value given the earlier pairs
    (``h_bayes[:, k]``, nats in, **bits** used), against the position one-hot ``onehot`` (B·L, L)
    (partial R² beyond position, ordering null).  Returns the ``manifold/normed_values/…`` metrics
    and the PC1/PC2 scores of the first ``n_plot`` sequences (or None)."""
    B, T, _ = normed.shape
    L = (T - 1) // 2
    x = normed[:, 1:2 * L:2].double().reshape(B * L, -1).cpu().numpy()
    h = np.asarray(h_bayes)[:, :L].reshape(-1) / math.log(2)             # bits
    p = pca(x, orient_by=h)
    pre = mn.bijection_manifold(mn.BIJECTION_NORMED_VALUES)
    out = {pre + k: v for k, v in manifold_metrics(x, h, r2=r2, pca_result=p).as_dict().items()
           if k not in ("n", "d")}
    c = baseline_comparison(x, h, onehot, pca_result=p)
    out.update({pre + k: v for k, v in c.items()})                      # baseline_* in bits, too
    if not n_plot:
        return out, None
    sc = np.full((n_plot * L, 2), np.nan)
    k2 = min(2, p.scores.shape[1])
    sc[:, :k2] = p.scores[:n_plot * L, :k2]
    return out, sc
