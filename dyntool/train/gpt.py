"""A pre-LN GPT (nanoGPT-like) whose attention is chosen by config: mhsa | ls | span | qknorm.

Regularisation: ``model.dropout`` (nanoGPT's placement: the embedding sum, each block's attention
output and MLP output; never the attention probabilities, so recorded α are unaffected); active in
``.train()``, off in ``.eval()``.  ``model.vocab_multiple`` pads wte/lm_head to a multiple of it
(64 on GPU: the lm_head is the largest matmul and 33,278 is not a multiple of 8); the padded
logits are sliced off, so ``forward`` returns (B, T, vocab_size) and the loss is over the true vocab.

Every variant uses the core :class:`dyntool.attention.CausalSelfAttention` (so recording works the
same way for all) and differs only in the mask, the q/k normalisation, or the backward:

- ``mhsa``: causal multi-head attention (SDPA ``is_causal``: the flash kernel on CUDA).
- ``ls``: LS-attention (arXiv 2505.15548): heads ``[0, n_local)`` see a causal sliding window of
  ``window`` keys *including themselves* (query i sees keys i-window+1 .. i, the author's 2025 code
  convention, flash-attn ``window_size=(window-1, 0)``), heads ``[n_local, n_head)`` are global
  causal.  Only the mask differs from mhsa, so the parameter count is identical.  ``n_global = 0``
  is pure sliding-window attention (the ablation).  flex_attention on CUDA, boolean-mask SDPA on CPU.
- ``span``: forward bitwise unchanged, backward from :func:`dyntool.span.span_attention` (a
  reconstruction of arXiv 2512.13033, see dyntool/span.py).
- ``qknorm``: LayerNorm on q and k per head (the LS paper's stabilisation baseline).

``track_qk(True)`` attaches a forward-only observer (:class:`dyntool.observe.KeepQK`) to every
attention core, so each block keeps a detached reference to its last q, k (no copy) and a callback
can compute per-step logit statistics through the same seam as recording.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import masks
from ..attention import CausalSelfAttention
from ..errors import ConfigError
from ..observe import KeepQK
from ..span import SpanConfig, span_attention
from .config import ModelConfig


def resolve_backend(cfg: ModelConfig, device_type: str) -> str:
    """``auto`` → flex for LS heads on CUDA (block-sparse, O(T·window)), sdpa otherwise."""
    if cfg.backend != "auto":
        return cfg.backend
    if cfg.attention == "ls" and device_type == "cuda" and cfg.n_local > 0:
        return "flex"
    return "sdpa"


def build_mask(cfg: ModelConfig) -> masks.Mask:
    if cfg.attention == "ls":
        return masks.local_global(cfg.n_local, cfg.n_global, cfg.window)
    return masks.causal()


class MLP(nn.Module):
    def __init__(self, n_embd: int, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, mask: masks.Mask, backend: str):
        super().__init__()
        self.attn_dropout = nn.Dropout(cfg.dropout)     # on the attention output (after c_proj)
        self.mlp_dropout = nn.Dropout(cfg.dropout)      # on the MLP output
        qk_norm = cfg.qk_norm or cfg.attention == "qknorm"
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg.n_embd, cfg.n_head, mask, backend, cfg.bias, qk_norm)
        self.attn.core.layer_index = layer
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg.n_embd, cfg.bias)
        # q, k for per-step logit statistics come through the attention's observer seam
        # (dyntool.observe.KeepQK, attached by GPT.track_qk): a detached reference, no copy
        self._keep: KeepQK | None = None

    def last_qk(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The last forward's per-head ``(q, k)``, each (B, nh, T, hs), or None."""
        return None if self._keep is None else self._keep.last()

    def clear_qk(self) -> None:
        if self._keep is not None:
            self._keep.clear()

    def forward(self, x):
        x = x + self.attn_dropout(self.attn(self.ln_1(x)))
        return x + self.mlp_dropout(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int, block_size: int,
                 span: SpanConfig | None = None, device_type: str = "cpu"):
        super().__init__()
        self.cfg, self.vocab_size, self.block_size = cfg, vocab_size, block_size
        self.backend = resolve_backend(cfg, device_type)
        if self.backend == "flex" and device_type != "cuda":
            raise ConfigError("model.backend", "flex needs CUDA (flex_attention has no CPU backward); "
                                               "use auto or sdpa")
        mask = build_mask(cfg)
        m = cfg.vocab_multiple
        self.padded_vocab = -(-vocab_size // m) * m           # rows >= vocab_size: never indexed
        self.wte = nn.Embedding(self.padded_vocab, cfg.n_embd)
        self.wpe = nn.Embedding(block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg, i, mask, self.backend) for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.lm_head = nn.Linear(cfg.n_embd, self.padded_vocab, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():   # GPT-2: residual projections scaled by 1/sqrt(2L)
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, cfg.init_std / math.sqrt(2 * cfg.n_layer))
        if cfg.attention == "span":
            self.set_span(span or SpanConfig())

    def _init_weights(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, self.cfg.init_std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    def set_span(self, span: SpanConfig) -> None:
        """Route every core through the span-recon backward (forward stays plain SDPA)."""
        scfg, impl = span, span.impl

        def attend(q, k, v, mask_args, scale):
            return span_attention(q, k, v, scfg, scale=scale, impl=impl, **mask_args)
        for blk in self.h:
            blk.attn.core.attend_fn = attend

    def track_qk(self, on: bool = True) -> None:
        for blk in self.h:
            core = blk.attn.core
            if on and blk._keep is None:
                blk._keep = KeepQK()
                core.attach(blk._keep)
            elif not on and blk._keep is not None:
                core.detach(blk._keep)
                blk._keep = None

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())      # tied weights once, vocab padding included
        if non_embedding:
            n -= self.wpe.weight.numel() + self.wte.weight.numel()
        return n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx (B, T) → logits (B, T, V) and the mean cross-entropy when ``targets`` is given."""
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence of length {T} > block_size {self.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))        # (B, T, C)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))                 # (B, T, V_padded)
        if self.padded_vocab != self.vocab_size:
            logits = logits[..., :self.vocab_size]          # (B, T, V): padding never predicted
        loss = None
        if targets is not None:
            lg = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
            loss = F.cross_entropy(lg.reshape(-1, lg.size(-1)), targets.reshape(-1))
        return logits, loss

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: decay 2-D weights (matmuls, embeddings), not biases or LayerNorms."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    def grad_groups(self) -> dict[str, list[torch.Tensor]]:
        """Parameter groups for per-group gradient norms: emb, L{l}.attn, L{l}.mlp, L{l}.ln, ln_f."""
        groups: dict[str, list] = {"emb": [self.wte.weight, self.wpe.weight]}
        for i, blk in enumerate(self.h):
            groups[f"L{i}.attn"] = list(blk.attn.parameters())
            groups[f"L{i}.mlp"] = list(blk.mlp.parameters())
            groups[f"L{i}.ln"] = list(blk.ln_1.parameters()) + list(blk.ln_2.parameters())
        groups["ln_f"] = list(self.ln_f.parameters())
        if not self.cfg.tie_weights:
            groups["lm_head"] = [self.lm_head.weight]
        return groups


@torch.no_grad()
def group_grad_norms(groups: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """L2 norm of the gradients of each parameter group, as 0-d tensors (no host sync).

    One ``torch._foreach_norm`` over every gradient (a fused multi-tensor kernel on CUDA, not a
    kernel per parameter), then per-group sums of squares.  Groups without gradients are left out."""
    names, grads, owner = [], [], []
    for name, ps in groups.items():
        gs = [p.grad for p in ps if p.grad is not None]
        if gs:
            owner += [len(names)] * len(gs)
            names.append(name)
            grads += gs
    if not grads:
        return {}
    return reduce_group_norms(names, owner, torch.stack(torch._foreach_norm(grads)))   # (n_params,)


def group_norms_of(groups: dict[str, list[torch.Tensor]], params: list, norms: torch.Tensor
                   ) -> dict[str, torch.Tensor]:
    """Per-group L2 norms from the per-parameter ``norms`` of ``params`` (each once, e.g. the norms
    clipping computed), without a second norm pass.  Groups without a parameter are left out."""
    owner = {id(p): g for g, ps in groups.items() for p in ps}
    names = list(dict.fromkeys(owner[id(p)] for p in params))
    pos = {g: i for i, g in enumerate(names)}
    return reduce_group_norms(names, [pos[owner[id(p)]] for p in params], norms)


def reduce_group_norms(names: list[str], owner: list[int], norms: torch.Tensor) -> dict[str, torch.Tensor]:
    """``names[g]`` -> √(Σ norms² over the parameters whose ``owner`` is g), on the device."""
    n = norms.float()
    idx = _owner_index(tuple(owner), n.device)
    sq = torch.zeros(len(names), device=n.device).index_add_(0, idx, n * n)
    return dict(zip(names, sq.sqrt().unbind()))


@functools.lru_cache(maxsize=16)
def _owner_index(owner: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The parameter → group index on the device, made once: a host list copied to a GPU on every
    step is a blocking copy, i.e. a host sync per step."""
    return torch.tensor(owner, device=device)
