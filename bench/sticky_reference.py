"""Reference: the straightforward per-run PyTorch autograd loop of the authors' sticky-chain study.

Re-implemented from arXiv 2512.22473's sticky-chain setup, not copied: one ``nn.Module`` single head, ``F.cross_entropy``,
``torch.optim.SGD`` for the SGD arm and manual ``no_grad`` updates for the EM-like arm, one run at a
time, the full T×T score matrix materialised and masked.  Same RNG order as the authors' script:
``manual_seed(seed)`` → data (μ under embed_seed 0, state restored) → ``manual_seed(seed)`` before
each arm's init.  This is the baseline that ``bench_sticky.py`` and the engine tests compare against.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from dyntool.sims.sticky_data import generate, transition_matrix
except ModuleNotFoundError:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dyntool.sims.sticky_data import generate, transition_matrix


class RefHead(nn.Module):
    """Single attention head, row-major: Q = X W_Q, causal (diagonal kept), logits = (α V) W_O."""

    def __init__(self, d_x=20, d_k=10, d_v=15, n_classes=8, causal=True, init_std=0.1):
        super().__init__()
        self.d_k, self.causal = d_k, causal
        # drawn in this order right after manual_seed(seed): W_Q, W_K, W_V, W_O
        self.W_Q = nn.Parameter(torch.randn(d_x, d_k) * init_std)
        self.W_K = nn.Parameter(torch.randn(d_x, d_k) * init_std)
        self.W_V = nn.Parameter(torch.randn(d_x, d_v) * init_std)
        self.W_O = nn.Parameter(torch.randn(d_v, n_classes) * init_std)

    def forward(self, x):
        q, k, v = x @ self.W_Q, x @ self.W_K, x @ self.W_V
        scores = q @ k.T / (self.d_k ** 0.5)                        # (N, N)
        if self.causal:
            n = x.shape[0]
            upper = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(upper, float("-inf"))
        alpha = F.softmax(scores, dim=-1)
        return (alpha @ v) @ self.W_O, alpha


def init_model(seed, dtype=torch.float32, **kw):
    """Seeded init shared by both arms of a seed."""
    torch.manual_seed(seed)
    return RefHead(**kw).to(dtype)


def train_sgd(model, x, y, n_steps, lr=0.01, step_hook=None):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(n_steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x)[0], y)
        loss.backward()
        opt.step()
        losses.append(loss.item())          # loss BEFORE this update
        if step_hook:
            step_hook(step)
    return losses


def train_em_like(model, x, y, n_steps, lr_routing=0.01, lr_value=0.1, step_hook=None):
    losses = []
    for step in range(n_steps):
        loss = F.cross_entropy(model(x)[0], y)
        losses.append(loss.item())
        loss.backward()
        with torch.no_grad():
            model.W_V -= lr_value * model.W_V.grad                 # fast "M-step" on values
            for W in (model.W_Q, model.W_K, model.W_O):             # slow routing/readout
                W -= lr_routing * W.grad
        for W in model.parameters():
            W.grad = None
        if step_hook:
            step_hook(step)
    return losses


@torch.no_grad()
def evaluate(model, x, y):
    logits = model(x)[0]
    probs = F.softmax(logits, dim=-1)
    return {
        "loss": F.cross_entropy(logits, y).item(),
        "entropy": (-(probs * torch.log(probs + 1e-10)).sum(-1).mean()).item(),
        "accuracy": (logits.argmax(-1) == y).float().mean().item(),
    }


def run_seed(seed, T=2000, n_steps=1000, construction="script", dtype=torch.float32,
             arms=("sgd", "em_like"), step_hook=None):
    """Both arms of one seed; returns {arm: {"losses": [...], "metrics": {...}}}."""
    data = generate(seed, T=T, P=transition_matrix(construction=construction))
    x, y = data.x.to(dtype), data.y
    out = {}
    for arm in arms:
        model = init_model(seed, dtype)
        train = train_sgd if arm == "sgd" else train_em_like
        losses = train(model, x, y, n_steps, step_hook=step_hook)
        out[arm] = {"losses": losses, "metrics": evaluate(model, x, y)}
    return out


if __name__ == "__main__":
    res = run_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 42, T=200, n_steps=20)
    for arm, r in res.items():
        print(arm, [round(v, 5) for v in r["losses"][:5]], r["metrics"])
