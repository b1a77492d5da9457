"""The ICL-MC model: a two-layer attention-only transformer made of dyntool's attention modules.

As the authors' ``Attention_Only_Transformer`` (github.com/EzraEdelman/Evolution-of-Statistical-
Induction-Heads, ``mingpt/model_new.py``): a learned token embedding, then per layer
``x = x + c_proj(attention(LayerNorm(x)))`` with no MLP, a final LayerNorm and a linear read-out to
the k states; weights N(0, 0.02), the output projections N(0, 0.01).  Each layer's attention is a
:class:`dyntool.attention.CausalSelfAttention` (q, k, v from one linear map, no biases), so every
recorder, the app, ``figures`` and ``export`` read it like any dyntool model.

Differences (docs/icl_markov_differences.md): positions are *learned absolute* embeddings added to
the token embedding, instead of the authors' query-dependent relative term ``q_i · r_{i−j}`` added
to every layer's scores (a score term that depends on q would need its own gradient path in the
recorders); no dropout anywhere (the authors use 0.1 on the embedding, the attention probabilities
and the residual branch; recording refuses attention dropout, and the others would make the cheap
tier of a step differ from a deterministic recomputation).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..attention import CausalSelfAttention
from ..masks import causal


class ICLMarkovModel(nn.Module):
    def __init__(self, k: int, T: int, n_layer: int = 2, n_head: int = 1, n_embd: int = 16,
                 backend: str = "sdpa", init_std: float = 0.02, proj_std: float = 0.01):
        super().__init__()
        self.k, self.T = k, T
        self.wte = nn.Embedding(k, n_embd)
        self.wpe = nn.Embedding(T, n_embd)
        self.ln = nn.ModuleList(nn.LayerNorm(n_embd) for _ in range(n_layer))
        self.attn = nn.ModuleList(CausalSelfAttention(n_embd, n_head, causal(), backend) for _ in range(n_layer))
        for l, a in enumerate(self.attn):
            a.core.layer_index = l
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, k, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, proj_std if name.endswith("c_proj.weight") else init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """states (B, T) -> next-state logits (B, T, k)."""
        pos = torch.arange(x.shape[1], device=x.device)
        h = self.wte(x) + self.wpe(pos)                                  # (B, T, C)
        for ln, attn in zip(self.ln, self.attn):
            h = h + attn(ln(h))
        return self.lm_head(self.ln_f(h))

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups as the authors' minGPT: decay on the linear maps' weights only (not on
        embeddings or LayerNorms)."""
        decay = [p for n, p in self.named_parameters() if n.endswith("weight") and p.dim() == 2
                 and not n.startswith(("wte", "wpe"))]
        ids = {id(p) for p in decay}
        rest = [p for p in self.parameters() if id(p) not in ids]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]

    def cores(self):
        return [a.core for a in self.attn]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
