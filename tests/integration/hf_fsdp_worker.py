"""One ``transformers.Trainer`` run with :class:`HFRecorderCallback` on a tiny GPT-2, for
``test_hf_fsdp.py``: ``python hf_fsdp_worker.py MODEL_DIR OUT NAME single|fsdp [SEQS]``.

``single``: one process, 4 sequences per step.  ``fsdp`` (under torchrun, 2 ranks, gloo on CPU):
the model sharded at load time (``DistributedConfig(fsdp_size=world)``), 2 sequences per rank,
so every step sees the same global batch; the probe's 2 sequences are split over the ranks.
"""
from __future__ import annotations

import os
import sys

import torch

WORLD = int(os.environ.get("WORLD_SIZE", "1"))
STEPS, EVERY, V, T = 6, 2, 50, 8


def save_model(path: str) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=16, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2LMHeadModel(cfg).save_pretrained(path)


def main(model_dir: str, out: str, name: str, mode: str, seqs: int = 2) -> None:
    from transformers import GPT2LMHeadModel, Trainer, TrainingArguments
    from dyntool.integrations.hf import HFRecorderCallback
    kw = {"attn_implementation": "eager", "dtype": torch.float32}
    if mode == "fsdp":
        from transformers.distributed import DistributedConfig
        kw["distributed_config"] = DistributedConfig(fsdp_size=WORLD)
    model = GPT2LMHeadModel.from_pretrained(model_dir, **kw)
    ids = torch.randint(0, V, (4 * STEPS, T), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": r, "labels": r} for r in ids]
    probe = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(2))
    cb = HFRecorderCallback(out, probe={"input_ids": probe, "labels": probe}, every=EVERY, seqs=seqs,
                            name=name, dtype="float32")
    args = TrainingArguments(output_dir=os.path.join(out, f".trainer-{name}"), max_steps=STEPS,
                             per_device_train_batch_size=4 // WORLD, learning_rate=1e-3, use_cpu=True,
                             report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
                             train_sampling_strategy="sequential", seed=0)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    if mode == "fsdp":
        kinds = {type(p).__name__ for p in model.parameters()}
        assert kinds == {"DTensor"}, kinds                   # really sharded
        # join gloo's worker threads while Python is alive: one freeing a tensor at exit aborts the rank
        torch.distributed.destroy_process_group()
    print("worker done", os.environ.get("RANK", "0"), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save_model(sys.argv[2])
    else:
        main(*sys.argv[1:5], *map(int, sys.argv[5:6]))
