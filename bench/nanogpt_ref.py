"""Reference for bench_train.py: a minimal plain nanoGPT-style model, no recording machinery.

Written from nanoGPT's model.py shape (not copied): token + learned position embeddings, pre-LN
blocks of causal self-attention (one fused c_attn, ``F.scaled_dot_product_attention(is_causal=True)``)
and a GELU MLP, final LayerNorm, tied lm_head, N(0, 0.02) init with residual projections scaled by
1/sqrt(2L).  Same dimensions and parameter count as ``dyntool.train.gpt.GPT`` with mhsa, so the
step-time ratio measures only the cost of our abstractions (attention core, hooks, mask objects).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RefAttention(nn.Module):
    def __init__(self, n_embd, n_head, bias=False):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)   # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class RefBlock(nn.Module):
    def __init__(self, n_embd, n_head, bias=False, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = RefAttention(n_embd, n_head, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class RefGPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, bias=False, dropout=0.0,
                 vocab_multiple=1):
        super().__init__()
        self.vocab_size = vocab_size
        padded = -(-vocab_size // vocab_multiple) * vocab_multiple       # nanoGPT pads to 50304
        self.drop = nn.Dropout(dropout)
        self.wte = nn.Embedding(padded, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(RefBlock(n_embd, n_head, bias, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, padded, bias=False)
        self.lm_head.weight = self.wte.weight                               # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))   # (B, T, C)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))[..., :self.vocab_size]         # (B, T, V)
        loss = None if targets is None else F.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                            targets.reshape(-1))
        return logits, loss


def get_batch(data, batch_size: int, block_size: int, device, generator=None):
    """nanoGPT ``train.py``'s loader: random windows of the token array, pinned and copied without
    blocking on CUDA.  The bench draws the next batch right after the forward, as nanoGPT does, so
    the reference never reuses one tensor and pays for its data like the trainer."""
    import numpy as np
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([torch.from_numpy(np.asarray(data[i:i + block_size], dtype=np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(np.asarray(data[i + 1:i + 1 + block_size], dtype=np.int64)) for i in ix])
    if torch.device(device).type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)
