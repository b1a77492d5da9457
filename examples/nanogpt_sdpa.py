"""A nanoGPT-style model whose attention calls F.scaled_dot_product_attention: dyntool finds it
by class name (or automatically), records the *training* batch every 50 steps.  Env: STEPS, DATA, OUT."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from dyntool.data.wikitext import get_batch, load_wikitext
from dyntool.integrations import RunRecorder


class CausalSelfAttention(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.c_attn, self.c_proj, self.nh = nn.Linear(C, 3 * C), nn.Linear(C, C), nh

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, C, nh):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), CausalSelfAttention(C, nh), nn.LayerNorm(C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, V, T, C=64, nh=4, L=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, nh) for _ in range(L))
        self.ln_f, self.lm_head = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


steps, T = int(os.environ.get("STEPS", 200)), 64
corpus = load_wikitext(os.environ.get("DATA") or None)   # default: ../shared/data/wikitext-2
torch.manual_seed(0)
model = GPT(corpus.vocab_size, T)
opt, gen = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.Generator().manual_seed(0)
with RunRecorder(model, os.environ.get("OUT", "runs"), max_steps=steps, every=50, batch="train",
                 attention="CausalSelfAttention") as rec:
    for step in range(steps):
        x, y = get_batch(corpus.train, 16, T, gen)
        with rec.train_step(step):                     # a Capture around this step on recorded steps
            _, loss = model(x, y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        rec.log(step, loss=loss.item())
print(rec.path)
