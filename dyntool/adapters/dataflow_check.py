"""The dataflow adapter's checks of itself: forward (α V is the output the model used) and backward
(autograd's own ∂L/∂α and ∂L/∂S are U Vᵀ and α ⊙ (B − E_α[b])).

The forward check runs on every recorded forward; the backward one on the first recorded step of a
model and every N-th after (tensor hooks on α, S and the α·V output: U arrives first, then ∂L/∂α,
then ∂L/∂S, where the comparison runs).  A mismatch refuses the site in one line with the residual:
dropout > 0, an op applied to α before V, the wrong operand taken as V, a model edited since.
"""
from __future__ import annotations

import torch

from ..observe import expand_kv
from ..quantities import compute_dtype
from .base import AdapterError

# relative ‖autograd − formula‖ / ‖autograd‖.  float64: the two sides round differently (≈1e-15);
# float32: the softmax's own backward rounds at ≈1e-7 per entry, the subtraction B − E_α[b] can
# cancel a few digits; bfloat16/float16 α·V: the model's U Vᵀ is itself rounded to 8 bits
BACKWARD_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 1e-2}
FORWARD_TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / a.norm().clamp_min(torch.finfo(a.dtype).tiny))


def check_forward(what: str, alpha4, v4, out4, dropout_p: float) -> None:
    """α V (α the softmax's own output) must be the tensor the model went on with."""
    dt = compute_dtype(out4.dtype)
    with torch.no_grad():
        o = out4.detach().to(dt)
        o_hat = torch.matmul(alpha4.detach().to(dt), expand_kv(v4.detach().to(dt), alpha4.shape[1]))
        both = torch.isfinite(o) & torch.isfinite(o_hat)     # a model's own NaN rows are its, not a mismatch
        err = _rel(o[both], o_hat[both]) if bool(both.any()) else 0.0
    tol = FORWARD_TOL.get(out4.dtype, 1e-5)
    if not err <= tol:
        why = (f"attention dropout p={dropout_p:g} is on (model.eval() or dropout 0 to record)" if dropout_p
               else "an op between the softmax and α·V that dyntool does not follow")
        raise AdapterError(f"{what}: softmax(S)·V differs from the output the model used by {err:.2g} "
                           f"(> {tol:g}): {why}; refused, nothing recorded")


class BackwardCheck:
    """Hooks on one site's α·V output (U), α (∂L/∂α) and S (∂L/∂S); compares on ∂L/∂S's arrival."""

    def __init__(self, what: str, S, alpha, out4, v4, shape):
        self.what, self.shape = what, shape                   # shape: (B, H, T, Tk)
        self.alpha = alpha.detach()
        self.v = v4.detach()
        self.u = self.d_alpha = None
        # the least precise of S, α and the α·V product sets what agreement means (BLOOM, MPT: float32 α)
        self.tol = max(BACKWARD_TOL.get(t.dtype, 1e-5) for t in (S, alpha, out4))
        self.handles = [out4.register_hook(self._on_u), alpha.register_hook(self._on_alpha),
                        S.register_hook(self._on_scores)]
        self.residuals: tuple[float, float] | None = None

    def _on_u(self, g):
        self.u = g.detach()

    def _on_alpha(self, g):
        self.d_alpha = g.detach()

    def _on_scores(self, g):
        if self.u is None or self.d_alpha is None:
            return                          # a gradient that reached S another way: nothing to compare
        dt = compute_dtype(self.v.dtype)
        with torch.no_grad():
            a = self.alpha.to(dt).reshape(self.shape)
            b = torch.matmul(self.u.to(dt), expand_kv(self.v.to(dt), self.shape[1]).transpose(-1, -2))
            ds = a * (b - (a * b).sum(-1, keepdim=True))
            e_alpha = _rel(self.d_alpha.to(dt).reshape(self.shape), b)
            e_scores = _rel(g.detach().to(dt).reshape(self.shape), ds)
        self.residuals = (e_alpha, e_scores)
        if not (e_alpha <= self.tol and e_scores <= self.tol):
            raise AdapterError(
                f"{self.what}: autograd's ∂L/∂α differs from U Vᵀ by {e_alpha:.2g} and its ∂L/∂S from "
                f"α ⊙ (B − E_α[b]) by {e_scores:.2g} (> {self.tol:g}): something acts on α before V (dropout "
                "> 0, an op dyntool does not follow, the wrong operand taken as V, a model edited since); refused")

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
