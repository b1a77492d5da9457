"""Adapter benchmarks (issue 11): a tiny Hugging Face GPT-2 trained on CPU, ratios in one process.

1. Recording every 50 steps (probe batch, RunRecorder, full float16 record to a temporary run)
   vs recording off: blocks of 50 steps, each "on" block holding exactly one recorded step,
   interleaved with "off" blocks; ratio of the medians over rounds (target ≤ 1.05×).
2. A non-recording step with dyntool attached (RunRecorder.probe_step and train_step called,
   nothing scheduled) vs a plain step: steps interleaved one by one; ratio of medians
   (target ≤ 1.01×).

    python bench/bench_adapters.py [--quick] [--data DIR]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch

from common import hardware

from dyntool.data.wikitext import fixed_batch, get_batch, load_wikitext
from dyntool.integrations import RunRecorder


def make(vocab, T, seed=0):
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=T, n_embd=64, n_layer=2, n_head=4,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, opt, x):
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data", default=None, help="WikiText-2 folder (default: ../shared/data/wikitext-2)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096,
                    help="keep the V-1 most frequent words, the rest share one id (CPU step cost)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rounds, block, singles = (2, 50, 60) if a.quick else (4, 50, 200)
    corpus = load_wikitext(a.data)
    T, B = 64, 16
    rank = np.empty(corpus.vocab_size, dtype=np.int64)          # id -> frequency rank, capped
    rank[np.argsort(-np.bincount(corpus.train, minlength=corpus.vocab_size), kind="stable")] = \
        np.arange(corpus.vocab_size)
    V = min(a.vocab, corpus.vocab_size)
    train, valid = (np.minimum(rank[s], V - 1) for s in (corpus.train, corpus.valid))
    gen = torch.Generator().manual_seed(0)
    batches = [get_batch(train, B, T, gen)[0] for _ in range(64)]
    probe, _ = fixed_batch(valid, 1, T)
    probe = {"input_ids": probe, "labels": probe}
    off_model, off_opt = make(V, T)
    on_model, on_opt = make(V, T)
    tmp = tempfile.mkdtemp(prefix="bench_adapters_")
    n_total = 2 * rounds * block
    rec = RunRecorder(on_model, tmp, max_steps=n_total, every=block, probe=probe)
    for _ in range(3):                                  # warm-up both
        step(off_model, off_opt, batches[0])
        step(on_model, on_opt, batches[0])

    # 1. recording every 50 steps vs off, blocks interleaved (order alternates per round)
    t_on, t_off, s_on, t_rec, t_step = [], [], 0, [], []
    for r in range(rounds):
        for which in (("off", "on") if r % 2 == 0 else ("on", "off")):
            t0 = time.perf_counter()
            for i in range(block):
                x = batches[i % len(batches)]
                if which == "on":
                    tp = time.perf_counter()
                    if rec.probe_step(s_on):            # recorded when s_on % block == 0
                        t_rec.append(time.perf_counter() - tp)
                    ts = time.perf_counter()
                    step(on_model, on_opt, x)
                    t_step.append(time.perf_counter() - ts)
                    rec.log(s_on, loss=0.0)
                    s_on += 1
                else:
                    step(off_model, off_opt, x)
            (t_on if which == "on" else t_off).append(time.perf_counter() - t0)
            print(f"  round {r} {which}: {t_on[-1] if which == 'on' else t_off[-1]:.2f}s", flush=True)
    n_rec = rec.rec.n_recorded if rec.rec else 0

    # 2. non-recording step with dyntool attached vs plain, interleaved step by step
    attached, plain, t_hooks = [], [], []
    quiet = RunRecorder(on_model, tmp, max_steps=10**9, every=0, steps=[10**9 - 1], probe=probe)
    for i in range(singles):
        x = batches[i % len(batches)]
        for which in (("plain", "att") if i % 2 == 0 else ("att", "plain")):
            t0 = time.perf_counter()
            if which == "att":
                quiet.probe_step(i)
                with quiet.train_step(i):
                    t1 = time.perf_counter()
                    step(on_model, on_opt, x)
                    t2 = time.perf_counter()
                attached.append(time.perf_counter() - t0)
                t_hooks.append(attached[-1] - (t2 - t1))      # dyntool's own share of the step
            else:
                step(off_model, off_opt, x)
                plain.append(time.perf_counter() - t0)
    rec.close()
    quiet.close()
    r1 = statistics.median(t_on) / statistics.median(t_off)
    r2 = statistics.median(attached) / statistics.median(plain)
    print(f"hardware: {hardware()}  threads={a.threads}")
    print(f"HF GPT-2 tiny (2 layers, 4 heads, d=64, T={T}, B={B}, vocab {V} most frequent WikiText-2 words), CPU")
    print(f"1. recording every {block} steps vs off: {r1:.3f}x  ({n_rec} recorded steps; median block "
          f"{statistics.median(t_on):.2f}s vs {statistics.median(t_off):.2f}s over {rounds} rounds)  target <= 1.05x")
    print(f"2. non-recording step, dyntool attached vs plain: {r2:.4f}x  (median {1e3 * statistics.median(attached):.1f}"
          f" ms vs {1e3 * statistics.median(plain):.1f} ms over {singles} steps)  target <= 1.01x")
    # the same two costs measured directly (robust to the machine's load, which moves whole blocks)
    est = 1 + statistics.median(t_rec) / (block * statistics.median(t_step))
    print(f"   direct: one recorded probe step {1e3 * statistics.median(t_rec):.0f} ms vs a training step "
          f"{1e3 * statistics.median(t_step):.0f} ms -> every {block} steps costs {est:.3f}x")
    print(f"   direct: dyntool's calls on a non-recording step {1e6 * statistics.median(t_hooks):.1f} us = "
          f"{1 + statistics.median(t_hooks) / statistics.median(plain):.5f}x of a plain step")


if __name__ == "__main__":
    main()
