"""The fused kernel's test cases (shared by tests/kernels under the interpreter and tests/gpu),
without importing the kernels: tests/gpu is collected before tests/kernels sets TRITON_INTERPRET."""
from __future__ import annotations

import torch

CASES = {
    # name: shape (B, H, Hk, T, Tk, D) and options
    "causal": dict(shape=(2, 2, 2, 20, 20, 32)),
    "noncausal_cross_d80": dict(shape=(2, 2, 2, 12, 27, 80), causal=False),
    "right_pad_lengths_d96": dict(shape=(2, 2, 2, 19, 19, 96), key_lengths=[19, 11]),
    "left_pad_lengths_gqa": dict(shape=(2, 4, 2, 18, 18, 64), key_lengths=[18, 7], padding_side="left"),
    "key_mask_mqa_noncausal": dict(shape=(2, 3, 1, 17, 21, 32), causal=False, key_mask="holes"),
    "left_pad_key_mask_causal": dict(shape=(2, 2, 1, 18, 18, 32), key_mask="left"),
    "window": dict(shape=(2, 2, 2, 33, 33, 32), window=5),
    "window_per_head_ls": dict(shape=(1, 4, 2, 35, 35, 32), window=[4, 0, 19, 0]),
    "softcap": dict(shape=(2, 2, 2, 20, 20, 32), softcap=15.0),
    "alibi": dict(shape=(2, 2, 2, 20, 20, 32), alibi=True),
    "sinks_left_pad": dict(shape=(2, 2, 2, 18, 18, 32), sinks=True, key_lengths=[18, 9], padding_side="left"),
    "d128_exact_blocks": dict(shape=(1, 2, 2, 16, 32, 128), causal=False),
    "everything": dict(shape=(2, 4, 2, 33, 33, 48), window=9, softcap=25.0, alibi=True, sinks=True,
                       key_lengths=[33, 20]),
}


def make(case, seed=0, dtype=torch.float32):
    B, H, Hk, T, Tk, D = case["shape"]
    g = torch.Generator().manual_seed(seed)
    gain = 1.8 * D ** 0.25        # trained-size logits: |τ q·k| reaches 20+
    q = (torch.randn(B, H, T, D, generator=g) * gain).to(dtype)
    k = (torch.randn(B, Hk, Tk, D, generator=g) * gain).to(dtype)
    v = torch.randn(B, Hk, Tk, D, generator=g).to(dtype)
    do = torch.randn(B, H, T, D, generator=g).to(dtype)
    key_mask = None
    if case.get("key_mask") == "holes":
        key_mask = torch.rand(B, Tk, generator=g) > 0.3
        key_mask[1] = False                       # a sequence whose every row is empty
        key_mask[1, 3:9] = True
    elif case.get("key_mask") == "left":          # left padding as Hugging Face's 2-D mask
        key_mask = torch.ones(B, Tk, dtype=torch.bool)
        key_mask[1, :6] = False
    kw = dict(causal=case.get("causal", True), window=case.get("window"), softcap=case.get("softcap"),
              key_lengths=case.get("key_lengths"), padding_side=case.get("padding_side", "right"),
              key_mask=key_mask)
    slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1) / H) if case.get("alibi") else None
    sinks = torch.randn(H, generator=g) * 2 if case.get("sinks") else None
    return q, k, v, do, kw, slopes, sinks
