"""nanoGPT-style SDPA modules and TransformerLens: recorded quantities vs autograd (float64)."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dyntool.adapters import sdpa
from dyntool.capture import Capture, CaptureError

from .reference import check, per_layer


pytestmark = pytest.mark.usefixtures("float64_default")     # tests/conftest.py


class NanoAttention(nn.Module):
    """nanoGPT's CausalSelfAttention (flash path), plus a reference mode keeping every grad."""

    def __init__(self, C, nh, window=None):
        super().__init__()
        self.c_attn, self.c_proj, self.nh, self.window = nn.Linear(C, 3 * C), nn.Linear(C, C), nh, window
        self.ref = None

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        mask = None
        if self.window:
            i, j = torch.arange(T)[:, None], torch.arange(T)[None]
            mask = (j <= i) & (i - j < self.window)
        if self.ref is not None:                              # the independent reference path
            for t in (q, k, v):
                t.retain_grad()
            s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
            s = s.masked_fill(~(mask if mask is not None else torch.ones(T, T, dtype=torch.bool).tril()), -math.inf)
            s.retain_grad()
            a = torch.softmax(s, -1)
            a.retain_grad()
            y = a @ v
            y.retain_grad()
            self.ref.update(q=q, k=k, v=v, s=s, a=a, y=y)
        elif mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class WrappedAttention(NanoAttention):
    """The one-line wrap: dyntool.adapters.sdpa.attention instead of F.scaled_dot_product_attention."""

    def forward(self, x):
        if self.ref is not None:
            return super().forward(x)
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = sdpa.attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Nano(nn.Module):
    def __init__(self, attn_cls=NanoAttention, V=23, C=16, nh=4, L=2, window=None):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.blocks = nn.ModuleList(attn_cls(C, nh, window) for _ in range(L))
        self.head = nn.Linear(C, V)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for b in self.blocks:
            x = x + b(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def _ref_from_nano(model, x, y):
    for b in model.blocks:
        b.ref = {}
    model(x, y).backward()
    out = []
    for b in model.blocks:
        r = b.ref
        out.append(dict(attn=r["a"].detach(), attn_grad=r["a"].grad, scores_grad=r["s"].grad, y_grad=r["y"].grad,
                        q_grad=r["q"].grad, k_grad=r["k"].grad, v_grad=r["v"].grad,
                        allowed=torch.isfinite(r["s"].detach())))
        b.ref = None
    model.zero_grad()
    return out


@pytest.mark.parametrize("how", ["auto", "class-name", "wrap", "window"])
def test_nanogpt_sdpa_matches_autograd(how):
    torch.manual_seed(0)
    model = Nano(WrappedAttention if how == "wrap" else NanoAttention, window=3 if how == "window" else None)
    x, y = torch.randint(23, (3, 9)), torch.randint(23, (3, 9))
    kw = {"attention": "NanoAttention"} if how == "class-name" else {}
    with Capture(model, **kw) as cap:
        model(x, y).backward()
    got = cap.compute()
    assert cap.attrs["adapter"] == "sdpa"
    assert F.scaled_dot_product_attention is sdpa._REAL          # the swap is undone
    model.zero_grad()
    for l, r in enumerate(_ref_from_nano(model, x, y)):
        check(per_layer(got, l), r, r["allowed"], name=f"L{l}")


def test_unknown_class_name_is_a_clear_error():
    with pytest.raises(CaptureError, match="no module of class"):
        Capture(Nano(), attention="Nope")


def test_plain_module_without_attention_is_a_clear_error():
    with pytest.raises(CaptureError, match="no attention found"):
        Capture(nn.Linear(3, 3))


# ------------------------------------------------------------------------ TransformerLens
def _tl_model(**kw):
    tl = pytest.importorskip("transformer_lens", reason="transformer-lens not installed (pip install dyntool[tl])")
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        pytest.skip("transformer-lens 4.x has no HookedTransformer (dyntool[tl] pins <4)")
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=16, d_head=4, n_heads=4, d_vocab=23,
                                  act_fn="gelu", dtype=torch.float64, device="cpu", seed=0, **kw)
    del tl
    import warnings
    with warnings.catch_warnings():       # 3.x warns that HookedTransformer moves to TransformerBridge in 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        return HookedTransformer(cfg)


def _tl_reference(model, x):
    return _tl_reference_kw(model, x)


def _tl_reference_kw(model, x, **fw):
    """Autograd on the model's own tensors: the q, k that ``calculate_attention_scores`` receives
    (after RoPE, QK-norm, clip_qkv, log-n scaling), the v of ``calculate_z_scores``, the scores at
    ``hook_attn_scores`` (what the softmax sees: soft-cap, ALiBi and mask included), the pattern."""
    keep, handles = {}, []

    def retain(key, t):
        t.retain_grad()
        keep[key] = t
        return t

    for l, b in enumerate(model.blocks):
        a, cls = b.attn, type(b.attn)
        a.calculate_attention_scores = (lambda q, k, a=a, cls=cls, l=l:
                                        cls.calculate_attention_scores(a, retain((l, "q"), q), retain((l, "k"), k)))
        a.calculate_z_scores = (lambda v, p, a=a, cls=cls, l=l: cls.calculate_z_scores(a, retain((l, "v"), v), p))
        for name, hp in (("s", a.hook_attn_scores), ("a", a.hook_pattern), ("y", a.hook_z)):
            def fwd(mod, args, out, key=(l, name)):
                retain(key, out)
            handles.append(hp.register_forward_hook(fwd))
    try:
        model(x, return_type="loss", **fw).backward()
    finally:
        for h in handles:
            h.remove()
        for b in model.blocks:
            del b.attn.calculate_attention_scores, b.attn.calculate_z_scores
    out = []
    for l in range(len(model.blocks)):
        g = lambda n: keep[(l, n)].grad                            # noqa: E731
        tr = lambda t: t.transpose(1, 2)                           # noqa: E731  (B, T, h, d) → (B, h, T, d)
        out.append(dict(attn=keep[(l, "a")].detach(), attn_grad=g("a"), scores_grad=g("s"), y_grad=tr(g("y")),
                        q_grad=tr(g("q")), k_grad=tr(g("k")), v_grad=tr(g("v")),
                        allowed=torch.isfinite(keep[(l, "s")].detach())))
    model.zero_grad()
    return out


# Every TransformerLens 3.x option that changes the scores between q·k and the softmax (or the
# q, k, v they are made of).  (config, score modifiers dyntool must report, eval mode).
TL_VARIANTS = {
    "standard": ({}, []),
    "rotary-gqa": (dict(positional_embedding_type="rotary", n_key_value_heads=2), []),
    "rotary-partial-adjacent": (dict(positional_embedding_type="rotary", rotary_dim=2,
                                     rotary_adjacent_pairs=True), []),
    "local": (dict(use_local_attn=True, attn_types=["local", "global"], window_size=3), []),
    "bidirectional": (dict(attention_dir="bidirectional"), []),
    "alibi": (dict(positional_embedding_type="alibi"), ["bias"]),
    "softcap": (dict(attn_scores_soft_cap=5.0), ["softcap"]),
    "softcap-alibi": (dict(attn_scores_soft_cap=5.0, positional_embedding_type="alibi"), ["bias", "softcap"]),
    "sinks": (dict(use_attention_sinks=True), ["sinks"]),
    "sinks-gqa-softcap": (dict(use_attention_sinks=True, n_key_value_heads=2, attn_scores_soft_cap=5.0),
                          ["sinks", "softcap"]),
    # log-n query scaling acts in eval mode only, past train_seq_length
    "logn": (dict(positional_embedding_type="rotary", use_logn_attn=True, train_seq_length=4), []),
    "qk-norm": (dict(use_qk_norm=True), []),
    "qk-norm-rotary-gqa": (dict(use_qk_norm=True, positional_embedding_type="rotary", n_key_value_heads=2), []),
    "clip-qkv": (dict(clip_qkv=4.0), []),      # binds on the sharpened q, k (|logit| ≤ 2·4²)
    "attn-scale": (dict(attn_scale=1.7), []),
    "no-attn-scale": (dict(use_attn_scale=False), []),
    "inverse-layer-scale": (dict(scale_attn_by_inverse_layer_idx=True), []),
}


def _sharpen(model, factor=8.0):
    """Trained-size logits (max |τ q·k| ≥ 20): random init keeps them ≈ 1, where soft-capping and
    any score error are invisible (a 5.0 cap is ≈ 3e-7 off at init).  Scales what sets |q|, |k|:
    W_Q/W_K and, with QK-norm, the norm gains (a norm undoes a weight scale)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.split(".")[-1] in ("W_Q", "W_K", "_W_K") or ".q_norm." in n or ".k_norm." in n:
                p.mul_(factor)
            if n.endswith("attn.sinks"):       # sinks start at 0: give them trained-looking values
                p.copy_(torch.randn_like(p) * 3)


@pytest.mark.parametrize("variant", list(TL_VARIANTS))
def test_transformerlens_matches_autograd(variant):
    kw, mods = TL_VARIANTS[variant]
    n_kv = kw.get("n_key_value_heads")
    model = _tl_model(**kw)
    _sharpen(model)
    if variant == "logn":
        model.eval()
    x = torch.randint(23, (2, 8))
    with Capture(model) as cap:
        model(x, return_type="loss").backward()
    got = cap.compute()
    assert cap.attrs["adapter"] == "tlens"
    assert cap.attrs.get("score_modifiers", []) == mods
    assert float(got["logit_max"].max()) >= 20, float(got["logit_max"].max())
    model.zero_grad()
    for l, r in enumerate(_tl_reference(model, x)):
        check(per_layer(got, l), r, r["allowed"], n_kv, name=f"L{l}")
    if variant == "local":
        assert (got["attn"][0, :, :, 7, :5] == 0).all() and (got["attn"][1, :, :, 7, :5] > 0).all()
    if "sinks" in mods:
        assert float(got["sink_mass"].max()) > 0.1        # the sink really takes mass


def test_transformerlens_padding_mask_matches_autograd():
    """Left padding through ``attention_mask``: rows of pads see no key (α = 0, as TransformerLens)."""
    model = _tl_model(positional_embedding_type="alibi")
    _sharpen(model)
    x = torch.randint(23, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    with Capture(model) as cap:
        model(x, return_type="loss", attention_mask=mask).backward()
    got = cap.compute()
    model.zero_grad()
    for l, r in enumerate(_tl_reference_kw(model, x, attention_mask=mask)):
        check(per_layer(got, l), r, r["allowed"], None, name=f"L{l}")
    assert (got["attn"][:, :, 1, :3] == 0).all()


def test_transformerlens_refuses_a_score_edit_it_is_not_told_about():
    """A hook adding a per-key bias at hook_attn_scores changes the attention; dyntool computes
    the scores from the model's config and tensors, so the self-check refuses (one line)."""
    model = _tl_model()
    bias = torch.linspace(-2, 2, 8)
    h = model.blocks[1].attn.hook_attn_scores.register_forward_hook(lambda m, a, out: out + bias)
    try:
        with pytest.raises(CaptureError) as e:
            with Capture(model):
                model(torch.randint(23, (2, 8)), return_type="loss").backward()
    finally:
        h.remove()
    msg = str(e.value)
    assert "\n" not in msg and "layer 1" in msg and "does not reproduce" in msg
    assert not any(n in model.blocks[1].attn.__dict__ for n in ("calculate_attention_scores",
                                                               "calculate_z_scores"))  # unwrapped


def test_capture_is_public_api():
    import dyntool
    assert dyntool.Capture is Capture
