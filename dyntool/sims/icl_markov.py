"""One ``icl-markov`` run: train the two-layer attention-only model on in-context Markov chains and
record it (Edelman et al. 2024, arXiv 2402.11004; the study around it: :mod:`.icl_markov_study`).

Every step draws a fresh batch of chains (``batch_size`` sequences of T + 1 states from the run's
prior; the model predicts x_{t+1} from x_0..x_t at all T positions, cross-entropy averaged over
them) and takes one AdamW step (the authors' minGPT settings: betas (0.9, 0.95), weight decay
0.1 on the linear maps, no clipping).

Recorded:

* **the cheap tier on every step** (``record.cheap_every = 1``, :class:`dyntool.flight.FlightRecorder`
  on the step's own forward/backward): per layer × head attention entropy, max logit, ‖∂L/∂S‖,
  E_α[b], column statistics -> ``metrics.jsonl`` (``score_grad_norm/L0H0`` ...);
* **the full tier** (α, B, advantages, ∂L/∂S, U, q, k, v, ...) on the ``[record]`` schedule, of the
  first ``record.seqs`` sequences of the same training batch, captured in the same backward as the
  cheap tier (``FlightRecorder.alongside``), so on a full-tier step the cheap tier is the full
  tier's reduction (over the whole batch rather than the recorded sequences);
* **every ``eval_every`` steps** (the *logged* steps), on a fixed held-out set of chains from a
  separate generator (``seed + heldout_seed_offset``): KL(strategy ‖ model) for the uniform,
  unigram and bigram strategies, the held-out loss, and each head's previous-token and induction
  scores (:mod:`.icl_markov_metrics`); their chance levels and the Bayes loss go to ``meta.json``.

Checkpoints (:mod:`.resume`, the mechanism every sim shares): a run stopped by Ctrl-C/SIGTERM, the
study's ``time_limit_min`` or ``stop_at_step`` writes ``checkpoint.pt`` (also at the end and every
``checkpoint_every`` steps): model, AdamW, the batch generator's state (numpy's, in ``extra``) and
the RNGs.  Its continuation ``RUN-resumeSTEP`` (made by ``--resume STUDY``,
:mod:`.icl_markov_resume`) logs from that step on, the stopped run having logged only the steps
it took, so the two runs' rows together are the uninterrupted run's; its full tier records the
scheduled steps from that step on, in its own store.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from ..config import to_dict
from ..errors import NonFiniteLossError, RunError
from ..flight import FlightRecorder
from ..progress import progress
from ..record.policy import check_budget, schedule
from ..recording_session import RecordingSession
from ..run_writer import RunWriter, critical_section
from ..train.ddp import resolve_device
from . import icl_markov_task as task
from . import resume as ckpt
from .icl_markov_config import ICLMarkovConfig
from .icl_markov_metrics import chance_levels, evaluate
from .icl_markov_model import ICLMarkovModel

KIND = "icl-markov"


def build_model(cfg: ICLMarkovConfig, seed: int) -> ICLMarkovModel:
    m = cfg.model
    torch.manual_seed(seed)
    return ICLMarkovModel(cfg.k, cfg.T, m.n_layer, m.n_head, m.n_embd, m.backend, m.init_std, m.proj_std)


def heldout(cfg: ICLMarkovConfig, seed: int, prior: str) -> torch.Tensor:
    """The fixed held-out chains of a run: (heldout_seqs, T) states."""
    x, _ = task.sample(cfg.heldout_seqs, cfg.T, cfg.k, cfg.alpha, prior,
                       np.random.default_rng(seed + cfg.heldout_seed_offset), cfg.unigram_share)
    return x


def other_heldout(cfg: ICLMarkovConfig, seed: int, prior: str, device) -> dict[str, tuple]:
    """The held-out sets of ``eval_priors`` besides the run's own: prior -> (states, strategies);
    their KLs and loss are logged as ``<metric>@<prior>`` (the transfer of the contrast's runs)."""
    out = {}
    for ep in cfg.eval_priors:
        if ep != prior and ep not in out:
            x = heldout(cfg, seed, ep)
            out[ep] = (x.to(device), {n: p.to(device) for n, p in task.strategy_probs(x, cfg.k, cfg.alpha).items()})
    return out


def loss_of(model, x: torch.Tensor) -> torch.Tensor:
    """Mean next-state cross-entropy of states ``x`` (B, T + 1) at all T positions."""
    logits = model(x[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))


def train_step(model, opt, x: torch.Tensor, flight: FlightRecorder, cap=None, grad_clip: float = 0.0):
    """One AdamW step on states ``x`` with the cheap tier (``flight``) on its forward/backward and,
    when ``cap`` (a Capture) is given, the full tier alongside.  Returns (loss, cheap-tier result,
    gradient norm); the optimizer step comes after both tiers have their gradients."""
    flight.reset()
    with (flight.alongside(cap) if cap is not None else flight):
        loss = loss_of(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    if not torch.isfinite(loss):
        raise NonFiniteLossError(0)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else float("inf"))
    res = flight.result()
    opt.step()
    return loss, res, norm


def run_one(cfg: ICLMarkovConfig, out_dir, seed: int, prior: str, name: str, tags=None, quiet: bool = False,
            extra_record_steps: list[int] | None = None, study: str = "", resume: dict | None = None,
            resumed_from: str | None = None, deadline: float | None = None) -> RunWriter:
    """Train and record one run (``seed``, ``prior``) into ``out_dir/name``; ``resume``: a checkpoint
    (:func:`dyntool.sims.resume.load`) of the run ``resumed_from`` to continue from.  It stops, with a
    checkpoint and ``final.stopped_early``, before a step begun past ``deadline`` (``time.perf_counter``)
    or at ``cfg.stop_at_step``."""
    dev = resolve_device(cfg.device)
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    rc = cfg.record
    if extra_record_steps:
        rc = replace(rc, steps=sorted(set(rc.steps) | set(int(s) for s in extra_record_steps)))
    m, T = cfg.model, cfg.T
    hs = m.n_embd // m.n_head
    check_budget(rc, len(schedule(rc, cfg.steps)), out_dir, L=m.n_layer, H=m.n_head, T=T, d_k=hs, d_v=hs)
    model = build_model(cfg, seed).to(dev, dtype)
    opt = torch.optim.AdamW(model.param_groups(cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    xh = heldout(cfg, seed, prior)
    strategies = task.strategy_probs(xh, cfg.k, cfg.alpha)
    xh = xh.to(dev)
    strategies = {n: p.to(dev) for n, p in strategies.items()}
    others = other_heldout(cfg, seed, prior, dev)
    rng = np.random.default_rng(seed)
    start = 0
    if resume is not None:                 # after the held-out sets: they draw from their own generators
        start = ckpt.restore(resume, model, opt, {})
        rng.bit_generator.state = _rng_state(resume["extra"].get("batches"), parse=True)
    run_cfg = {**to_dict(cfg), "seed": seed, "prior": prior, "record": to_dict(rc)}
    run_cfg.pop("seeds")
    meta = {"record_batch": f"train: the first {rc.seqs} sequences of the step's batch", "study": study,
            "n_params": model.num_params(), "chance": chance_levels(xh.cpu()),
            "bayes_loss": task.bayes_loss(xh.cpu(), cfg.k, cfg.alpha), "prior": prior,
            "eval_priors": sorted(others)}
    if resumed_from is not None:
        meta["resumed_from"] = {"run": resumed_from, "step": start}
    prev_threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run = RunWriter.create(out_dir, KIND, run_cfg, name=name, seeds=[seed], tags=tags, device=str(dev),
                           extra_meta=meta)
    saver = ckpt.Checkpointer(run, KIND, cfg.checkpoint_every)

    def save(at: int) -> None:
        saver.save(at, model, opt, {}, {"batches": _rng_state(rng.bit_generator.state)})
    t0 = time.perf_counter()
    try:
        with run:
            session = RecordingSession(run, rc, cfg.steps)
            rec = session.open_recorder(T, dict(L=m.n_layer, H=m.n_head, T=T, d_k=hs, d_v=hs), attrs={
                "task": KIND, "k": cfg.k, "T": T, "prior": prior, "adapter": "dyntool"})
            flight = session.open_flight(model)          # its paths (and why) go to meta.json
            done, stop_at = start, None
            try:
                for step in progress(range(start, cfg.steps), desc=f"icl-markov {name}", disable=quiet,
                                     initial=start, total=cfg.steps):
                    # a stop comes before the step, which the continuation then takes whole (rows too);
                    # the time limit lets every run take one step, so each call gets somewhere
                    if (0 < cfg.stop_at_step == step) or \
                            (deadline is not None and step > start and time.perf_counter() > deadline):
                        stop_at = step
                        break
                    with critical_section():       # a SIGTERM/SIGINT lands between steps
                        _step(cfg, prior, model, opt, rng, dev, xh, strategies, others, session, rec, flight, run, step)
                        done = step + 1
                    if saver.due(done) and done < cfg.steps:
                        save(done)
            except KeyboardInterrupt as e:          # Ctrl-C / SIGTERM: a checkpoint, and how to go on
                save(done)
                e.next_step = ckpt.continue_command(KIND, run.path.parent, done)
                raise
            save(done)
            seconds = time.perf_counter() - t0
            final = {"seconds": round(seconds, 1), "sec_per_step": seconds / max(done - start, 1),
                     "steps_done": done, "stopped_early": stop_at is not None}
            if stop_at is not None:
                final["next_step"] = ckpt.continue_command(KIND, run.path.parent, done)
            run.update_meta(final=final)
    finally:
        torch.set_num_threads(prev_threads)
    return run


def _step(cfg, prior: str, model, opt, rng, dev, xh, strategies, others, session, rec, flight, run, step: int) -> None:
    """One step: the held-out evaluation on a logged step, a fresh batch, the update with the cheap
    tier (and the full tier on a recorded step), then its metrics row."""
    row = {}
    if step % cfg.eval_every == 0 or step == cfg.steps - 1:
        row = evaluate(model, xh, strategies)
        for ep, (xo, so) in others.items():
            row.update({f"{k_}@{ep}": v for k_, v in evaluate(model, xo, so, scores=False).items()})
    x, _ = task.sample(cfg.batch_size, cfg.T + 1, cfg.k, cfg.alpha, prior, rng, cfg.unigram_share)
    x = x.to(dev)
    cap = rec.capture(model) if session.wants(step) else None
    try:
        loss, res, norm = train_step(model, opt, x, flight, cap, cfg.grad_clip)
    except NonFiniteLossError:
        raise NonFiniteLossError(step) from None
    if cap is not None:
        rec.record_capture(step, cap, extra={"train_loss": loss.item()})
    if session.cheap_wants(step):
        row.update(session.cheap_read(res).get())
    run.log(step, loss=loss.item(), grad_norm=float(norm), **row)


def _rng_state(st: dict | None, parse: bool = False) -> dict:
    """numpy's generator state <-> the checkpoint's form: its integers (128-bit for PCG64) as strings,
    which ``torch.load(weights_only=True)`` reads back as they were."""
    if not isinstance(st, dict):
        raise RunError("the checkpoint has no batch generator state (extra.batches): not an icl-markov run's")
    conv = int if parse else str
    return {k: ({kk: conv(vv) for kk, vv in v.items()} if isinstance(v, dict) else
                v if k == "bit_generator" else conv(v)) for k, v in st.items()}
