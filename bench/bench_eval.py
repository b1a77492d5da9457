"""Final-evaluation benchmark: the trainer's evaluation vs the previous implementation, one process.

    python bench/bench_eval.py [--config wikitext_mhsa] [--preset small] [--split valid]
                               [--max-tokens N] [--reps 3] [--json FILE]

Old (reference, reproduced here verbatim in behaviour): ``torch.no_grad``, model left in train
mode, ``data.eval_batch_size`` sequences per batch, one ``loss.item()`` host sync per batch.
New: :meth:`Trainer.evaluate` as the final evaluation calls it (eval mode, ``inference_mode``,
``Trainer.final_eval_batch()`` sequences per batch, one sync at the end).  Both on the same
freshly initialised small-preset model over the same windows (the first ``--max-tokens`` target
tokens of the split; 0 = the whole split).  Rounds alternate old/new; reported: median times and
the median of the per-round ratios new/old (paired, so a shared machine's drift cancels), and
that both give the same loss (to float32 summation-order noise).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import hardware                                    # noqa: E402
from dyntool.data.wikitext import eval_batches, load_wikitext  # noqa: E402
from dyntool.train.ddp import DistInfo                         # noqa: E402
from dyntool.train.gpt import GPT                              # noqa: E402
from dyntool.train.runner import load_config                   # noqa: E402
from dyntool.train.trainer import Trainer                      # noqa: E402


@torch.no_grad()
def old_evaluate(model, data, batch_size, block_size) -> float:
    total, n = 0.0, 0
    for x, y in eval_batches(data, batch_size, block_size, None, "cpu"):
        _, loss = model(x, y)
        total += loss.item() * y.numel()
        n += y.numel()
    return total / max(n, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="wikitext_mhsa")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--split", default="valid")
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cfg = load_config(a.config, a.preset, [])
    corpus = load_wikitext(cfg.data.path or None)
    torch.manual_seed(0)
    model = GPT(cfg.model, corpus.vocab_size, cfg.data.block_size)
    tr = Trainer(cfg, model, corpus, DistInfo())
    data = corpus.split(a.split)
    if a.max_tokens:
        data = data[:a.max_tokens + 1]
        setattr(corpus, a.split, data)
    old_t, new_t, ratios = [], [], []
    for r in range(a.reps):
        model.train()
        t0 = time.perf_counter()
        lo = old_evaluate(model, data, cfg.data.eval_batch_size, cfg.data.block_size)
        t1 = time.perf_counter()
        ln = tr.evaluate(a.split, batch_size=tr.final_eval_batch())
        t2 = time.perf_counter()
        old_t.append(t1 - t0)
        new_t.append(t2 - t1)
        ratios.append((t2 - t1) / (t1 - t0))
        print(f"round {r}: old {t1 - t0:.2f}s  new {t2 - t1:.2f}s  loss old {lo:.6f} new {ln:.6f}", flush=True)
    res = {"hardware": hardware(), "preset": a.preset, "split": a.split, "tokens": len(data) - 1,
           "old_batch": cfg.data.eval_batch_size, "new_batch": tr.final_eval_batch(),
           "old_s": statistics.median(old_t), "new_s": statistics.median(new_t),
           "ratio_new_over_old": statistics.median(ratios), "loss_old": lo, "loss_new": ln}
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
