"""Independent float64 references for the adapter tests: autograd on the model's own tensors.

``check(got, ref, allowed)`` compares dyntool's recorded quantities of one layer (already put in
(seq, head, ...) order) with autograd gradients of the same forward; nothing here calls
dyntool.quantities.
"""
import torch

# atol 1e-8 (the acceptance bound): Llama-family eager attention takes its softmax in float32
# even for float64 models, so α there differs from the exact one by ~1e-9.
TOL = dict(rtol=1e-8, atol=1e-8)


def per_layer(got: dict, layer: int) -> dict:
    """(L, nh, S, ...) → (S, nh, ...) for one layer; per-head scalars stay (nh,)."""
    return {k: v[layer].transpose(0, 1) if v.dim() >= 4 else v[layer] for k, v in got.items()}


def group_sum(x: torch.Tensor, n_kv: int) -> torch.Tensor:
    """(B, nh, T, d) per query head → (B, n_kv, T, d) summed over each kv group."""
    B, nh = x.shape[:2]
    return x.reshape(B, n_kv, nh // n_kv, *x.shape[2:]).sum(2)


def check(got: dict, ref: dict, allowed: torch.Tensor, n_kv: int | None = None, name: str = "",
          tol: float | None = None, qk: bool = True) -> None:
    """ref: attn, attn_grad (= ∂L/∂α), scores_grad, y_grad (U), q_grad, k_grad, v_grad.
    ``qk=False``: the recording says q, k unavailable: dQ, dK must be NaN, not compared."""
    TOL = globals()["TOL"] if tol is None else dict(rtol=tol, atol=tol)
    ok = allowed.expand_as(ref["attn"])
    z = lambda t: t.masked_fill(~ok, 0.0)                     # noqa: E731
    torch.testing.assert_close(got["attn"], ref["attn"], **TOL, msg=f"{name} attn")
    torch.testing.assert_close(got["compat"], z(ref["attn_grad"]), **TOL, msg=f"{name} B")
    torch.testing.assert_close(got["score_grad"], z(ref["scores_grad"]), **TOL, msg=f"{name} dS")
    torch.testing.assert_close(got["upstream"], ref["y_grad"], **TOL, msg=f"{name} U")
    # advantage from the reference α and B: A = E_α[b] − b on allowed entries
    b = z(ref["attn_grad"])
    adv = z((ref["attn"] * b).sum(-1, keepdim=True) - b)
    torch.testing.assert_close(got["advantage"], adv, **TOL, msg=f"{name} advantage")
    if qk:
        torch.testing.assert_close(got["query_grad"], ref["q_grad"], **TOL, msg=f"{name} dQ")
    else:
        assert bool(got["query_grad"].isnan().all() and got["key_grad"].isnan().all()), f"{name} dQ/dK not NaN"
    kg, vg = got["key_grad"], got["value_grad"]
    if n_kv is not None:
        kg, vg = group_sum(kg, n_kv), group_sum(vg, n_kv)
    if qk:
        torch.testing.assert_close(kg, ref["k_grad"], **TOL, msg=f"{name} dK")
    torch.testing.assert_close(vg, ref["v_grad"], **TOL, msg=f"{name} dV")
