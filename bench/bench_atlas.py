"""What the atlas probe costs beside the cheap tier alone (one process, interleaved rounds, medians).

    python bench/bench_atlas.py [--preset cpu] [--reps 5] [--steps 16] [--parts 30] [--json FILE]
                                [--probe-seqs 4] [--rep-seqs 4] [--after 60] [--fine 12]

dyntool's GPT at the ``atlas.toml`` preset's shape (cpu: 2 layers, 4 heads, C = 64, B = 16, T = 64;
random tokens over WikiText-2's vocabulary, so no data is read).  Arms, each a training step
(forward + backward + AdamW) with the cheap tier attached and its statistics read:

- ``cheap``: the cheap tier alone (what ``--record.cheap_every=1`` adds);
- ``atlas``: plus the atlas probe at its defaults (4 + 4 probe sequences; the forward scores every
  step, the gradient side every 16th: :class:`dyntool.train.atlas_probe.AtlasSettings`);
- ``atlas_forward``: the forward scores alone, every step (what the probe adds on 15 steps of 16);
- ``atlas_grad``: the gradient side on every step (what it adds on the 16th).

Target of issue 49: ``atlas`` ≤ 1.05 × ``cheap``.  Two clocks: wall time (``over_cheap``) and the
process's CPU time (``cpu_over_cheap``; with one thread it is the work done, and it holds still on
a machine whose other jobs take the cores away at random, where wall-time ratios drift).
``--after N``: whether a probe call makes the training step after it costlier (a hidden cost the
parts would not see): that step's CPU time against a cheap-tier arm's, N interleaved rounds, beside
the same ratio for two identical cheap-tier arms (the noise floor).
``--fine N``: ``atlas`` against ``cheap`` interleaved step by step, N periods of ``grad_every`` steps
(the finest whole-schedule measure: each period holds one gradient step).
``--parts N``: each side's CPU time per call against one step, N interleaved rounds, and the
schedule's cost they imply (finer than whole arms on a loaded machine: a round is one second).  A round runs ``--steps`` steps of each arm (16:
one period of the gradient side, so every round of ``atlas`` holds one gradient step); rounds
rotate the order of the arms; ratios are the medians of the per-round ratios (paired, so the
drift of a shared machine cancels).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_tiers import VOCAB, interleave, ratio             # noqa: E402
from common import hardware                                  # noqa: E402
from dyntool.flight import FlightRecorder                    # noqa: E402
from dyntool.train.atlas_probe import AtlasProbe, AtlasSettings   # noqa: E402
from dyntool.train.gpt import GPT                            # noqa: E402
from dyntool.train.runner import load_config                 # noqa: E402

BASE = AtlasSettings()          # the probe's settings every arm starts from (--probe-seqs, --rep-seqs)
NEVER = 10 ** 9                 # a grad_every past any step but 0: the forward side alone


class _Corpus:
    vocab_size = VOCAB

    def split(self, name):
        return np.random.default_rng(0).integers(0, VOCAB, 200_000).astype(np.int32)


def arm(cfg, batch, probe: AtlasSettings | None):
    torch.manual_seed(0)
    model = GPT(cfg.model, VOCAB, cfg.data.block_size)
    flight = FlightRecorder(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    p = None
    if probe is not None:
        p = AtlasProbe(probe)
        p.on_train_start(SimpleNamespace(raw=model, cfg=cfg, corpus=_Corpus(), device=torch.device("cpu")))
    state = {"step": 0}

    def run(n):
        for _ in range(n):
            if p is not None:
                p.on_step_start(state["step"])
            with flight:
                model(*batch)[1].backward()
            flight.metrics()
            flight.reset()
            opt.step()
            opt.zero_grad(set_to_none=True)
            state["step"] += 1
    run.probe = p
    return run


def parts(cfg, batch, rounds: int) -> dict:
    """CPU time per call of the probe's two sides against one cheap-tier step, interleaved, and the
    cost of the default schedule they imply: 1 + ((g − 1) f + grad) / g per step (g = grad_every)."""
    step, probe = arm(cfg, batch, None), arm(cfg, batch, BASE).probe
    calls = {"step": lambda: step(1), "forward": lambda: probe.measure(grad=False),
             "grad": lambda: probe.measure(grad=True)}
    for f in calls.values():
        f()
    cpu = {n: [] for n in calls}
    for r in range(rounds):
        for n, f in list(calls.items())[r % 3:] + list(calls.items())[:r % 3]:
            c = time.process_time()
            f()
            cpu[n].append(time.process_time() - c)
    f, g = ratio(cpu, "forward", "step"), ratio(cpu, "grad", "step")
    every = BASE.grad_every
    return {"rounds": rounds, "cpu_s": {n: statistics.median(v) for n, v in cpu.items()},
            "forward_over_step": f, "grad_over_step": g, "grad_every": every,
            "implied_atlas_over_cheap": 1 + ((every - 1) * f + g) / every}


def after(cfg, batch, rounds: int) -> dict:
    """CPU time of a training step that follows the probe's forward side, over a cheap-tier arm's
    step, and of a second cheap-tier arm over the first (the floor): medians of ``rounds`` rounds."""
    cheap, twin = arm(cfg, batch, None), arm(cfg, batch, None)
    atlas = arm(cfg, batch, dataclasses.replace(BASE, grad_every=NEVER))
    probe, cpu = atlas.probe, {"cheap": [], "twin": [], "after_probe": []}
    measure, probe.on_step_start = probe.on_step_start, lambda step: None    # the arm's step alone
    for _ in range(rounds):
        for name, f in (("cheap", cheap), ("twin", twin)):
            c = time.process_time()
            f(1)
            cpu[name].append(time.process_time() - c)
        measure(1)
        c = time.process_time()
        atlas(1)
        cpu["after_probe"].append(time.process_time() - c)
    return {"rounds": rounds, "cpu_s": {n: statistics.median(v) for n, v in cpu.items()},
            "after_probe_over_cheap": ratio(cpu, "after_probe", "cheap"), "twin_over_cheap": ratio(cpu, "twin", "cheap")}


def fine(cfg, batch, periods: int) -> dict:
    """``atlas`` over ``cheap`` interleaved step by step (the order alternating), CPU time: a period
    is one gradient-side period (``grad_every`` steps of each arm), its ratio that of the sums; the
    median over ``periods`` and the pooled ratio.  Whole-arm rounds of 16 steps compare blocks ~10 s
    apart, whose drift (a few %) is the size of what is measured; a step apart it cancels."""
    cheap, atlas = arm(cfg, batch, None), arm(cfg, batch, BASE)
    cheap(2)                                          # warm-up
    atlas(BASE.grad_every)                            # warm-up that leaves the atlas arm at a period's start
    sums = {"cheap": [], "atlas": []}
    for _ in range(periods):
        per = {"cheap": 0.0, "atlas": 0.0}
        pair = [("cheap", cheap), ("atlas", atlas)]
        for i in range(BASE.grad_every):
            for name, f in (pair if i % 2 else pair[::-1]):
                c = time.process_time()
                f(1)
                per[name] += time.process_time() - c
        for n in per:
            sums[n].append(per[n])
    return {"periods": periods, "grad_every": BASE.grad_every,
            "cpu_period_s": {n: statistics.median(v) for n, v in sums.items()},
            "atlas_over_cheap": ratio(sums, "atlas", "cheap"),
            "pooled_atlas_over_cheap": sum(sums["atlas"]) / sum(sums["cheap"]),
            "per_period": [a / c for a, c in zip(sums["atlas"], sums["cheap"])]}


def logged(name: str, run, cpu: dict):
    """``run`` that keeps each call's CPU time per step in ``cpu[name]`` and says on stderr what it
    took (a shared machine may end the bench early: the rounds it finished are still there)."""
    def timed(n):
        t, c = time.perf_counter(), time.process_time()
        run(n)
        cpu.setdefault(name, []).append((time.process_time() - c) / n)
        print(f"{name}: {n} steps in {time.perf_counter() - t:.3f} s wall, {cpu[name][-1] * n:.3f} s cpu",
              file=sys.stderr, flush=True)
    return timed


def arms_ratios(cfg, batch, reps: int, steps: int) -> dict:
    arms = {"cheap": arm(cfg, batch, None),
            "atlas": arm(cfg, batch, BASE),
            "atlas_forward": arm(cfg, batch, dataclasses.replace(BASE, grad_every=NEVER)),
            "atlas_grad": arm(cfg, batch, dataclasses.replace(BASE, grad_every=1))}
    cpu: dict = {}
    t = interleave({n: logged(n, run, cpu) for n, run in arms.items()}, reps, steps)
    cpu = {n: v[1:] for n, v in cpu.items()}                 # the rounds (the first call warms up)
    return {"reps": reps, "steps": steps, "step_s": {n: statistics.median(v) for n, v in t.items()},
            "over_cheap": {n: ratio(t, n, "cheap") for n in arms if n != "cheap"},
            "cpu_step_s": {n: statistics.median(v) for n, v in cpu.items()},
            "cpu_over_cheap": {n: ratio(cpu, n, "cheap") for n in arms if n != "cheap"}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--json", default=None)
    ap.add_argument("--parts", type=int, default=0, metavar="N",
                    help="also time the probe's two sides call by call against a step (N rounds, CPU time)")
    ap.add_argument("--after", type=int, default=0, metavar="N",
                    help="also time the training step right after a probe call against a plain one (N rounds)")
    ap.add_argument("--fine", type=int, default=0, metavar="N",
                    help="also atlas vs cheap interleaved step by step, N periods of grad_every steps (CPU time)")
    ap.add_argument("--probe-seqs", type=int, default=AtlasSettings.probe_seqs, help="the probe's WikiText windows")
    ap.add_argument("--rep-seqs", type=int, default=AtlasSettings.rep_seqs, help="its repeated random sequences")
    a = ap.parse_args(argv)
    global BASE
    BASE = AtlasSettings(probe_seqs=a.probe_seqs, rep_seqs=a.rep_seqs)
    cfg = load_config("atlas.toml", a.preset, [])
    d, m = cfg.data, cfg.model
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (d.batch_size, d.block_size), generator=g)
    batch = (x, torch.roll(x, -1, 1))
    try:
        import os
        load = os.getloadavg()
    except OSError:
        load = None
    out = {"hardware": hardware(), "load_avg_1_5_15": load, "preset": a.preset,
           "shape": f"L={m.n_layer} nh={m.n_head} C={m.n_embd} B={d.batch_size} T={d.block_size} V={VOCAB}",
           "probe": dataclasses.asdict(BASE)}
    if a.reps:                                          # --reps 0: the parts alone
        out.update(arms_ratios(cfg, batch, a.reps, a.steps))
    if a.parts:
        out["parts"] = parts(cfg, batch, a.parts)
    if a.fine:
        out["fine"] = fine(cfg, batch, a.fine)
    if a.after:
        out["after"] = after(cfg, batch, a.after)
    print(json.dumps(out, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
