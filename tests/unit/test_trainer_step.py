"""The trainer's step (issue 33, item 5): its clipping is ``clip_grad_norm_`` bit for bit, the
per-group gradient norms come from that one per-parameter norm pass and only on logged steps, and
prefetching the next batch changes neither the batches drawn nor what a checkpoint resumes."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from dyntool.train.config import ModelConfig
from dyntool.train.gpt import GPT
from dyntool.train.recording import RecordingCallback
from dyntool.train.trainer import Trainer


def _model_with_grads(dtype=torch.float64):
    torch.manual_seed(0)
    m = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16), 40, 8).to(dtype)
    x = torch.randint(0, 40, (3, 8))
    m(x, x)[1].backward()
    return m


def _callback(model, log_every: int) -> RecordingCallback:
    cb = RecordingCallback.__new__(RecordingCallback)
    cb.cfg = SimpleNamespace(train=SimpleNamespace(log_every=log_every, eval_every=0))
    cb.rec = cb.flight = cb._gn = None
    cb.groups = model.grad_groups()
    return cb


@pytest.mark.parametrize("max_norm", [1e-3, 1e9])                 # clipping, and not
def test_clip_is_clip_grad_norm_and_hands_the_norms_on(max_norm):
    m = _model_with_grads()
    ref = copy.deepcopy(m)
    for p, q in zip(m.parameters(), ref.parameters()):
        q.grad = None if p.grad is None else p.grad.clone()
    total_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
    seen = []
    spy = SimpleNamespace(on_gradients=lambda step, params, norms: seen.append((params, norms.clone())))
    total = Trainer._clip(SimpleNamespace(raw=m, callbacks=[spy], device=torch.device("cpu")), 0, max_norm)
    assert torch.equal(total, total_ref)
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)
    (params, norms), = seen
    for p, n in zip(params, norms):              # the pre-clip norms, one per parameter
        torch.testing.assert_close(n, (p.grad.norm() / min(1.0, max_norm / (float(total) + 1e-6))),
                                   rtol=1e-12, atol=0)


def test_group_norms_from_the_clip_pass_on_logged_steps_only():
    m = _model_with_grads()
    params = [p for p in m.parameters() if p.grad is not None]
    norms = torch.stack([p.grad.norm() for p in params])
    cb = _callback(m, log_every=3)
    logged = {}
    for step in range(6):
        cb._gn = None
        cb.on_gradients(step, params, norms)
        assert (cb._gn is not None) == (step % 3 == 0), step
        logged[step] = cb._gn
    names, got, _ = logged[3]
    for name, v in zip(names, got.tolist()):     # against the float64 norm of the group's gradients
        want = torch.sqrt(sum(p.grad.double().square().sum() for p in cb.groups[name] if p.grad is not None))
        assert v == pytest.approx(float(want), rel=1e-6), name


def test_prefetched_batches_are_the_unprefetched_ones_and_a_checkpoint_draws_them_again():
    data = torch.arange(1000).numpy()
    d = SimpleNamespace(batch_size=2, block_size=5)
    t = SimpleNamespace(cfg=SimpleNamespace(data=d), corpus=SimpleNamespace(train=data), fsdp=False,
                        gen=torch.Generator().manual_seed(3), device=torch.device("cpu"), _ahead=None)
    t._draw = lambda: Trainer._draw(t)
    plain_gen = torch.Generator().manual_seed(3)
    from dyntool.data.wikitext import get_batch
    plain = [get_batch(data, 2, 5, plain_gen)[0] for _ in range(4)]
    got = [Trainer.next_batch(t)[0] for _ in range(2)]
    saved = Trainer._gen_state(t)                # what a checkpoint after two batches stores
    got += [Trainer.next_batch(t)[0] for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(got, plain))
    resumed = torch.Generator().set_state(saved)
    assert torch.equal(get_batch(data, 2, 5, resumed)[0], plain[2])
