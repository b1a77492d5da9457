"""A 2-rank DDP training of a tiny BLOOM (eager: the dataflow adapter) with RunRecorder's probe;
run by test_dataflow_ddp.py under torchrun (gloo, CPU).  OUT: the runs folder."""
import os

import torch
import torch.distributed as dist
import transformers

from dyntool.integrations import RunRecorder

dist.init_process_group("gloo")
torch.manual_seed(0)
cfg = transformers.BloomConfig(vocab_size=61, hidden_size=16, n_layer=2, n_head=2)
cfg._attn_implementation = "eager"
model = transformers.AutoModelForCausalLM.from_config(cfg).eval()          # eval: no dropout
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-2)
probe = torch.arange(8).view(1, 8) % 61
g = torch.Generator().manual_seed(1 + dist.get_rank())
with RunRecorder(model, os.environ["OUT"], max_steps=3, every=1, name="ddp",
                 probe={"input_ids": probe, "labels": probe}) as rec:
    for step in range(3):
        rec.probe_step(step)
        x = torch.randint(3, 61, (2, 8), generator=g)
        loss = ddp(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.log(step, loss=loss.item())
dist.destroy_process_group()
