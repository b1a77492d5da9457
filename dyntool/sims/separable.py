"""The sticky chain on a model whose values are separable from its readout (issue 26, part 4).

Why: in the single-head model (:mod:`dyntool.sims.single_head`) the logits are α X W_V W_O, and at
the authors' init (std 0.1) W_Oᵀ W_O ≈ W_V W_Vᵀ ≈ 0.15 I, so a ×10 learning rate on W_V or on W_O
is the same first-order change of the logits: "values ×10 beats readout ×10" cannot be told apart
from "a bigger step on the product W_V W_O" there.  Here:

* ``n_heads`` causal heads (default 2), each with its own W_Q^h, W_K^h (d_x × d_k) and values W_V^h
  (d_x × d_v): g_i^h = Σ_j α_ij^h x_j W_V^h;
* one READOUT shared by the heads, a two-layer MLP on the concatenated head outputs G_i:
  logits_i = GELU(G_i W_1) W_2, W_1 (n_heads·d_v × d_hidden), W_2 (d_hidden × C).

The readout is nonlinear and shared, so ×10 on the readout (W_1, W_2) is no longer a rescaling
of the values' step.  Arms (learning rate ``lr`` everywhere except the named group × ``mult``):
``sgd``, ``values`` (every W_V^h; the EM-like arm), ``readout`` (W_1, W_2), ``routing`` (every
W_Q^h, W_K^h), ``all``, and the NORM-MATCHED controls ``readout_nm`` / ``routing_nm``: that group's
multiplier is set per seed so that its first update has the same Frobenius norm as the values'
first update under ``values`` (‖ΔW_group‖ = η·m·‖∇_group L‖ = η·mult·‖∇_V L‖ at init), i.e. the same
size of step, moved to another group.

Full-batch gradient descent on every run at once (a leading run axis, autograd), float32.

``device`` (cpu | cuda | cuda:N, default cpu): the batched weights, inputs and learning rates live
there, the run axis unchanged; data and initial weights are still made on the CPU (the same numbers
on any device) and the losses come back to the CPU where they are kept.  ``cpu`` is the model as it
was before the key existed, byte for byte; a CUDA run has not been made yet.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import masks
from .device import SimDevice, resolve
from .sticky_data import HELDOUT_OFFSET, generate, transition_matrix
from .targets import paired_tests, seed_mean_std, steps_to_targets, targets_markdown

GROUPS = {"routing": ("W_Q", "W_K"), "values": ("W_V",), "readout": ("W_1", "W_2")}
PARAMS = ("W_Q", "W_K", "W_V", "W_1", "W_2")
ARMS = ("sgd", "values", "readout", "routing", "all", "readout_nm", "routing_nm")
_SCALED = {"sgd": (), "values": ("values",), "readout": ("readout",), "routing": ("routing",),
           "all": ("routing", "values", "readout"), "readout_nm": ("readout",), "routing_nm": ("routing",)}


@dataclass
class SeparableConfig:
    seeds: list[int] = field(default_factory=lambda: [42, 2024, 1337, 7777, 9999, 1, 2, 3, 4, 5])
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    steps: int = 1000
    T: int = 500
    n_heads: int = 2
    d_x: int = 20
    d_k: int = 10
    d_v: int = 15
    d_hidden: int = 32
    n_symbols: int = 8
    init_std: float = 0.1
    lr: float = 0.01
    mult: float = 10.0
    heldout_every: int = 10
    target_fracs: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    device: SimDevice = "cpu"           # cpu | cuda | cuda:N

    def validate(self) -> None:
        """Raises ValueError for bad arms or sizes, ConfigError for a device this machine lacks."""
        bad = [a for a in self.arms if a not in ARMS]
        if bad or "sgd" not in self.arms or "values" not in self.arms:
            raise ValueError(f"arms must include sgd and values, known: {ARMS}; unknown {bad}")
        if self.T < 3 or self.steps < 1 or self.n_heads < 1 or not self.lr > 0 or not self.mult > 0:
            raise ValueError("T >= 3, steps >= 1, n_heads >= 1, lr > 0, mult > 0")
        resolve(self.device)


def init_weights(seeds, cfg: SeparableConfig) -> dict[str, torch.Tensor]:
    """Per seed: manual_seed(seed), then randn × init_std for W_Q, W_K, W_V (all heads), W_1, W_2."""
    H = cfg.n_heads
    shapes = {"W_Q": (cfg.n_heads, cfg.d_x, cfg.d_k), "W_K": (cfg.n_heads, cfg.d_x, cfg.d_k),
                              "W_V": (cfg.n_heads, cfg.d_x, cfg.d_v),
                              "W_1": (H * cfg.d_v, cfg.d_hidden), "W_2": (cfg.d_hidden, cfg.n_symbols)}
    per = []
    for s in seeds:
        torch.manual_seed(s)
        per.append({n: torch.randn(*shapes[n]) * cfg.init_std for n in PARAMS})
    return {n: torch.stack([p[n] for p in per]) for n in PARAMS}


def forward(W: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits (R, N, C) of the runs' weights W on inputs x (R, N, d_x); causal, diagonal kept."""
    N, d_k = x.shape[1], W["W_Q"].shape[-1]
    q = torch.einsum("rnd,rhdk->rhnk", x, W["W_Q"]) / math.sqrt(d_k)
    k = torch.einsum("rnd,rhdk->rhnk", x, W["W_K"])
    v = torch.einsum("rnd,rhdv->rhnv", x, W["W_V"])
    s = q @ k.transpose(-1, -2)
    s = s.masked_fill(~masks.causal().dense(N, device=x.device)[0], float("-inf"))
    g = torch.softmax(s, -1) @ v                                             # (R, H, N, d_v)
    G = g.permute(0, 2, 1, 3).reshape(x.shape[0], N, -1)                      # heads concatenated
    return torch.nn.functional.gelu(G @ W["W_1"]) @ W["W_2"]


def losses(W, x, y) -> torch.Tensor:
    """(R,) mean cross-entropy per run."""
    logits = forward(W, x)
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(-1)


def gradients(W, x, y) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(R,) losses and each run's gradient of its OWN mean loss (runs are independent)."""
    Wg = {n: t.detach().requires_grad_(True) for n, t in W.items()}
    loss = losses(Wg, x, y)
    grads = torch.autograd.grad(loss.sum(), [Wg[n] for n in PARAMS])
    return loss.detach(), dict(zip(PARAMS, grads))


def group_norms(grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """(R,) Frobenius norm of each group's gradient."""
    return {g: torch.sqrt(sum(grads[n].flatten(1).pow(2).sum(1) for n in names)) for g, names in GROUPS.items()}


def arm_multipliers(arm: str, mult: float, norms0: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """{group: (R,) learning-rate multiplier}.  Norm-matched arms need the step-0 gradient norms:
    m_group = mult · ‖∇_V L‖ / ‖∇_group L‖, so ‖ΔW_group‖ equals the ``values`` arm's ‖ΔW_V‖."""
    R = next(iter(norms0.values())).shape[0] if norms0 else 1
    out = {g: torch.ones(R, dtype=torch.float64) for g in GROUPS}
    for g in _SCALED[arm]:
        if arm.endswith("_nm"):
            out[g] = mult * norms0["values"].double() / norms0[g].double()
        else:
            out[g] = torch.full((R,), float(mult), dtype=torch.float64)
    return out


@dataclass
class Result:
    runs: list[tuple[int, str]]           # (seed, arm) per run
    losses: np.ndarray                    # (R, steps + 1): loss before update k; last = after the budget
    heldout: list[list[tuple[int, float]]]
    mults: dict[str, np.ndarray]          # group -> (R,) learning-rate multiplier
    first_step: dict[str, np.ndarray]     # per run: update norm per group and first-order loss decrease


def train(cfg: SeparableConfig, on_step=None) -> Result:
    """Every (seed, arm) run at once on ``cfg.device``; ``on_step(step, losses)`` gets each step's
    (R,) train losses as numpy."""
    cfg.validate()
    dev = resolve(cfg.device)
    P = transition_matrix(cfg.n_symbols)
    runs = [(s, a) for s in cfg.seeds for a in cfg.arms]
    data = {s: generate(s, cfg.T, cfg.n_symbols, cfg.d_x, P) for s in cfg.seeds}
    held = {s: generate(s + HELDOUT_OFFSET, cfg.T, cfg.n_symbols, cfg.d_x, P) for s in cfg.seeds}
    # made on the CPU, then moved (a no-op on the CPU): the same data and initial weights anywhere
    x = torch.stack([data[s].x for s, _ in runs]).to(dev)
    y = torch.stack([data[s].y for s, _ in runs]).to(dev)
    xh = torch.stack([held[s].x for s, _ in runs]).to(dev)
    yh = torch.stack([held[s].y for s, _ in runs]).to(dev)
    W = {n: w.to(dev) for n, w in init_weights([s for s, _ in runs], cfg).items()}
    R = len(runs)
    loss, grads = gradients(W, x, y)
    # the multipliers are set on the CPU (per-arm indexing, float64, numpy for the summary)
    norms0 = {g: v.cpu() for g, v in group_norms(grads).items()}
    # norm matching: against the values arm's values-gradient norm of the SAME seed (same init, so
    # it is this run's own ‖∇_V L‖ at step 0)
    mults = {g: torch.ones(R, dtype=torch.float64) for g in GROUPS}
    for arm in set(cfg.arms):
        ii = torch.tensor([i for i, (_, a) in enumerate(runs) if a == arm])
        m = arm_multipliers(arm, cfg.mult, {g: v[ii] for g, v in norms0.items()})
        for g in GROUPS:
            mults[g][ii] = m[g]
    lr = {n: (cfg.lr * mults[g]).float().to(dev) for g, names in GROUPS.items() for n in names}
    first = {f"update_norm_{g}": (cfg.lr * mults[g] * norms0[g].double()).numpy() for g in GROUPS}
    first["first_order_decrease"] = sum(cfg.lr * mults[g] * norms0[g].double() ** 2 for g in GROUPS).numpy()
    curve = np.empty((R, cfg.steps + 1))
    heldout: list[list[tuple[int, float]]] = [[] for _ in runs]
    for step in range(cfg.steps + 1):
        if step:
            loss, grads = gradients(W, x, y)
        if not torch.isfinite(loss).all():
            raise FloatingPointError(f"non-finite loss at step {step}: run {runs[int((~torch.isfinite(loss)).nonzero()[0])]}")
        curve[:, step] = loss.double().cpu().numpy()          # the curve is kept every step
        if step % cfg.heldout_every == 0 or step == cfg.steps:
            with torch.no_grad():
                hl = losses(W, xh, yh).double().cpu().numpy()
            for i in range(R):
                heldout[i].append((step, float(hl[i])))
        if on_step is not None:
            on_step(step, curve[:, step])
        if step < cfg.steps:
            W = {n: W[n] - lr[n].view(R, *([1] * (W[n].dim() - 1))) * grads[n] for n in PARAMS}
    return Result(runs, curve, heldout, {g: v.numpy() for g, v in mults.items()}, first)


def summarise(cfg: SeparableConfig, res: Result) -> dict:
    """Final losses, steps to 25/50/75/100 % of SGD's loss drop (train and held-out) with paired
    tests against ``values`` (the EM-like arm; values itself against sgd), the multipliers of the
    norm-matched arms and every arm's first step (update norm per group, first-order decrease)."""
    idx = {r: i for i, r in enumerate(res.runs)}
    per_seed = []
    for s in cfg.seeds:
        row = {"seed": s}
        for a in cfg.arms:
            i = idx[(s, a)]
            row[a] = {"losses": res.losses[i, :-1].tolist(), "final_loss": float(res.losses[i, -1]),
                      "heldout_losses": [list(p) for p in res.heldout[i]], "heldout_loss": res.heldout[i][-1][1]}
        per_seed.append(row)
    tg, per_arm = steps_to_targets(cfg, per_seed, res.heldout, idx, {a: a for a in cfg.arms}, ref="values")
    arms = {}
    for a in cfg.arms:
        ii = [idx[(s, a)] for s in cfg.seeds]
        e = {"final_loss": seed_mean_std([r[a]["final_loss"] for r in per_seed]),
             "final_heldout_loss": seed_mean_std([r[a]["heldout_loss"] for r in per_seed]),
             "lr_mult": {g: seed_mean_std(res.mults[g][ii]) for g in GROUPS},
             "first_step": {k: seed_mean_std(v[ii]) for k, v in res.first_step.items()},
             "targets": per_arm[a]}
        if a != "values":
            e["vs_values_final_heldout_loss"] = paired_tests([r[a]["heldout_loss"] for r in per_seed],
                                                        [r["values"]["heldout_loss"] for r in per_seed])
        arms[a] = e
    return {"kind": "sticky-separable", "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
            "seeds": list(cfg.seeds), "steps": cfg.steps, "ref": "values", "targets": tg, "arms": arms,
            "std": "sample (ddof = 1) over seeds", "tests": "paired t-test and Wilcoxon signed-rank, two-sided",
            "per_seed": [{"seed": r["seed"], **{a: {k: v for k, v in r[a].items() if k in ("final_loss", "heldout_loss")}
                                                 for a in cfg.arms}} for r in per_seed]}


def table(summary: dict) -> str:
    """Markdown: per arm the learning-rate multipliers, first step, final losses; then the targets."""
    head = ["arm", "LR mult routing / values / readout", "first-step ‖ΔW‖ routing / values / readout",
            "first-order −ΔL at step 0", "final train loss", "final held-out loss"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a, e in summary["arms"].items():
        m, f = e["lr_mult"], e["first_step"]
        lines.append("| " + " | ".join([
            a, " / ".join(f"{m[g]['mean']:.3g}" for g in GROUPS),
            " / ".join(f"{f['update_norm_' + g]['mean']:.2e}" for g in GROUPS),
            f"{f['first_order_decrease']['mean']:.2e}",
            f"{e['final_loss']['mean']:.4f} ± {e['final_loss']['std']:.4f}",
            f"{e['final_heldout_loss']['mean']:.4f} ± {e['final_heldout_loss']['std']:.4f}"]) + " |")
    return "\n".join(lines) + "\n\n" + targets_markdown(summary)
