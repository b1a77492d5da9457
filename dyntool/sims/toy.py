"""``dyntool sim toy``: the T = 5 toy head of arXiv 2512.22473, toy attention-head simulation, trained by autograd and recorded through
the generic seam (``Capture`` on ``SingleHeadAttention``) every step.

Default (arXiv 2512.22473, toy attention-head simulation, reconstructed): one-hot inputs x_j = e_j, labels (0, 0, 1, 1, 2), 3 classes,
d_k = d_v = 2, full attention (``--model.causal=true`` for causal), init N(0, 0.5²) under seed 0,
full-batch plain gradient descent with lr 0.5.  Because x_j is one-hot, the rows of W_V *are* the
value vectors v_j, so ``values`` traces the 2-D trajectories of F2.

Held-out set: the toy is a fixed 5-position memorisation task with no distribution to sample, so
its held-out set is the same positions and labels with perturbed inputs, x'_j = e_j + σ·ε_j
(σ = ``heldout_noise``, ε drawn under ``seed + 10000``).  ``heldout_loss``/``heldout_accuracy``
measure how robust the learned routing is to input noise, not generalisation to new positions.
Every step also logs the D10 gradient-energy shares ``diag_share_qk/v/o`` (routing, values,
readout), which the frame–precision measures use.

``--resume RUN`` continues a stopped run from its ``checkpoint.pt`` (:mod:`.resume`, the mechanism
every sim shares) into a new run whose rows from that step on are the uninterrupted run's.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import masks
from ..config import NonNegFloat, PosInt, Seed, to_dict
from ..attention import SingleHeadAttention
from ..errors import ConfigError, NonFiniteLossError
from ..record import metric_names as mn
from ..record.policy import RecordConfig, check_budget
from ..recorder import Recorder
from ..run_writer import RunWriter, critical_section, ensure_out_dir
from ..progress import progress
from . import resume as ckpt


@dataclass
class ToyModelConfig:
    T: int = 5
    labels: list[int] = field(default_factory=lambda: [0, 0, 1, 1, 2])
    n_classes: PosInt = 3
    d_k: PosInt = 2
    d_v: PosInt = 2
    causal: bool = False
    init_std: NonNegFloat = 0.5
    backend: str = "manual"

    def validate(self, prefix: str = "") -> None:
        if self.T < 2:
            raise ConfigError(prefix + "T", f"must be >= 2, got {self.T}")
        if len(self.labels) != self.T:
            raise ConfigError(prefix + "labels", f"needs T={self.T} labels, got {len(self.labels)}")
        if any(not 0 <= y < self.n_classes for y in self.labels):
            raise ConfigError(prefix + "labels", f"labels must lie in [0, {self.n_classes})")
        if self.backend not in ("manual", "sdpa"):
            raise ConfigError(prefix + "backend", "manual or sdpa (flex needs CUDA)")


@dataclass
class ToyConfig:
    seed: Seed = 0
    steps: PosInt = 500
    lr: float = 0.5
    heldout_noise: NonNegFloat = 0.1       # held-out inputs e_j + σ·ε (0 disables the held-out set)
    model: ToyModelConfig = field(default_factory=ToyModelConfig)
    # full-batch training: the training batch is the whole (fixed) sequence, so it is also the probe
    record: RecordConfig = field(default_factory=lambda: RecordConfig(every=1, dtype="float32", batch="train"))

    def validate(self, prefix: str = "") -> None:
        if self.steps < 1:
            raise ConfigError(prefix + "steps", f"must be >= 1, got {self.steps}")
        if not self.lr > 0:
            raise ConfigError(prefix + "lr", f"must be > 0, got {self.lr}")
        if not self.heldout_noise >= 0:
            raise ConfigError(prefix + "heldout_noise", f"must be >= 0, got {self.heldout_noise}")


def build(cfg: ToyConfig):
    m = cfg.model
    torch.manual_seed(cfg.seed)
    mask = masks.causal() if m.causal else masks.full()
    model = SingleHeadAttention(m.T, m.d_k, m.d_v, m.n_classes, mask=mask, backend=m.backend,
                                init_std=m.init_std)
    x = torch.eye(m.T).unsqueeze(0)                       # (1, T, T): x_j = e_j
    y = torch.tensor(m.labels).unsqueeze(0)               # (1, T)
    return model, x, y


def heldout_inputs(cfg: ToyConfig) -> torch.Tensor | None:
    """(1, T, T) perturbed one-hot inputs e_j + σ ε under ``seed + 10000``; the global RNG is restored."""
    if not cfg.heldout_noise > 0:
        return None
    g = torch.Generator().manual_seed(cfg.seed + 10000)
    T = cfg.model.T
    return (torch.eye(T) + cfg.heldout_noise * torch.randn(T, T, generator=g)).unsqueeze(0)


def _shares(model) -> dict:
    """D10 gradient-energy shares of routing (W_Q, W_K), values (W_V) and readout (W_O)."""
    g = {n: float(p.grad.double().pow(2).sum()) for n, p in model.named_parameters() if p.grad is not None}
    groups = {"qk": ("W_Q", "W_K"), "v": ("W_V",), "o": ("W_O",)}
    sq = {k: sum(v for n, v in g.items() if n.split(".")[-1] in names) for k, names in groups.items()}
    total = sum(sq.values())
    return {f"diag_share_{k}": v / total for k, v in sq.items()} if total > 0 else {}


def run_toy(cfg: ToyConfig, out_dir: str, name: str | None = None, tags: list[str] | None = None,
            quiet: bool = False, resume: dict | None = None, resumed_from: str | None = None) -> RunWriter:
    """Train and record the toy head; ``resume``: a checkpoint (:func:`dyntool.sims.resume.load`) of
    the run ``resumed_from`` to continue from."""
    model, x, y = build(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    start = ckpt.restore(resume, model, opt, {}) if resume is not None else 0
    x_ho = heldout_inputs(cfg)
    m = cfg.model
    check_budget(cfg.record, cfg.steps, ensure_out_dir(out_dir),
                 L=1, H=1, T=m.T, d_k=m.d_k, d_v=m.d_v)
    meta = {"record_batch": "train (full batch)"}
    if resumed_from is not None:
        meta["resumed_from"] = {"run": resumed_from, "step": start}
    run = RunWriter.create(out_dir, "toy", to_dict(cfg), name=name, seeds=[cfg.seed], tags=tags, extra_meta=meta)
    saver = ckpt.Checkpointer(run, "toy")
    with run:
        store = run.open_store(cfg.record.chunk_steps, cfg.record.flush_seconds,
                               attrs={"task": "toy", "labels": list(m.labels)})
        rec = Recorder(store, cfg.record, cfg.steps, m.T)
        done = start
        try:
            for step in progress(range(start, cfg.steps), desc="toy", disable=quiet, initial=start, total=cfg.steps):
                with critical_section():            # a SIGTERM/SIGINT lands between steps
                    _step(model, opt, x, y, x_ho, rec, run, step, m.n_classes)
                    done = step + 1
        except KeyboardInterrupt as e:             # Ctrl-C / SIGTERM: a checkpoint, and how to go on
            saver.save(done, model, opt, {})
            e.next_step = ckpt.continue_command("toy", run.path, done)
            raise
        saver.save(cfg.steps, model, opt, {})
        with torch.no_grad():
            final = F.cross_entropy(model(x).view(-1, m.n_classes), y.view(-1)).item()
        run.update_meta(final={"loss": final, "steps": cfg.steps})
    return run


def _step(model, opt, x, y, x_ho, rec, run, step: int, n_classes: int) -> None:
    """One full-batch step: forward (captured on a recorded step), its row, then the update."""
    cap = rec.capture(model) if rec.wants(step) else None
    with cap if cap is not None else nullcontext():
        logits = model(x)                                           # (1, T, C)
        loss = F.cross_entropy(logits.view(-1, n_classes), y.view(-1))
        if not torch.isfinite(loss):
            raise NonFiniteLossError(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    norms = {mn.grad_norm(n): p.grad.norm().item() for n, p in model.named_parameters()}
    with torch.no_grad():
        acc = (logits.argmax(-1) == y).float().mean().item()
    metrics = {"loss": loss.item(), "accuracy": acc, **norms, **_shares(model)}
    if x_ho is not None:
        with torch.no_grad():
            lo = model(x_ho)
            metrics["heldout_loss"] = F.cross_entropy(lo.view(-1, n_classes), y.view(-1)).item()
            metrics["heldout_accuracy"] = (lo.argmax(-1) == y).float().mean().item()
    if cap is not None:
        qs = cap.compute()
        rec.record(step, qs)
        metrics[mn.ATTN_ENTROPY] = qs["attn_entropy"].mean().item()     # metric column = array name
    run.log(step, **metrics)
    opt.step()
