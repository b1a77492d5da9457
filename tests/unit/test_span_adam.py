"""α = β in the span-recon backward against AdamW and the global-norm clip (the span spec's
"Adam no-op" test, docs/results.md): what a uniform rescale of dQ, dK leaves unchanged and what it
changes, each against a standard-backward run of the same model, data and initialisation (float64).

* Adam is invariant to a constant positive rescale of a parameter's gradient (up to ε), so with
  only parameters *at or above* the attention trainable (the embeddings and ln_1 frozen), α = β = c
  trains exactly as the standard backward when the clip does not bind;
* the clip is a *global* norm: c changes ‖g‖² = ‖g_rest‖² + c²‖g_qk‖², so when it binds, every
  parameter's gradient gets a different, step-varying factor and training differs (the first
  step's factor checked against that closed form);
* with the embeddings trainable, α = β is not a no-op even unclipped: dx = c·(dq W_Qᵀ + dk W_Kᵀ) +
  dv W_Vᵀ + … is not a rescale of the standard dx.
"""
from __future__ import annotations

import math

import torch

from dyntool.span import SpanConfig
from dyntool.train.config import ModelConfig
from dyntool.train.gpt import GPT

V, T, C = 11, 8, 16
FROZEN = ("wte.", "wpe.", "h.0.ln_1.")          # everything below layer 0's q, k


def _model(c: float, freeze: bool) -> GPT:
    torch.manual_seed(0)
    span = SpanConfig(alpha_q=c, beta_q=c, alpha_k=c, beta_k=c)
    m = GPT(ModelConfig(attention="span", n_layer=1, n_head=2, n_embd=C, tie_weights=False), V, T, span=span).double()
    for n, p in m.named_parameters():
        p.requires_grad_(not (freeze and n.startswith(FROZEN)))
    return m


def _train(c: float, freeze: bool, clip: float, steps: int = 4) -> tuple[dict, list[float]]:
    m = _model(c, freeze)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2, eps=1e-30, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    factors = []
    for _ in range(steps):
        x = torch.randint(0, V, (4, T + 1), generator=g)
        _, loss = m(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_([p for p in m.parameters() if p.requires_grad], clip))
        factors.append(min(1.0, clip / (norm + 1e-6)))
        opt.step()
    return {n: p.detach().clone() for n, p in m.named_parameters()}, factors


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_alpha_equal_beta_is_an_adam_no_op_above_the_attention_when_the_clip_does_not_bind():
    ref, f1 = _train(1.0, freeze=True, clip=1e9)
    for c in (2.0,):
        got, fc = _train(c, freeze=True, clip=1e9)
        assert f1 == fc == [1.0] * len(f1)                      # the clip never bound
        assert _max_diff(ref, got) < 1e-12
    # the check can fail: an unequal pair (α ≠ β) changes the same training
    m_ab = _model(1.0, True)
    assert _max_diff(ref, _train_with(m_ab, SpanConfig(alpha_q=2, beta_q=1, alpha_k=2, beta_k=1))) > 1e-6


def _train_with(m: GPT, span: SpanConfig, steps: int = 4) -> dict:
    m.set_span(span)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2, eps=1e-30, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, V, (4, T + 1), generator=g)
        _, loss = m(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {n: p.detach().clone() for n, p in m.named_parameters()}


def test_a_binding_global_clip_turns_alpha_equal_beta_into_a_change():
    # the first step's clip factor: the standard run's gradient split into the q, k rows of c_attn
    # (scaled by c under α = β = c) and the rest, ‖g‖ = sqrt(‖g_rest‖² + c²‖g_qk‖²)
    c, clip = 2.0, 0.05
    m = _model(1.0, freeze=True)
    x = torch.randint(0, V, (4, T + 1), generator=torch.Generator().manual_seed(1))
    _, loss = m(x[:, :-1], x[:, 1:])
    loss.backward()
    qk = m.h[0].attn.c_attn.weight.grad[: 2 * C]
    total2 = sum(float((p.grad ** 2).sum()) for p in m.parameters() if p.grad is not None)
    rest2 = total2 - float((qk ** 2).sum())
    expected = clip / (math.sqrt(rest2 + c ** 2 * float((qk ** 2).sum())) + 1e-6)
    ref, f1 = _train(1.0, freeze=True, clip=clip)
    got, fc = _train(c, freeze=True, clip=clip)
    assert max(f1) < 1 and max(fc) < 1                          # it binds on every step
    assert abs(fc[0] - expected) < 1e-9 * expected and fc[0] < f1[0]
    assert _max_diff(ref, got) > 1e-8                           # ... and training differs (small: Adam divides most of it out)


def test_alpha_equal_beta_changes_training_when_the_embeddings_learn():
    ref, _ = _train(1.0, freeze=False, clip=1e9)
    got, _ = _train(2.0, freeze=False, clip=1e9)
    assert _max_diff(ref, got) > 1e-6
