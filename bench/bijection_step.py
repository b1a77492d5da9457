"""The wind tunnel's training step, eager vs compiled (dyntool/sims/bijection_step.py, issue 46).

One process, one model size (a preset of dyntool/presets/bijection.toml), the two steps built from
the same initial weights; after each one's warm-up (the compiled one's compile is timed apart), they
run in interleaved blocks of ``--block`` steps, and the median per-step time of each is reported
with the ratio compiled / eager.  On a GPU the compiled step replays CUDA graphs; on the CPU it is
inductor's code without graphs.

    python bench/bijection_step.py [--preset cpu] [--device cpu|cuda] [--blocks 5] [--block 10] [--json F]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from common import hardware

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dyntool import config  # noqa: E402
from dyntool.sims.bijection import BijectionConfig, build_model  # noqa: E402
from dyntool.sims.bijection_step import Step  # noqa: E402
from dyntool.sims.bijection_task import task_loss, value_scores  # noqa: E402


def make(cfg, model, dev, compiled: bool):
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.param_groups(cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))

    def loss_of(mdl, x, y):
        return task_loss(value_scores(mdl, x, cfg.V, cfg.task.head), x, y, cfg.V, cfg.task)
    return Step(m, opt, cfg, loss_of, compiled=compiled), torch.Generator(device=dev).manual_seed(cfg.seed)


def block(step, gen, start: int, n: int, dev) -> float:
    """Seconds per step over ``n`` steps (the loss left on the device: no sync inside the block)."""
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(start, start + n):
        step(i, gen, check=False)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cfg = config.load(BijectionConfig, "bijection", a.preset, values={"device": a.device})
    dev = torch.device(a.device)
    if a.threads or cfg.threads:
        torch.set_num_threads(a.threads or cfg.threads)
    model = build_model(cfg).to(dev)
    eager, e_gen = make(cfg, model, dev, compiled=False)
    comp, c_gen = make(cfg, model, dev, compiled=True)
    t0 = time.perf_counter()
    block(comp, c_gen, 0, 3, dev)                      # compile (forward and backward) + the first replays
    compile_s = time.perf_counter() - t0
    block(eager, e_gen, 0, 3, dev)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    step = 3
    for _ in range(a.blocks):                          # interleaved: drift hits both alike
        times["eager"].append(block(eager, e_gen, step, a.block, dev))
        times["compiled"].append(block(comp, c_gen, step, a.block, dev))
        step += a.block
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"hardware": hardware(), "device": str(dev), "preset": a.preset, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "batch_size": cfg.batch_size,
           "model": f"{cfg.model.n_layer}x{cfg.model.n_head}x{cfg.model.n_embd}",
           "eager_s_per_step": med["eager"], "compiled_s_per_step": med["compiled"],
           "ratio_compiled_over_eager": med["compiled"] / med["eager"], "compile_s": compile_s,
           "blocks": a.blocks, "block": a.block, "command": " ".join(sys.argv)}
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
