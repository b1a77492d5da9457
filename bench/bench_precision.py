"""Precision and bytes of one recorded step: gradient quantities stored in float16 vs float32.

The HF Trainer example's model (tiny Llama, GQA, 2 × 4 heads, T = 32, WikiText-2 vocabulary) is
trained for STEPS plain steps (so gradients have a trained model's size, not init's), then its probe
sequence is recorded once with ``record.grad_dtype = float16`` and once with ``float32`` (the
default).  Prints bytes on disk per recorded step and, for ∂L/∂S over entries with α > 0: the
median |∂L/∂S|, the share below float16's normal range (6.1e-5), the share stored as exactly 0,
and the worst relative error of entries ≥ 1e-3 × their row's max.

    python bench/bench_precision.py [--steps 200]
"""
from __future__ import annotations

import argparse
import platform
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
import zarr

from dyntool.capture import Capture
from dyntool.data.wikitext import fixed_batch, get_batch, load_wikitext
from dyntool.integrations import RunRecorder


def du(path: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    corpus, T = load_wikitext(), 32
    cfg = transformers.LlamaConfig(vocab_size=corpus.vocab_size, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=T, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    opt, gen = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        x, _ = get_batch(corpus.train, 8, T, gen)
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    probe, _ = fixed_batch(corpus.valid, 1, T)
    batch = {"input_ids": probe, "labels": probe}
    model.eval()
    with Capture(model) as cap:
        model(**batch).loss.backward()
    model.zero_grad()
    exact = cap.compute(torch.float64)
    ds, live = exact["score_grad"].numpy(), exact["attn"].numpy() > 0
    mag = np.abs(ds[live])
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {args.steps} training steps")
    print(f"median |dL/dS| over alpha > 0: {np.median(mag):.3g}; below float16 normal (6.1e-5): "
          f"{100 * (mag < 6.1e-5).mean():.1f} %")
    for grad_dtype in ("float16", "float32"):
        with tempfile.TemporaryDirectory() as d:
            with RunRecorder(model, d, max_steps=1, every=1, probe=batch, grad_dtype=grad_dtype) as rec:
                rec.probe_step(0)
            store = rec.path / "record.zarr"
            got = np.asarray(zarr.open_group(str(store), mode="r")["score_grad"][0], dtype=np.float64)
            zero = (live & (ds != 0) & (got == 0)).sum() / max((live & (ds != 0)).sum(), 1)
            row_max = np.abs(ds).max(-1, keepdims=True)
            big = (np.abs(ds) >= 1e-3 * row_max) & (ds != 0)
            rel = (np.abs(got - ds)[big] / np.abs(ds)[big]).max()
            print(f"grad_dtype={grad_dtype}: {du(store) / 1e3:.1f} kB per recorded step on disk; "
                  f"nonzero dS stored as 0: {100 * zero:.1f} %; worst relative error (>= 1e-3 x row max): {rel:.2g}")


if __name__ == "__main__":
    main()
