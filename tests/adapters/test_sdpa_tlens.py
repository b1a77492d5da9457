"""nanoGPT-style SDPA modules and TransformerLens: recorded quantities vs autograd (float64)."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dyntool.adapters import sdpa
from dyntool.capture import Capture, CaptureError

from .reference import check, per_layer


@pytest.fixture(autouse=True)
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


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
    keep, handles = {}, []
    for l, b in enumerate(model.blocks):
        a = b.attn
        rot = model.cfg.positional_embedding_type == "rotary"
        for name, hp in (("q", a.hook_rot_q if rot else a.hook_q), ("k", a.hook_rot_k if rot else a.hook_k),
                         ("v", a.hook_v), ("s", a.hook_attn_scores), ("a", a.hook_pattern), ("y", a.hook_z)):
            def fwd(mod, args, out, key=(l, name)):
                out.retain_grad()
                keep[key] = out
            handles.append(hp.register_forward_hook(fwd))
    try:
        model(x, return_type="loss").backward()
    finally:
        for h in handles:
            h.remove()
    out = []
    for l in range(len(model.blocks)):
        g = lambda n: keep[(l, n)].grad                            # noqa: E731
        tr = lambda t: t.transpose(1, 2)                           # noqa: E731  (B, T, h, d) → (B, h, T, d)
        out.append(dict(attn=keep[(l, "a")].detach(), attn_grad=g("a"), scores_grad=g("s"), y_grad=tr(g("y")),
                        q_grad=tr(g("q")), k_grad=tr(g("k")), v_grad=tr(g("v")),
                        allowed=torch.isfinite(keep[(l, "s")].detach())))
    model.zero_grad()
    return out


@pytest.mark.parametrize("variant", ["standard", "rotary-gqa", "local"])
def test_transformerlens_matches_autograd(variant):
    kw = {}
    if variant == "rotary-gqa":
        kw = dict(positional_embedding_type="rotary", n_key_value_heads=2)
    elif variant == "local":
        kw = dict(use_local_attn=True, attn_types=["local", "global"], window_size=3)
    model = _tl_model(**kw)
    x = torch.randint(23, (2, 8))
    with Capture(model) as cap:
        model(x, return_type="loss").backward()
    got = cap.compute()
    assert cap.attrs["adapter"] == "tlens"
    model.zero_grad()
    n_kv = 2 if variant == "rotary-gqa" else None
    for l, r in enumerate(_tl_reference(model, x)):
        check(per_layer(got, l), r, r["allowed"], n_kv, name=f"L{l}")
    if variant == "local":
        assert (got["attn"][0, :, :, 7, :5] == 0).all() and (got["attn"][1, :, :, 7, :5] > 0).all()


def test_capture_is_public_api():
    import dyntool
    assert dyntool.Capture is Capture
