"""The atlas's scores against independent computations: hand-built attention patterns whose score is
known in closed form, explicit loops, autograd in float64, and the full V×V eigenvalue problem."""
import math

import pytest
import torch

from dyntool import quantities as Q
from dyntool.train import atlas_scores as S

T = 12


def causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def uniform(B, H, T):
    m = causal(T).double()
    return (m / m.sum(-1, keepdim=True)).expand(B, H, T, T)


def test_first_mass_of_a_pattern_with_p_on_the_first_key_is_closed_form():
    p = 0.7
    a = torch.zeros(1, 1, T, T, dtype=torch.float64)
    a[..., 0, 0] = 1
    for i in range(1, T):
        a[..., i, 0] = p
        a[..., i, 1:i + 1] = (1 - p) / i
    assert torch.allclose(a.sum(-1), torch.ones(1, 1, T, dtype=torch.float64))
    assert S.first_mass(a).item() == pytest.approx((1 + (T - 1) * p) / T)


def test_previous_token_and_induction_patterns_score_one_and_uniform_scores_chance():
    L = T // 2
    prev = torch.zeros(2, 3, T, T, dtype=torch.float64)
    prev[..., 0, 0] = 1
    for i in range(1, T):
        prev[..., i, i - 1] = 1
    assert torch.allclose(S.prev_token(prev), torch.ones(3, dtype=torch.float64))
    assert S.first_mass(prev)[0].item() == pytest.approx(2 / T)        # rows 0 and 1 put all on key 0
    ind = uniform(1, 1, T).clone()
    for i in range(L, T):
        ind[..., i, :] = 0
        ind[..., i, i - L + 1] = 1
    assert S.induction(ind, L).item() == pytest.approx(1.0)
    assert S.prev_token(ind).item() < 1
    u = uniform(2, 2, T)
    # chance levels by explicit loops over the uniform pattern
    assert S.first_mass(u)[0].item() == pytest.approx(sum(float(u[0, 0, i, 0]) for i in range(T)) / T)
    assert S.first_mass(u)[0].item() == pytest.approx(S.chance_first_mass(T))
    assert S.prev_token(u)[0].item() == pytest.approx(S.chance_prev_token(T))
    assert S.induction(u, L)[0].item() == pytest.approx(S.chance_induction(L))
    assert S.chance_induction(L) == pytest.approx(sum(1 / (i + 1) for i in range(L, T)) / L)


def test_backward_terms_match_autograd_in_float64():
    torch.manual_seed(0)
    B, H, d, L = 3, 2, 5, T // 2
    q, k = torch.randn(B, H, T, d, dtype=torch.float64), torch.randn(B, H, T, d, dtype=torch.float64)
    v = torch.randn(B, H, T, d, dtype=torch.float64, requires_grad=True)
    w = torch.randn(B, H, T, d, dtype=torch.float64)
    s = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~causal(T), float("-inf")).requires_grad_()
    a = torch.softmax(s, -1)
    y = a @ v
    y.retain_grad()
    (y * w).sum().backward()             # any loss: U = w
    ds, dv, u = s.grad.nan_to_num(0.0), v.grad, y.grad
    a = a.detach()
    allowed = causal(T)
    b = Q.compatibility(u, v.detach(), allowed)
    adv = Q.advantage(a, b, allowed)
    assert torch.allclose(Q.score_grad(a, b), ds, atol=1e-12)
    # the first column's advantage: −dS_i0 / α_i0, averaged by loops
    ref = torch.zeros(H, dtype=torch.float64)
    for h in range(H):
        ref[h] = sum(-ds[bb, h, i, 0] / a[bb, h, i, 0] for bb in range(B) for i in range(1, T)) / (B * (T - 1))
    assert torch.allclose(S.first_adv(adv), ref, atol=1e-10)
    ref_prev = torch.tensor([sum(-ds[bb, h, i, i - 1] / a[bb, h, i, i - 1] for bb in range(B) for i in range(1, T))
                             / (B * (T - 1)) for h in range(H)])
    assert torch.allclose(S.prev_adv(adv), ref_prev.double(), atol=1e-10)
    ref_copy = torch.tensor([sum(-ds[bb, h, i, i - L + 1] / a[bb, h, i, i - L + 1] for bb in range(B)
                                 for i in range(L, T)) / (B * L) for h in range(H)])
    assert torch.allclose(S.copy_adv(adv, L), ref_copy.double(), atol=1e-10)
    share = torch.stack([ds[:, h, 1:, 0].norm() / ds[:, h].norm() for h in range(H)])
    assert torch.allclose(S.first_ds_share(ds), share, atol=1e-12)
    mine = S.value_grads(a, u)
    assert torch.allclose(mine, dv, atol=1e-12)
    rms = torch.stack([torch.stack([dv[bb, h, 0].norm() ** 2 for bb in range(B)]).mean().sqrt() for h in range(H)])
    assert torch.allclose(S.first_value_grad(mine), rms, atol=1e-12)
    assert torch.allclose(S.first_value_share(mine), torch.stack([dv[:, h, 0].norm() / dv[:, h].norm()
                                                                  for h in range(H)]), atol=1e-12)
    # the sign convention: a column with positive advantage gains score under gradient descent
    assert torch.all((adv[..., 1:, 0] > 0) == (ds[..., 1:, 0] < 0))


def test_copying_score_matches_the_full_token_map_and_its_closed_forms():
    torch.manual_seed(1)
    V, C = 40, 6
    emb, unemb = torch.randn(V, C, dtype=torch.float64), torch.randn(V, C, dtype=torch.float64)
    ov = torch.randn(C, C, dtype=torch.float64)
    lam = torch.linalg.eigvals(unemb @ ov @ emb.T)           # the V×V map, directly
    assert S.copying(ov, emb, unemb) == pytest.approx(float(lam.real.sum() / lam.abs().sum()), abs=1e-8)
    eye = torch.eye(C, dtype=torch.float64)
    assert S.copying(eye, emb) == pytest.approx(1.0)          # E Eᵀ is positive semi-definite
    assert S.copying(-eye, emb) == pytest.approx(-1.0)
    rot = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)    # eigenvalues ±i: no copying
    assert S.copying(rot, torch.eye(2, dtype=torch.float64)) == pytest.approx(0.0, abs=1e-12)
    # many heads in one eigensolve: each as alone (and a zero map scores 0, not NaN)
    e2 = torch.eye(2, dtype=torch.float64)
    got = S.copying_batch(torch.stack([e2, -e2, rot, torch.zeros(2, 2, dtype=torch.float64)]), e2)
    assert got.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-12)


def test_sink_share_and_the_icl_gap():
    fm = torch.tensor([[0.1, 0.31], [0.5, 0.29]])
    assert S.sink_share(fm, S.GU_EPS) == 0.5
    tl = torch.arange(20, dtype=torch.float64).repeat(2, 1)        # loss rising with position
    (e0, e1), (l0, l1) = S.icl_windows(20)
    assert (e0, e1, l0, l1) == (1, 3, 18, 20)
    assert S.position_loss_gap(tl, (e0, e1), (l0, l1)) == pytest.approx(18.5 - 1.5)
    (e0, e1), (l0, l1) = S.icl_windows(512)                       # Olsson's 50 and 500 of 512 inside
    assert e0 <= 50 < e1 and l0 <= 500 < l1
