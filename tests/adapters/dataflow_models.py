"""Hand-written research modules for the dataflow adapter's tests: nanoGPT's manual attention path
(``masked_fill`` of the causal mask, in place or not; an optional key-padding mask; cross-attention
with T ≠ T_k), a MoE router softmax beside it, and checkpointed blocks."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from dyntool.capture import Capture

from . import dataflow_reference as R
from .reference import check, per_layer


class CausalSelfAttention(nn.Module):
    """nanoGPT's non-flash path, written the way research code writes it."""

    def __init__(self, d=16, n_head=2, T=8, dropout=0.0, inplace=False, cross=False, einsum=False, unseen=False):
        super().__init__()
        self.n_head, self.inplace, self.cross, self.einsum, self.unseen = n_head, inplace, cross, einsum, unseen
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(dropout)
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x, pad=None, memory=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        if self.cross:                               # keys and values from another sequence
            _, k, v = self.c_attn(memory).split(C, dim=2)
        Tk = k.shape[1]
        q, k, v = (t.view(B, t.shape[1], self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.einsum:                              # k laid out (B, Tk, H, d): labels, not positions
            att = torch.einsum("bhid,bjhd->bhij", q, k.transpose(1, 2)) * (1.0 / math.sqrt(k.size(-1)))
        elif self.unseen:                            # scores from no product (as a fused kernel would)
            att = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum(-1) * (1.0 / math.sqrt(k.size(-1)))
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if not self.cross:
            if self.inplace:
                att.masked_fill_(self.bias[:, :, :T, :T] == 0, float("-inf"))
            else:
                att = att.masked_fill(self.bias[:, :, :T, :Tk] == 0, float("-inf"))
        if pad is not None:        # (B, Tk) True = a real token; finfo.min keeps all-pad rows finite
            att = att.masked_fill(~pad[:, None, None, :], torch.finfo(att.dtype).min)
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = torch.einsum("bhij,bhjd->bhid", att, v) if self.einsum else att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class TopKRouter(nn.Module):
    """A MoE router: a last-dimension softmax that is not attention (never a site)."""

    def __init__(self, d=16, n_experts=4):
        super().__init__()
        self.gate = nn.Linear(d, n_experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(n_experts))

    def forward(self, x):
        p = F.softmax(self.gate(x), dim=-1)                       # (B, T, E)
        w, idx = p.topk(1, dim=-1)
        out = torch.stack([e(x) for e in self.experts], -2)      # (B, T, E, d)
        return (out.gather(-2, idx[..., None].expand(*idx.shape, x.shape[-1])) * w[..., None]).squeeze(-2)


class Block(nn.Module):
    def __init__(self, d=16, checkpointing=None, moe=False, **attn):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, **attn)
        self.mlp = TopKRouter(d) if moe else nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.checkpointing = checkpointing

    def _attn(self, x, pad, memory):
        return self.attn(self.ln1(x), pad, memory)

    def forward(self, x, pad=None, memory=None):
        if self.checkpointing is None:
            x = x + self._attn(x, pad, memory)
        else:
            x = x + checkpoint(self._attn, x, pad, memory, use_reentrant=self.checkpointing == "reentrant")
        return x + self.mlp(self.ln2(x))


class TinyNano(nn.Module):
    def __init__(self, n_layer=2, d=16, V=29, T=8, **block):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.blocks = nn.ModuleList(Block(d, T=T, **block) for _ in range(n_layer))
        self.head = nn.Linear(d, V)

    def forward(self, idx, pad=None, memory=None):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, pad, memory)
        return self.head(x)


def nano(target=30.0, seed=0, **kw):
    """A float64 TinyNano with its q/k rows of c_attn scaled so max |τ q·k| ≈ ``target``."""
    torch.manual_seed(seed)
    m = TinyNano(**kw).double()
    d = m.emb.embedding_dim
    with torch.no_grad():
        for b in m.blocks:
            b.attn.c_attn.weight[: 2 * d] *= 6.0
    return m


def batch(B=2, T=8, V=29, padding="right", seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (B, T), generator=g)
    pad = torch.ones(B, T, dtype=torch.bool)
    if B > 1 and padding == "right":
        pad[1, T - 3:] = False
    elif B > 1 and padding == "left":
        pad[1, :3] = False
    return x, pad


def nano_truth(m, x, pad, memory=None, tol=1e-8):
    """Record one step of a TinyNano with Capture and assert it equals the float64 autograd truth
    of the same step (``dataflow_reference.kept``); returns the Capture."""
    w = torch.randn(*x.shape, 29, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    loss = lambda: (m(x, pad, memory) * w).sum()             # noqa: E731
    with Capture(m) as cap:
        loss().backward()
    m.zero_grad()
    got = cap.compute()
    assert R.logit_max(got) >= 20
    qk = cap.attrs.get("qk_grads") != "unavailable"
    with R.kept({"CausalSelfAttention"}) as (calls, attach):
        attach(m)
        loss().backward()
    m.zero_grad()
    assert len(calls) == got["attn"].shape[0]
    for i, (_, events) in enumerate(calls):
        ref = R.truth(events, 2, qk)
        n_kv = ref.pop("n_kv")
        check(per_layer(got, i), ref, ref["attn"] > 0, n_kv, name=f"nano L{i}", tol=tol, qk=qk)
    return cap
