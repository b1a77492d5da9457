"""TransformerLens TransformerBridge (3.9+ and 4.x): recorded quantities vs autograd (float64).

Runs with whichever TransformerLens is installed: the ``tl`` extra pins 3.x (HookedTransformer),
whose ``model_bridge`` already holds TransformerBridge; the same tests pass under 4.3 (see README,
"Record your own model").  Toy Hugging Face models are built in memory: no download."""
import warnings

import pytest
import torch

from dyntool.capture import Capture, CaptureError

from .reference import check, per_layer

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformer_lens", reason="transformer-lens not installed (pip install dyntool[tl])")
try:
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
except ImportError:                                                     # pragma: no cover
    pytest.skip("this transformer-lens has no TransformerBridge", allow_module_level=True)


pytestmark = pytest.mark.usefixtures("float64_default")     # tests/conftest.py


def _bridge(arch):
    T = transformers
    common = dict(vocab_size=23, num_hidden_layers=2, max_position_embeddings=32)
    if arch == "llama-gqa":
        cfg = T.LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                            **common)
        cls = T.LlamaForCausalLM
    elif arch == "gpt2":          # fused c_attn: the bridge splits it (JointQKVAttentionBridge)
        cfg, cls = T.GPT2Config(vocab_size=23, n_embd=16, n_layer=2, n_head=4, n_positions=32), T.GPT2LMHeadModel
    elif arch == "gemma2-softcap":    # attention soft-capping, query_pre_attn_scalar, local layers
        cfg = T.Gemma2Config(hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=4, attn_logit_softcapping=5.0, query_pre_attn_scalar=8, sliding_window=4,
                             **common)
        cls = T.Gemma2ForCausalLM
    torch.manual_seed(0)
    model = cls(cfg).to(torch.float64).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        br = build_bridge_from_module(model, cls.__name__, hf_config=cfg)
    # trained-size logits (max |τ q·k| ≥ 20; random init keeps them ≈ 0.03, where soft-capping
    # and any score error are invisible): scale the query and key projections
    with torch.no_grad():
        seen = set()
        for n, p in br.named_parameters():
            if (".attn.q." in n or ".attn.k." in n or "q_proj" in n or "k_proj" in n) and id(p) not in seen:
                seen.add(id(p))
                p.mul_(40.0)
    return br


def _q_hooks(attn):
    """The bridge's hook points holding q, k (after RoPE when it has one), v, scores, α, z."""
    rot = hasattr(attn, "hook_rot_q")
    return {"q": attn.hook_rot_q if rot else attn.q.hook_out, "k": attn.hook_rot_k if rot else attn.k.hook_out,
            "v": attn.v.hook_out, "s": attn.hook_attn_scores, "a": attn.hook_pattern, "y": attn.o.hook_in}


def _reference(br, x):
    keep, handles = {}, []
    for l, b in enumerate(br.blocks):
        for name, hp in _q_hooks(b.attn).items():
            def fwd(mod, args, out, key=(l, name)):
                out.retain_grad()
                keep[key] = out
            handles.append(hp.register_forward_hook(fwd))
    try:
        br(x, return_type="loss").backward()
    finally:
        for h in handles:
            h.remove()
    out = []
    nh = 4
    for l in range(len(br.blocks)):
        g = lambda n: keep[(l, n)].grad                              # noqa: E731

        def heads(t):                  # raw hook layouts → (B, h, T, d)
            if t.dim() == 3:           # flat (B, T, h·d)
                return t.reshape(t.shape[0], t.shape[1], -1, 4).transpose(1, 2)
            return t                   # RoPE hooks hold HF's (B, h, T, d)
        s = keep[(l, "s")].detach()
        allowed = s > torch.finfo(s.dtype).min / 2
        # The bridge takes its softmax in float32 even for a float64 model (RoPE bridges), so its
        # pattern is float32-rounded (≈1e-7): α is checked against the float64 softmax of the very
        # scores it saw, and against its own pattern to that rounding; gradients stay ≤ 1e-8.
        attn = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
        torch.testing.assert_close(keep[(l, "a")].detach(), attn, rtol=0, atol=5e-7)
        out.append(dict(attn=attn, attn_grad=g("a"), scores_grad=g("s"),
                        y_grad=heads(g("y")), q_grad=heads(g("q")), k_grad=heads(g("k")), v_grad=heads(g("v")),
                        allowed=allowed))
        assert out[-1]["y_grad"].shape[1] == nh
    br.zero_grad()
    return out


@pytest.mark.parametrize("arch", ["llama-gqa", "gpt2", "gemma2-softcap"])
def test_transformer_bridge_matches_autograd(arch):
    br = _bridge(arch)
    x = torch.randint(23, (2, 8))
    with Capture(br) as cap:
        br(x, return_type="loss").backward()
    got = cap.compute()
    assert cap.attrs["adapter"] == "tlens-bridge"
    assert cap.attrs.get("score_modifiers", []) == (["softcap"] if "softcap" in arch else [])
    assert float(got["logit_max"].max()) >= 20, float(got["logit_max"].max())
    br.zero_grad()
    n_kv = None if arch == "gpt2" else 2
    for l, r in enumerate(_reference(br, x)):
        check(per_layer(got, l), r, r["allowed"], n_kv, name=f"L{l}")
    if arch == "gemma2-softcap":       # layer 0 is sliding (window 4), layer 1 global
        assert (got["attn"][0, :, :, 7, :4] == 0).all() and (got["attn"][1, :, :, 7, :4] > 0).all()


def test_transformer_bridge_refuses_a_score_edit_it_is_not_told_about():
    br = _bridge("llama-gqa")
    bias = torch.linspace(-2, 2, 8)
    h = br.blocks[0].attn.hook_attn_scores.register_forward_hook(lambda m, a, out: out + bias)
    try:
        with pytest.raises(CaptureError) as e:
            with Capture(br):
                br(torch.randint(23, (2, 8)), return_type="loss").backward()
    finally:
        h.remove()
    assert "\n" not in str(e.value) and "layer 0" in str(e.value) and "does not reproduce" in str(e.value)
