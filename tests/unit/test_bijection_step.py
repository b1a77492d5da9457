"""The wind tunnel's compiled training step equals the eager one (dyntool/sims/bijection_step.py, issue 46).

On the CPU ``torch.compile`` runs inductor without CUDA graphs: the same traced and fused step a GPU
replays as graphs.  Same seed, same init, same batches: the losses, gradient norms and parameters
after a few AdamW steps agree to float32 rounding (fused kernels reorder sums, so not bitwise)."""
from __future__ import annotations

import copy

import pytest
import torch

from dyntool import config
from dyntool.sims import bijection_step
from dyntool.sims.bijection import BijectionConfig, build_model
from dyntool.sims.bijection_task import task_loss, value_scores

STEPS = 3


def _run(cfg, model, compiled: bool, gen: torch.Generator | None = None, backend: str = "inductor"):
    """``STEPS`` steps of a copy of ``model`` from ``cfg.seed``'s batches (drawn on ``gen``'s device)."""
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.param_groups(cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))

    def loss_of(mdl, x, y):
        return task_loss(value_scores(mdl, x, cfg.V, cfg.task.head), x, y, cfg.V, cfg.task)
    step = bijection_step.Step(model, opt, cfg, loss_of, compiled=compiled, backend=backend)
    gen = (gen or torch.Generator()).manual_seed(cfg.seed)
    out = [step(i, gen) for i in range(STEPS)]
    return [float(o[0]) for o in out], [float(o[2]) for o in out], model.state_dict()


@pytest.mark.slow      # compiling the forward and backward on 2 CPU cores: 40-60 s per head
@pytest.mark.parametrize("preset", ["ci", "authors_cpu"])
def test_the_compiled_step_equals_the_eager_step(preset):
    cfg = config.load(BijectionConfig, "bijection", preset, values={"model.n_layer": 2, "model.n_embd": 16,
                                                                     "model.n_head": 2, "batch_size": 8})
    model = build_model(cfg)
    torch._dynamo.reset()
    e_loss, e_norm, e_params = _run(cfg, model, compiled=False)
    c_loss, c_norm, c_params = _run(cfg, model, compiled=True)
    assert e_loss == pytest.approx(c_loss, rel=1e-5) and e_norm == pytest.approx(c_norm, rel=1e-4)
    assert len(set(e_loss)) == STEPS                        # the steps trained (three different losses)
    for k, v in e_params.items():
        torch.testing.assert_close(c_params[k], v, rtol=1e-5, atol=1e-6, msg=k)
    # and the parameters moved: the comparison is not of two untouched copies
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in c_params.items())


def test_the_traced_step_equals_the_eager_step_in_seconds():
    """The same comparison through dynamo and AOTAutograd without inductor's code generation (5-7 s
    of CPU): the step traces whole, the pointer head's ln_f hook and the model's forward included."""
    cfg = config.load(BijectionConfig, "bijection", "ci", values={"task.head": "pointer", "batch_size": 8})
    model = build_model(cfg)
    torch._dynamo.reset()
    e_loss, e_norm, e_params = _run(cfg, model, compiled=False)
    c_loss, c_norm, c_params = _run(cfg, model, compiled=True, backend="aot_eager")
    assert e_loss == pytest.approx(c_loss, rel=1e-6) and e_norm == pytest.approx(c_norm, rel=1e-5)
    for k, v in e_params.items():
        torch.testing.assert_close(c_params[k], v, rtol=1e-6, atol=1e-7, msg=k)


def test_compile_auto_is_on_for_cuda_only():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert bijection_step.wants_compile("auto", cuda) and not bijection_step.wants_compile("auto", cpu)
    assert bijection_step.wants_compile("on", cpu) and not bijection_step.wants_compile("off", cuda)
