"""The attention atlas's per-head scores, as pure tensor functions (``dyntool study atlas``).

Every function takes one layer's attention ``attn`` α (B, nh, T, T) (rows over allowed keys sum
to 1, causal), and, for the backward side, the advantage ``A = E_α[b] − B`` and the score gradient
``dS = ∂L/∂S = −α ⊙ A`` of :mod:`dyntool.quantities` (A > 0: gradient descent moves s_ij up).
They return one value per head (nh,), averaged over the batch.  Each has a chance level (uniform
attention over the allowed keys) so that a score stands beside its baseline; each is tested
against an independent computation in ``tests/unit/test_atlas_scores.py``.

=====================  ============================================================  ==============
name                   formula (per head, mean over sequences)                       source
=====================  ============================================================  ==============
``first_mass``         ``(1/T) Σ_i α_i0`` (query 0 included: Gu's α_k, k = first)      Gu et al. 2024
``prev_token``         ``(1/(T−1)) Σ_{i≥1} α_{i,i−1}``                                Olsson et al.
``induction``          on ``[r_0..r_{L−1}, r_0..r_{L−1}]``: ``(1/L) Σ_{i≥L} α_{i,i−L+1}``  Olsson (prefix matching)
``copying``            ``Σ Re λ / Σ |λ|`` of the head's OV circuit ``E D_f W_O W_V D_1 Eᵀ``  Olsson (eigenvalues)
``first_adv``          ``(1/(T−1)) Σ_{i≥1} A_i0``                                     dyntool
``first_ds_share``     ``‖dS[:, i≥1, 0]‖ / ‖dS‖`` (Frobenius over the batch)           dyntool
``first_value_grad``   ``‖Σ_i α_i0 u_i‖`` (∂L/∂v_0; the value update is −η times it), RMS over sequences
``first_value_share``  ``‖∂L/∂v_0‖ / ‖∂L/∂V‖`` (Frobenius over the batch)             dyntool
``prev_adv``           ``(1/(T−1)) Σ_{i≥1} A_{i,i−1}``                                dyntool
``copy_adv``           on the repeated sequences: ``(1/L) Σ_{i≥L} A_{i,i−L+1}`` (the copy key)  dyntool
=====================  ============================================================  ==============

The sink metric of Gu et al. (arXiv 2410.10781): the share of heads (all layers) whose
``first_mass`` exceeds ε; their ε = 0.3, ours = 3 × the uniform chance of ``first_mass`` (which
falls with T, so a fixed ε means different things at different context lengths).
"""
from __future__ import annotations

import torch

# the chance levels and ε live with the event rules (no torch: the app reads them too)
from .atlas_events import (GU_EPS, OURS_FACTOR, chance_first_mass, chance_induction,  # noqa: F401
                           chance_prev_token)



def _head_mean(x: torch.Tensor) -> torch.Tensor:
    """(B, nh, n) → (nh,): mean over sequences and the selected rows."""
    return x.mean(dim=(0, 2))


def first_mass(attn: torch.Tensor) -> torch.Tensor:
    return _head_mean(attn[..., :, 0])


def prev_token(attn: torch.Tensor) -> torch.Tensor:
    return _head_mean(torch.diagonal(attn, offset=-1, dim1=-2, dim2=-1))    # α_{i,i−1}, i = 1..T−1


def induction(attn: torch.Tensor, L: int) -> torch.Tensor:
    """Prefix matching on sequences whose second half (positions L..2L−1) repeats the first:
    query i attends to the token after the previous occurrence of its own token, i − L + 1."""
    return _head_mean(torch.diagonal(attn, offset=-(L - 1), dim1=-2, dim2=-1)[..., 1:])


def first_adv(adv: torch.Tensor) -> torch.Tensor:
    return _head_mean(adv[..., 1:, 0])           # query 0 has one key: its advantage is 0


def prev_adv(adv: torch.Tensor) -> torch.Tensor:
    return _head_mean(torch.diagonal(adv, offset=-1, dim1=-2, dim2=-1))


def copy_adv(adv: torch.Tensor, L: int) -> torch.Tensor:
    return _head_mean(torch.diagonal(adv, offset=-(L - 1), dim1=-2, dim2=-1)[..., 1:])


def first_ds_share(ds: torch.Tensor) -> torch.Tensor:
    col = ds[..., 1:, 0].pow(2).sum(dim=(0, 2))
    return (col / ds.pow(2).sum(dim=(0, 2, 3)).clamp_min(1e-300)).sqrt()


def value_grads(attn: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """∂L/∂V = αᵀ U.  # (B, nh, T, d_v)"""
    return torch.matmul(attn.transpose(-1, -2), u)


def first_value_grad(dv: torch.Tensor) -> torch.Tensor:
    return dv[..., 0, :].pow(2).sum(-1).mean(0).sqrt()           # RMS over sequences of ‖∂L/∂v_0‖


def first_value_share(dv: torch.Tensor) -> torch.Tensor:
    return (dv[..., 0, :].pow(2).sum(dim=(0, -1)) / dv.pow(2).sum(dim=(0, 2, 3)).clamp_min(1e-300)).sqrt()


def copying(ov: torch.Tensor, emb: torch.Tensor, unemb: torch.Tensor | None = None) -> float:
    """Olsson's copying score of one head: Σ Re λ / Σ |λ| over the eigenvalues of the token →
    logit map ``unemb @ ov @ embᵀ`` (V'×V'; ``unemb`` = ``emb`` when tied), from the C×C matrix
    ``ov @ (embᵀ unemb)``, which has the same nonzero eigenvalues (eig(XY) = eig(YX) up to zeros).
    +1: a pure copier, −1: an anti-copier."""
    unemb = emb if unemb is None else unemb
    return copying_gram(ov, emb.double().T @ unemb.double())


def copying_gram(ov: torch.Tensor, gram: torch.Tensor) -> float:
    """:func:`copying` from the Gram matrix ``embᵀ unemb`` (C×C, float64), shared by every head."""
    return float(copying_batch(ov[None], gram)[0])


def copying_batch(ovs: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """:func:`copying` of many heads at once: ``ovs`` (n, C, C) → (n,), one batched eigensolve
    (and on a GPU one host sync for all heads)."""
    lam = torch.linalg.eigvals(ovs.double() @ gram)                 # (n, C)
    den = lam.abs().sum(-1)
    return torch.where(den > 0, lam.real.sum(-1) / den.clamp_min(1e-300), torch.zeros_like(den))


def sink_share(first: torch.Tensor, eps: float) -> float:
    """Gu et al.'s sink metric: the share of heads (any shape, all layers) with first_mass > ε."""
    return float((first > eps).double().mean())


def position_loss_gap(token_loss: torch.Tensor, early: tuple[int, int], late: tuple[int, int]) -> float:
    """Olsson's in-context-learning score: mean loss at the ``late`` positions [a, b) minus at the
    ``early`` ones (negative: later tokens are predicted better, i.e. the context helps)."""
    return float(token_loss[:, late[0]:late[1]].mean() - token_loss[:, early[0]:early[1]].mean())


def icl_windows(T: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Olsson's positions 50 and 500 of 512 (10 % and 98 %) scaled to T: early = [⌊0.08T⌋, ⌈0.12T⌉),
    late = [⌊0.9T⌋, T), each at least one position."""
    e0 = max(1, int(0.08 * T))
    e1 = max(e0 + 1, -(-12 * T // 100))
    return (e0, e1), (min(int(0.9 * T), T - 1), T)
