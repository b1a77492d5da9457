"""Batched single-head engine: analytic backward vs autograd, vs the reference loop, hooks, toy task."""
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dyntool.sims.single_head import NonFiniteLoss, Weights, arm_lrs, init_weights, train
from dyntool.sims.sticky_data import generate
from dyntool.sims.toy_data import toy_data, toy_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from sticky_reference import run_seed  # noqa: E402

F64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread():
    """Everything here is tiny; one thread avoids OpenMP barrier stalls on a busy machine."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _random_problem(R=3, N=17, d_x=6, d_k=4, d_v=5, C=3, std=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, N, d_x, generator=g, dtype=F64)
    y = torch.randint(C, (R, N), generator=g)
    W = Weights(*(torch.randn(R, *s, generator=g, dtype=F64) * std
                  for s in ((d_x, d_k), (d_x, d_k), (d_x, d_v), (d_v, C))))
    return x, y, W


def _autograd(x, y, W, r, causal):
    """Plain autograd for run r, keeping the intermediate gradients."""
    Wr = {n: getattr(W, n)[r].clone().requires_grad_() for n in ("W_Q", "W_K", "W_V", "W_O")}
    q, k, v = x[r] @ Wr["W_Q"], x[r] @ Wr["W_K"], x[r] @ Wr["W_V"]
    for t in (q, k, v):
        t.retain_grad()
    s = q @ k.T / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    s.retain_grad()
    a = torch.softmax(s, -1)
    a.retain_grad()
    G = a @ v
    G.retain_grad()
    loss = F.cross_entropy(G @ Wr["W_O"], y[r])
    loss.backward()
    return loss, Wr, dict(q=q, k=k, v=v, s=s, alpha=a, G=G)


def _capture(x, y, W, causal, tile=4):
    got = {}
    train(x, y, W, [(0.0,) * 4] * x.shape[0], 1, causal=causal, tile=tile,
          on_step=lambda step, st: got.setdefault(step, st), record_steps={0})
    return got[0]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("std", [0.5, 4.0])   # 4.0 forces the max-shift softmax path
def test_analytic_gradients_equal_autograd(causal, std):
    x, y, W = _random_problem(std=std)
    st = _capture(x, y, W, causal)
    N = x.shape[1]
    full = st.row_block(0, N)
    pos = st.positional(rows_per_chunk=5)
    for r in range(3):
        loss, Wr, t = _autograd(x, y, W, r, causal)
        assert st.loss[r].item() == pytest.approx(loss.item(), abs=1e-12)
        for n, p in Wr.items():
            torch.testing.assert_close(st.grads[n][r], p.grad, rtol=1e-9, atol=1e-12)
        visible = torch.isfinite(t["s"])
        torch.testing.assert_close(st.upstream[r], t["G"].grad, rtol=1e-9, atol=1e-13)
        torch.testing.assert_close(full["attn"][r], t["alpha"], rtol=1e-9, atol=1e-13)
        torch.testing.assert_close(full["compat"][r], t["alpha"].grad * visible, rtol=1e-9, atol=1e-13)
        torch.testing.assert_close(full["score_grad"][r], t["s"].grad, rtol=1e-9, atol=1e-13)
        for ours, theirs in (("query_grad", "q"), ("key_grad", "k"), ("value_grad", "v")):
            torch.testing.assert_close(pos[ours][r], t[theirs].grad, rtol=1e-9, atol=1e-13)
    assert full["score_grad"].sum(-1).abs().max() < 1e-12                    # zero-sum routing
    torch.testing.assert_close(full["advantage"], -(full["compat"] - st.expected_compat[..., None]) * st.mask(0, N))
    torch.testing.assert_close(pos["column_usage"].sum(-1), torch.full((3,), float(N), dtype=F64))


@pytest.mark.parametrize("causal", [True, False])
def test_tiles_and_workers_do_not_change_results(causal):
    x, y, W = _random_problem(N=23)
    lrs = [(0.1, 0.1, 0.3, 0.1)] * 3
    a = train(x, y, W, lrs, 5, tile=4, causal=causal)
    for kw in (dict(tile=64), dict(tile=4, workers=2), dict(tile=5, workers=3)):
        b = train(x, y, W, lrs, 5, causal=causal, **kw)
        torch.testing.assert_close(a.losses, b.losses, rtol=0, atol=1e-13)
        for n in ("W_Q", "W_K", "W_V", "W_O"):
            torch.testing.assert_close(getattr(a.weights, n), getattr(b.weights, n), rtol=0, atol=1e-13)
    assert torch.get_num_threads() == 1                              # restored (fixture set 1)


def test_worker_pool_records_the_same_state():
    x, y, W = _random_problem(N=23)
    one, two = _capture(x, y, W, True), {}
    train(x, y, W, [(0.0,) * 4] * 3, 1, tile=4, workers=2,
          on_step=lambda step, st: two.setdefault(step, st), record_steps={0})
    for n in ("head_out", "probs", "upstream"):
        torch.testing.assert_close(getattr(one, n), getattr(two[0], n), rtol=0, atol=1e-14)


def test_pooled_is_the_block_mean_over_visible_entries():
    x, y, W = _random_problem(N=23)
    st = _capture(x, y, W, causal=True)
    pooled = st.pooled(5, rows_per_chunk=10)
    full, m = st.row_block(0, 23), st.mask(0, 23).double()
    for n in ("attn", "compat", "advantage", "score_grad"):
        assert pooled[n].shape == (3, 5, 5)
        for bi, bj in ((0, 0), (2, 1), (4, 4), (4, 0)):
            sl = (slice(None), slice(5 * bi, 5 * bi + 5), slice(5 * bj, 5 * bj + 5))
            expected = full[n][sl].sum((1, 2)) / m[sl[1:]].sum()
            torch.testing.assert_close(pooled[n][:, bi, bj], expected)
        assert torch.isnan(pooled[n][:, 0, 1]).all()                # fully masked block


def _study(seeds, T, steps, dtype):
    xs, ys, labels = [], [], []
    for s in seeds:
        d = generate(s, T=T)
        for arm in ("sgd", "em_like"):
            xs.append(d.x), ys.append(d.y), labels.append((s, arm))
    W = init_weights([s for s, _ in labels], dtype=dtype)
    res = train(torch.stack(xs).to(dtype), torch.stack(ys), W, [arm_lrs(a) for _, a in labels], steps)
    return res, labels


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_batched_engine_matches_reference_autograd_loop(dtype, tol):
    seeds = [42, 2024]
    res, labels = _study(seeds, T=64, steps=30, dtype=dtype)
    ref = {s: run_seed(s, T=64, n_steps=30, dtype=dtype) for s in seeds}
    for r, (s, arm) in enumerate(labels):
        rl = torch.tensor(ref[s][arm]["losses"], dtype=F64)
        assert (res.losses[r] - rl).abs().max() < tol, (s, arm)
        for key in ("loss", "entropy"):
            assert res.final[key][r].item() == pytest.approx(ref[s][arm]["metrics"][key], abs=tol)
        # the reference's accuracy is a float32 mean
        assert res.final["accuracy"][r].item() == pytest.approx(ref[s][arm]["metrics"]["accuracy"], abs=1e-6)
    # the EM-like arm must actually differ from SGD (the lrs were applied per run)
    assert (res.losses[1] - res.losses[0]).abs().max() > 1e-5


def test_non_finite_loss_raises_with_step_and_run():
    x, y, W = _random_problem()
    lrs = [(0.01,) * 4, (1e12,) * 4, (0.01,) * 4]
    with pytest.raises(NonFiniteLoss) as info:
        train(x, y, W, lrs, 50)
    assert info.value.run_index == 1 and 1 <= info.value.step < 50
    assert info.value.losses.shape == (3, info.value.step)


def test_record_steps_predicate_and_final_state():
    x, y, W = _random_problem()
    seen = []
    res = train(x, y, W, [(0.1,) * 4] * 3, 6, on_step=lambda s, st: seen.append((s, st)),
                record_steps=lambda s: s % 3 == 0)
    assert [s for s, _ in seen] == [0, 3, 6]
    torch.testing.assert_close(seen[1][1].loss, res.losses[:, 3])
    torch.testing.assert_close(seen[2][1].loss, res.final["loss"])
    # a held state keeps its own (pre-update) weights
    torch.testing.assert_close(seen[0][1].weights.W_Q, W.W_Q)
    torch.testing.assert_close(seen[2][1].weights.W_Q, res.weights.W_Q)
    assert not torch.equal(seen[0][1].weights.W_Q, seen[1][1].weights.W_Q)


def test_em_closed_form_extension():
    x, y, W = _random_problem(N=40)
    lrs = [(0.05, 0.05, 0.0, 0.05)] * 3
    frozen = train(x, y, W, lrs, 5, modes="em_closed_form", kappa=0.0)
    torch.testing.assert_close(frozen.weights.W_V, W.W_V)             # κ = 0: values untouched
    res = train(x, y, W, lrs, 40, modes=["em_closed_form", "gd", "em_closed_form"], kappa=0.05)
    assert torch.isfinite(res.losses).all()
    assert (res.losses[[0, 2], -1] < res.losses[[0, 2], 0]).all()
    assert not torch.equal(res.weights.W_V[0], W.W_V[0])
    torch.testing.assert_close(res.weights.W_V[1], W.W_V[1])          # gd run with lr_v = 0


def train_toy(n_steps: int, causal: bool = False, lr: float = 0.5):
    """The toy head trained with plain GD, the same lr for all four matrices (as the toy preset)."""
    x, y = toy_data()
    return train(x[None], y[None], toy_weights(), [(lr,) * 4], n_steps, causal=causal)


def test_toy_task_loss_drops_by_90_percent():
    res = train_toy(500)
    assert res.losses[0, 0] > 1.0
    assert res.final["loss"][0] < 0.1 * res.losses[0, 0]
    causal = train_toy(500, causal=True)
    assert causal.final["loss"][0] < 0.1 * causal.losses[0, 0]
