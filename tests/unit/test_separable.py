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


def _result_bytes(res) -> dict:
    out = {"losses": res.losses.tobytes(), "heldout": repr(res.heldout)}
    out.update({f"mult_{k}": v.tobytes() for k, v in res.mults.items()})
    out.update({f"first_{k}": v.tobytes() for k, v in res.first_step.items()})
    return out


def test_device_cpu_is_byte_identical_and_the_tensors_follow_the_device(monkeypatch):
    """device="cpu" is the model as before the key; the batched inputs, the weights and the
    learning rates go through .to(dev) with the device the config resolved to (told apart by
    identity), so a CUDA run computes on the GPU what a CPU run computes here."""
    cfg = dict(seeds=[3, 4], arms=["sgd", "values", "readout_nm"], steps=4, T=30, heldout_every=2)
    plain = _result_bytes(sp.train(sp.SeparableConfig(**cfg)))
    dev, moved = torch.device("cpu"), []
    monkeypatch.setattr(sp, "resolve", lambda name: dev)
    tensor_to = torch.Tensor.to

    def spy(self, *a, **kw):
        if a and a[0] is dev:
            moved.append(tuple(self.shape))
        return tensor_to(self, *a, **kw)
    monkeypatch.setattr(torch.Tensor, "to", spy)
    c = sp.SeparableConfig(**cfg, device="cpu")
    assert _result_bytes(sp.train(c)) == plain
    R, N = 6, 29
    assert moved.count((R, N, c.d_x)) == 2 and moved.count((R, N)) == 2          # x, xh and y, yh
    for shape in [(R, c.n_heads, c.d_x, c.d_k)] * 2 + [(R, c.n_heads, c.d_x, c.d_v), (R, c.n_heads * c.d_v, c.d_hidden),
                                                      (R, c.d_hidden, c.n_symbols)]:
        assert shape in moved                                                    # W_Q, W_K, W_V, W_1, W_2
    assert moved.count((R,)) == len(sp.PARAMS) and len(moved) == 4 + 2 * len(sp.PARAMS)   # + the lrs


@pytest.mark.parametrize("device, says", [("cuda", "no CUDA GPU"), ("cuda:1", "no CUDA GPU"), ("gpu", "cpu, cuda or cuda:N")])
def test_a_device_this_machine_lacks_is_a_config_error(monkeypatch, device, says):
    from dyntool.errors import ConfigError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=says):
        sp.train(sp.SeparableConfig(seeds=[1], arms=["sgd", "values"], steps=1, T=10, device=device))
