"""The bijection wind-tunnel task: sequences, exact Bayes entropy, held-out set."""
import math

import numpy as np
import pytest
import torch

from dyntool.sims import bijection_data as data

V, L = 20, 19


def batch(n=200, seed=0, with_replacement=False, V=V, L=L):
    return data.sample(n, V, L, torch.Generator().manual_seed(seed), with_replacement)


def test_sequences_encode_a_bijection_with_a_query_from_context():
    tok, tgt = batch()
    assert tok.shape == tgt.shape == (200, 2 * L + 1)
    keys, vals, q = tok[:, 0:2 * L:2], tok[:, 1:2 * L:2] - V, tok[:, 2 * L]
    assert keys.min() >= 0 and keys.max() < V and vals.min() >= 0 and vals.max() < V
    for b in range(len(tok)):
        k, v = keys[b].tolist(), vals[b].tolist()
        assert len(set(k)) == L and len(set(v)) == L            # distinct keys -> distinct values
        assert q[b].item() in k                                 # query from context
        assert tgt[b, 2 * L].item() == v[k.index(q[b].item())]  # the query's answer is its pair
        assert tgt[b, 0:2 * L:2].tolist() == v                  # key positions predict their value
        assert (tgt[b, 1:2 * L:2] == data.IGNORE).all()
    assert list(data.target_positions(L)) == list(range(0, 2 * L, 2)) + [2 * L]


def test_bayes_entropy_is_log_of_remaining_values():
    """Exact posterior entropy from the posterior support equals log(V - k + 1) at key position k
    (k = 1..L, without replacement) and 0 at the query, for every sequence."""
    tok, _ = batch(300, seed=3)
    h = data.posterior_entropy(tok.numpy(), V)
    closed = data.bayes_entropy(V, L)
    assert closed[0] == pytest.approx(math.log(20)) and closed[L - 1] == pytest.approx(math.log(2))
    assert closed[L] == 0.0 and len(closed) == L + 1
    assert np.allclose(h, closed[None], atol=0)
    for k in (1, 7, 19):
        assert h[0, k - 1] == pytest.approx(math.log(V - k + 1))


def test_posterior_entropy_with_replacement_by_hand():
    # V = 4: pairs (2->1), (2->1), (0->3), then query 1 (never seen)
    tok = np.array([[2, 4 + 1, 2, 4 + 1, 0, 4 + 3, 1]])
    h = data.posterior_entropy(tok, 4)
    assert np.allclose(h, [[math.log(4), 0.0, math.log(3), math.log(2)]])
    tok, _ = batch(50, with_replacement=True, V=5, L=8)
    hr = data.posterior_entropy(tok.numpy(), 5)
    assert (hr[:, 0] == math.log(5)).all() and (hr[:, -1] == 0).all()   # query from context
    assert (hr == 0).any()                                               # repeated keys happen


def test_reproducible_and_heldout_differs():
    a, _ = batch(seed=1)
    b, _ = batch(seed=1)
    c, _ = batch(seed=1 + 10000)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_bayes_accuracy():
    acc, accq = data.bayes_accuracy(V, L)
    assert acc == pytest.approx(np.mean([1 / m for m in range(2, 21)]))
    assert accq == 1.0
    with pytest.raises(ValueError):
        data.sample(2, 5, 6, torch.Generator())
