"""The float64 autograd truth for models that compute their own softmax (the dataflow adapter's
tests and the family rows of docs/recording.md's table).

Independent of the adapter: no TorchFunctionMode, no graph walk.  While one of the named attention
classes runs, ``torch.nn.functional.softmax``, ``torch.matmul``, ``torch.bmm``, ``Tensor.baddbmm``
and ``Tensor.__matmul__`` are swapped (module attributes) for versions that keep their tensors
with ``retain_grad``: the last product before the softmax gives q and kᵀ, the softmax S and α, the
first product after it α·V.  After one backward, ``.grad`` of each is the truth: α, ∂L/∂α, ∂L/∂S,
U = ∂L/∂(α V), dQ, dK, dV.  The softmax keeps float64 inputs in float64 (BLOOM, XGLM take it in
float32 by default; MPT casts S to float32 itself, which no swap undoes: its rows are float32-exact).
"""
from contextlib import contextmanager

import torch
import torch.nn.functional as F
import transformers

from dyntool.capture import Capture

from .hf_reference import _crop, float64_softmax
from .reference import check, per_layer

V = 61
_IDS = dict(vocab_size=V, bos_token_id=0, eos_token_id=1)
# (family, attention class, config); each records with right and left padding
FAMILIES = {
    "bloom": ("BloomAttention", lambda: transformers.BloomConfig(hidden_size=16, n_layer=2, n_head=2, **_IDS)),
    "mpt": ("MptAttention", lambda: transformers.MptConfig(
        d_model=16, n_layers=2, n_heads=2, max_seq_len=16, attn_config={"clip_qkv": 4.0, "alibi": True}, **_IDS)),
    "gpt_neo": ("GPTNeoSelfAttention", lambda: transformers.GPTNeoConfig(
        hidden_size=16, num_layers=2, num_heads=2, max_position_embeddings=16, window_size=3,
        attention_types=[[["global", "local"], 1]], **_IDS)),
    "falcon": ("FalconAttention", lambda: transformers.FalconConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, alibi=True, new_decoder_architecture=False,
        multi_query=True, **_IDS)),
    "falcon_rope": ("FalconAttention", lambda: transformers.FalconConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=4, alibi=False, new_decoder_architecture=True,
        num_kv_heads=2, **_IDS)),
    "xglm": ("XGLMAttention", lambda: transformers.XGLMConfig(
        d_model=16, num_layers=2, attention_heads=2, ffn_dim=32, max_position_embeddings=32, **_IDS)),
    "openai": ("Attention", lambda: transformers.OpenAIGPTConfig(n_embd=16, n_layer=2, n_head=2, n_positions=16,
                                                                 vocab_size=V)),
}
# MPT takes its softmax of S.float(): α is float32's, in a float64 model
# GPT-Neo casts q and k to float32 before q·kᵀ; XLM and Funnel take the softmax of S.float()
TOL = {"mpt": 1e-6, "gpt_neo": 1e-5, "xlm": 1e-6, "funnel": 1e-6, "xlnet": 1e-4}
# XLNet fails in float64 by itself (its relative positions are float32): built in float32, its
# truth is float32 autograd on the same tensors
DTYPE = {"xlnet": torch.float32}
QK = ("query_key_value", "Wqkv", "q_proj", "k_proj", "c_attn", "c_q", "c_k", "query", "key", "q_lin", "k_lin", "q", "k",
      "project_q", "project_k", "q_head", "k_head", "query_proj", "key_proj")


@contextmanager
def kept(classes):
    """Every call of a ``classes`` module: its products and softmaxes, tensors kept with retain_grad."""
    calls: list = []
    cur: list = []
    real = dict(softmax=F.softmax, matmul=torch.matmul, bmm=torch.bmm, baddbmm=torch.Tensor.baddbmm,
                mm=torch.Tensor.__matmul__, tmatmul=torch.Tensor.matmul, fbaddbmm=torch.baddbmm,
                einsum=torch.einsum, tsoftmax=torch.softmax)

    def keep(*ts):
        for t in ts:
            if t.requires_grad:
                t.retain_grad()

    def product(fn, pick):
        def run(*a, **kw):
            out = fn(*a, **kw)
            if cur and torch.is_grad_enabled():
                x, y = pick(a, kw)
                keep(x, y, out)
                cur[-1].append(("product", x, y, out))
            return out
        return run

    def softmax(x, dim=None, _stacklevel=3, dtype=None):
        out = real["softmax"](x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)
        if cur and torch.is_grad_enabled() and dim in (-1, x.dim() - 1):   # not ConvBERT's kernel softmax
            keep(x, out)
            cur[-1].append(("softmax", x, out))
        return out

    def tsoftmax(x, dim, dtype=None):                     # torch.softmax (Funnel)
        return softmax(x, dim=dim, dtype=dtype)

    two = lambda a, kw: (a[0], a[1])                                          # noqa: E731

    def einsum(eq, *ops):
        out = real["einsum"](eq, *ops)
        if cur and torch.is_grad_enabled() and len(ops) == 2:
            keep(*ops, out)
            cur[-1].append(("product", ops[0], ops[1], out, eq.replace(" ", "")))
        return out
    torch.einsum = einsum
    F.softmax, torch.softmax = softmax, tsoftmax
    torch.matmul, torch.bmm = product(real["matmul"], two), product(real["bmm"], two)
    torch.Tensor.__matmul__ = product(real["mm"], two)
    torch.Tensor.matmul = product(real["tmatmul"], two)
    operands = lambda a, kw: (kw.get("batch1", a[1] if len(a) > 1 else None),               # noqa: E731
                              kw.get("batch2", a[2] if len(a) > 2 else None))
    torch.Tensor.baddbmm = product(real["baddbmm"], operands)
    torch.baddbmm = product(real["fbaddbmm"], operands)
    handles = []

    def pre(m, args):
        cur.append([])

    def post(m, args, out):
        calls.append((m, cur.pop()))
    try:
        yield calls, lambda model: handles.extend(
            h for mod in model.modules() if type(mod).__name__ in classes
            for h in (mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)))
    finally:
        for h in handles:
            h.remove()
        F.softmax, torch.matmul, torch.bmm = real["softmax"], real["matmul"], real["bmm"]
        torch.softmax = real["tsoftmax"]
        torch.Tensor.__matmul__, torch.Tensor.baddbmm = real["mm"], real["baddbmm"]
        torch.Tensor.matmul, torch.baddbmm, torch.einsum = real["tmatmul"], real["fbaddbmm"], real["einsum"]


def _labels(eq: str):
    """(lx, ly, lo, batch, i, j, c) of a two-operand einsum x·y: i free in x, j free in y, c contracted."""
    (lx, ly), lo = eq.split("->")[0].split(","), eq.split("->")[1]
    c = (set(lx) & set(ly) - set(lo)).pop()
    i, j = (set(lx) - set(ly)).pop(), (set(ly) - set(lx)).pop()
    return lx, ly, lo, "".join(n for n in lo if n not in (i, j)), i, j, c


def truth(events, H: int, qk: bool = True) -> dict:
    """One attention call's truth, laid out (B, H, T, ·) like dyntool's recording (k/v per k/v head).
    ``qk=False``: no q, k (the recording says them unavailable), so no score product is needed."""
    i = next(n for n, e in enumerate(events) if e[0] == "softmax")
    _, S, a = events[i]
    _, _, v, y, *eq_v = next(e for e in events[i + 1:] if e[0] == "product")
    vg, yg = v.grad, y.grad
    if eq_v:          # an einsum: gradients put in matmul layout (batch…, n, d) by einsum itself
        lx, ly, lo, bt, qi, d, c = _labels(eq_v[0])
        vg, yg = torch.einsum(f"{ly}->{bt}{c}{d}", vg), torch.einsum(f"{lo}->{bt}{qi}{d}", yg)
    T, Tk = a.shape[-2:]
    H = a.shape[1] if H is None else H            # the scan: a module without a head count, 4-D α
    B = a.numel() // (H * T * Tk)

    def heads(t, n):
        t = t.double()                                         # GPT-Neo's q, k are float32
        if t.dim() == 4 and t.shape[1] != H:                   # a broadcast k/v head (MQA/GQA)
            return t.expand(B, t.shape[1], n, t.shape[-1])
        return t.reshape(B, H, n, t.shape[-1])
    v_grad = heads(vg, Tk)
    out = dict(attn=a.detach().reshape(B, H, T, Tk).double(), attn_grad=a.grad.reshape(B, H, T, Tk).double(),
               scores_grad=S.grad.reshape(B, H, T, Tk).double(), y_grad=heads(yg, T), v_grad=v_grad,
               q_grad=None, k_grad=None, n_kv=v_grad.shape[1] if v_grad.shape[1] != H else None)
    if qk:
        # the first product before the softmax of α's size: q·kᵀ (relative terms come after it:
        # Funnel, DeBERTa, XLNet); one product only elsewhere
        _, q, kt, _, *eq = next(e for e in events[:i] if e[0] == "product" and e[3].numel() == a.numel())
        qg, ktg = q.grad, kt.grad
        if eq:
            lx, ly, lo, bt, qi, kj, c = _labels(eq[0])
            qg, ktg = torch.einsum(f"{lx}->{bt}{qi}{c}", qg), torch.einsum(f"{ly}->{bt}{c}{kj}", ktg)
        out.update(q_grad=heads(qg, T), k_grad=heads(ktg.transpose(-1, -2), Tk))
    return out


_ENC = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=32, vocab_size=V, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# more families from transformers 5.x that compute their own softmax (docs/recording.md's second
# table, ``python -m tests.adapters.dataflow_families``): (attention class, config, model class)
MORE = {
    "gpt_neox_japanese": ("GPTNeoXJapaneseAttention", lambda: transformers.GPTNeoXJapaneseConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_multiple_size=2,
        max_position_embeddings=32, vocab_size=V), "AutoModelForCausalLM"),
    "xlm": ("MultiHeadAttention", lambda: transformers.XLMConfig(
        emb_dim=16, n_layers=2, n_heads=2, vocab_size=V, dropout=0.0, attention_dropout=0.0,
        max_position_embeddings=32), "XLMWithLMHeadModel"),
    "deberta_v2": ("DisentangledSelfAttention", lambda: transformers.DebertaV2Config(**_ENC), "AutoModelForMaskedLM"),
    "deberta_v2_relative": ("DisentangledSelfAttention", lambda: transformers.DebertaV2Config(
        relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8, max_relative_positions=16,
        **_ENC), "AutoModelForMaskedLM"),
    "roformer": ("RoFormerSelfAttention", lambda: transformers.RoFormerConfig(embedding_size=16, **_ENC),
                 "AutoModelForMaskedLM"),
    "mpnet": ("MPNetSelfAttention", lambda: transformers.MPNetConfig(**_ENC), "AutoModelForMaskedLM"),
    "squeezebert": ("SqueezeBertSelfAttention", lambda: transformers.SqueezeBertConfig(embedding_size=16, **_ENC),
                    "AutoModelForMaskedLM"),
    "convbert": ("ConvBertSelfAttention", lambda: transformers.ConvBertConfig(embedding_size=16, **_ENC),
                 "AutoModelForMaskedLM"),
    "rembert": ("RemBertSelfAttention", lambda: transformers.RemBertConfig(
        input_embedding_size=16, output_embedding_size=16, **_ENC), "AutoModelForMaskedLM"),
    "megatron_bert": ("MegatronBertSelfAttention", lambda: transformers.MegatronBertConfig(**_ENC),
                      "AutoModelForMaskedLM"),
    "funnel": ("FunnelRelMultiheadAttention", lambda: transformers.FunnelConfig(
        d_model=16, n_head=2, d_head=8, d_inner=32, block_sizes=[1, 1], vocab_size=V, hidden_dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0), "AutoModelForMaskedLM"),
    "xlnet": ("XLNetRelativeAttention", lambda: transformers.XLNetConfig(
        d_model=16, n_layer=2, n_head=2, d_inner=32, vocab_size=V, dropout=0.0), "XLNetLMHeadModel"),
    "cpmant": ("CpmAntAttention", lambda: transformers.CpmAntConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=2, dim_head=8, dim_ff=32, vocab_size=V,
        dropout_p=0.0), "AutoModelForCausalLM"),
}


def spec(family: str):
    """(attention class, config factory, model class name) of a family of either table."""
    if family in FAMILIES:
        return FAMILIES[family][0], FAMILIES[family][1], "AutoModelForCausalLM"
    return MORE[family]


def make(family: str, target: float = 30.0, **overrides):
    """A tiny float64 model of ``family`` (eager), q/k weights scaled so max |τ q·k| ≈ ``target``."""
    torch.manual_seed(0)
    _, make_cfg, model_cls = spec(family)
    cfg = make_cfg()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    cfg._attn_implementation = "eager"
    cls = getattr(transformers, model_cls)
    build = cls.from_config if model_cls.startswith("Auto") else cls._from_config
    with torch.device("cpu"):
        m = build(cfg, dtype=DTYPE.get(family, torch.float64)).eval()
    params = [p for n, p in m.named_parameters()            # XLNet's q, k are parameters themselves
              if (n.split(".")[-2] in QK and n.split(".")[-1] == "weight") or n.split(".")[-1] in ("q", "k")]
    x = inputs("right")
    for _ in range(3):                              # logits are bilinear in W_q, W_k: scale both by √ratio
        with Capture(m) as cap:
            m(**x).loss.backward()
        m.zero_grad()
        ratio = target / logit_max(cap.compute())
        with torch.no_grad():
            for p in params:
                p.mul_(ratio ** 0.5)
    return m


def logit_max(got: dict) -> float:
    """max |τ q·k|; where q, k are unavailable (recorded NaN), max |S| on the entries α weighs, mask
    values (|S| ≥ 1e4: a fully masked row's finfo.min, which α weighs uniformly) left out."""
    lm = got["logit_max"]
    if not bool(lm.isnan().all()):
        return float(lm.max())
    s = got["scores"].abs().nan_to_num(0.0)
    return float(s.masked_fill(s >= 1e4, 0.0).max())


def inputs(padding: str, B: int = 2, T: int = 7):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(3, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if B > 1:
        if padding == "right":
            mask[1, T - 2:] = 0
        else:
            mask[1, :3] = 0                           # left: rows 0..2 of sequence 1 see no real key
    return dict(input_ids=x, attention_mask=mask, labels=x.masked_fill(mask == 0, -100))


def compare(model, x, classes, H: int | None, tol: float = 1e-8, min_logit: float = 20.0, run=None) -> dict:
    """Record one forward/backward with Capture, then the truth of the same forward; assert equal.
    ``run(model)`` gives the loss (default: ``model(**x).loss``); ``H``: the head count, or a
    function of the attention module giving it (used only where α is 3-D: B·H unfolded)."""
    run = run or (lambda m: m(**x).loss)
    with float64_softmax():
        return _compare(model, run, classes, H, tol, min_logit)


def _compare(model, run, classes, H, tol, min_logit):
    with Capture(model) as cap:
        loss = run(model)
        loss.backward()
    model.zero_grad()
    got = cap.compute(torch.float64)            # GPT-Neo's q, k are float32: compare in float64
    assert logit_max(got) >= min_logit, "test must run at trained-size logits"
    qk = cap.attrs.get("qk_grads") != "unavailable"
    with kept(classes) as (calls, attach):
        attach(model)
        ref_loss = run(model)
        ref_loss.backward()
    model.zero_grad()
    torch.testing.assert_close(ref_loss.detach(), loss.detach(), rtol=1e-12, atol=0)
    assert len(calls) == got["attn"].shape[0]
    index = {s.key: i for i, s in enumerate(cap.sites)}            # calls run in forward order
    for m, events in calls:
        i = index[id(m)]
        ref = truth(events, H(m) if callable(H) else H, qk)
        n_kv = ref.pop("n_kv")
        T, Tk = ref["attn"].shape[-2:]            # sites of other sizes are padded (Funnel's pooled queries)
        layer = {k: _crop(k, t, T, Tk) for k, t in per_layer(got, i).items()}
        # entries α weighs, and those dyntool records as allowed under a finite mask value that
        # rounds α to 0 (MarkupLM's −10000): there B is U Vᵀ, autograd's ∂L/∂α, not 0
        seen = (ref["attn"] > 0) | ~layer["scores"].isnan()
        check(layer, ref, seen, n_kv, name=f"{type(model).__name__} L{i}", tol=tol, qk=qk)
    return {**cap.attrs, "logit_max": logit_max(got)}
