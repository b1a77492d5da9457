"""The separable model (issue 26, part 4): batched forward equals a plain per-run computation,
each run's gradient is its own, and the norm-matched arms match the values arm's first update."""
import math

import pytest
import torch

from dyntool.sims import separable as sp


def _plain_loss(W, r, x, y):
    """One run, written out head by head (independent of the batched einsum code)."""
    outs = []
    N = x.shape[0]
    for h in range(W["W_Q"].shape[1]):
        s = (x @ W["W_Q"][r, h]) @ (x @ W["W_K"][r, h]).T / math.sqrt(W["W_Q"].shape[-1])
        s = s.masked_fill(torch.triu(torch.ones(N, N, dtype=torch.bool), 1), float("-inf"))
        outs.append(torch.softmax(s, -1) @ (x @ W["W_V"][r, h]))
    logits = torch.nn.functional.gelu(torch.cat(outs, -1) @ W["W_1"][r]) @ W["W_2"][r]
    return torch.nn.functional.cross_entropy(logits, y)


def test_batched_forward_and_gradients_match_a_plain_computation():
    cfg = sp.SeparableConfig(seeds=[1, 2], T=12)
    W = {k: v.double() for k, v in sp.init_weights([1, 2], cfg).items()}
    x = torch.randn(2, 11, cfg.d_x, dtype=torch.float64)
    y = torch.randint(0, 8, (2, 11))
    loss, g = sp.gradients(W, x, y)
    for r in range(2):
        Wr = {k: v.detach().clone().requires_grad_(True) for k, v in W.items()}
        ref = _plain_loss(Wr, r, x[r], y[r])
        ref.backward()
        assert loss[r].item() == pytest.approx(ref.item(), rel=1e-12)
        for k in sp.PARAMS:
            torch.testing.assert_close(g[k][r], Wr[k].grad[r])


def test_arms_scale_their_groups_and_norm_matching_equalises_the_first_update():
    cfg = sp.SeparableConfig(seeds=[3, 4], arms=list(sp.ARMS), steps=2, T=30, heldout_every=1)
    res = sp.train(cfg)
    i = {r: k for k, r in enumerate(res.runs)}
    for s in (3, 4):
        v = res.first_step["update_norm_values"][i[(s, "values")]]
        for arm, grp in (("readout_nm", "readout"), ("routing_nm", "routing")):
            assert res.first_step[f"update_norm_{grp}"][i[(s, arm)]] == pytest.approx(v, rel=1e-5)
            assert res.mults["values"][i[(s, arm)]] == 1
        assert res.mults["readout"][i[(s, "readout")]] == 10 and res.mults["values"][i[(s, "readout")]] == 1
        assert res.mults["routing"][i[(s, "all")]] == 10 == res.mults["values"][i[(s, "all")]]
    summ = sp.summarise(cfg, res)
    assert "| readout_nm − values |" in sp.table(summ)
