"""Recorded-step quantities and the §6 diagnostics (D1–D11) for batched single-head runs.

``step_record(state, ...)`` makes ONE pass over query-row chunks of a
:class:`~dyntool.sims.single_head.StepState` (R runs at once) and returns, per run, the recorded
arrays in the (layer=1, head=1, seq=1, ...) layout of :mod:`dyntool.record.names` — window
matrices, block-pooled overviews (means over *visible* entries), per-position vectors — plus the
scalar diagnostics below.  Nothing N×N is ever held whole: at most (R, chunk, N).

=========================  ===================================================================
``diag_b_mean/std``        D1 mean / std of b_ij over the attended support (all allowed pairs)
``diag_neg_b_mass``        D1 Σ_ij α_ij 1[b_ij < 0] / N: attention mass on useful values
``diag_b_sv1``             D1 top singular value of B on the recorded window
``diag_routing_drive``     D2 mean_i Var_{α_i}(b) = +mean_i Σ_j ∂L/∂s_ij · b_ij  (≥ 0: Σ_j α_ij(b_ij − E)b_ij
                           is a variance; an earlier reading of the D2 identity had a wrong minus sign)
``diag_eff_columns``       D3 exp(H(c/Σc)), effective number of used value columns
``diag_max_usage``         D3 max_j c_j / N;  ``diag_dead_values``: #{c_j < 1e-3}
``diag_value_norm``        D4 mean ‖v_j‖
``diag_attn_entropy``      D5 mean_i H(α_i) (nats); ``diag_attn_entropy_norm``: mean H_i/log|M(i)|
``diag_pc1_share``         D6 explained-variance share of PC1 of the head outputs g_i
``diag_participation``     D6 participation ratio (Σλ)²/Σλ²
``diag_r_pc1_entropy``     D7 Pearson r(PC1(g_i), H_Bayes(i)), PC1 oriented so r ≥ 0
``diag_r_best_entropy``    D7 max_k≤5 |r(PC_k, H_Bayes)|
``diag_key_orthogonality`` D8 mean off-diagonal |cos| between the columns of W_K
``diag_same_symbol_mass``  D9 α mass on keys whose preceding symbol equals the query's
``diag_grad_norm_qk/v/o``  D10 ‖∂L/∂W_{Q,K}‖, ‖∂L/∂W_V‖, ‖∂L/∂W_O‖
``diag_share_qk/v/o``      D10 shares of Σ‖∂L/∂θ‖² (first-order ΔL split of arXiv 2512.22473, first-order loss change)
``diag_js_drift``          D10 mean JS(α_i(t) ‖ α_i(previous record)) on the recorded window
``diag_entropy_gap``       D11 H_pred − H_min;  ``diag_excess_loss``: loss − H_min
``diag_routing_residual``  ‖∂L/∂S(autograd) − α⊙(B − E_α[b])‖ / ‖∂L/∂S(autograd)‖ on the recorded
                           query rows (autograd in float64 through the head): the engine checks itself
=========================  ===================================================================
"""
from __future__ import annotations

import math

import torch

from ..record.recorder import pool_blocks


def _js(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Row-wise Jensen–Shannon divergence (nats) of (..., K) distributions."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return (a * (torch.log(a.clamp_min(1e-30)) - torch.log(b.clamp_min(1e-30)))).sum(-1)
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def _pca_stats(G: torch.Tensor, H_bayes: torch.Tensor) -> dict[str, torch.Tensor]:
    """D6/D7 on head outputs G (R, N, d): PC1 share, participation ratio, r(PC, H_Bayes)."""
    Gc = G.double() - G.double().mean(1, keepdim=True)
    _, S, Vh = torch.linalg.svd(Gc, full_matrices=False)                # (R, d), (R, d, d)
    lam = S ** 2
    proj = Gc @ Vh[:, :5].transpose(1, 2)                               # (R, N, ≤5)
    h = H_bayes.double() - H_bayes.double().mean(-1, keepdim=True)      # (R, N)
    r = (proj * h[..., None]).sum(1) / (proj.norm(dim=1) * h.norm(dim=-1, keepdim=True)).clamp_min(1e-30)
    return {"diag_pc1_share": lam[:, 0] / lam.sum(-1),
            "diag_participation": lam.sum(-1) ** 2 / (lam ** 2).sum(-1),
            "diag_r_pc1_entropy": r[:, 0].abs(), "diag_r_best_entropy": r.abs().amax(-1)}


def routing_residual(state, q0: int, q1: int) -> torch.Tensor:
    """(R,) relative residual of the closed-form score gradient against autograd, rows [q0, q1).

    Row i of S only feeds loss term i, so the rows of the window can be checked on their own:
    rebuild s for those rows in float64, run the head's readout and the (mean over all N) cross
    entropy through autograd, and compare ∂L/∂s with the engine's α ⊙ (B − E_α[b]).
    """
    N, d_k = state.N, state.d_k
    W = state.weights
    x = state.x.double()
    q = (x[:, q0:q1] @ W.W_Q.double()) / math.sqrt(d_k)                  # (R, w, d_k)
    k, v = x @ W.W_K.double(), x @ W.W_V.double()                          # (R, N, ·)
    m = state.mask(q0, q1)
    s = (q @ k.transpose(1, 2)).masked_fill(~m, float("-inf")).requires_grad_(True)
    with torch.enable_grad():
        logits = (torch.softmax(s, -1) @ v) @ W.W_O.double()                # (R, w, C)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), state.y[:, q0:q1], reduction="sum") / N
        (auto,) = torch.autograd.grad(loss, s)
    auto = auto.masked_fill(~m, 0.0)
    closed = state.window(q0, q1, ("dS",))["dS"].double()
    return (auto - closed).flatten(1).norm(dim=1) / auto.flatten(1).norm(dim=1).clamp_min(1e-300)


def step_record(state, qwin: tuple[int, int], kwin: tuple[int, int], block: int, prev_sym: torch.Tensor,
                H_bayes: torch.Tensor, h_min: float, prev_window_alpha: torch.Tensor | None = None,
                chunk: int = 256) -> tuple[list[dict], dict[str, torch.Tensor], torch.Tensor]:
    """Returns (per-run recorded arrays, diagnostics {name: (R,)}, α on the window (R, wq, wk)).

    ``prev_sym`` (R, N) previous symbol per position; ``H_bayes`` (R, N) Bayes predictive entropy.
    """
    R, N = state.U.shape[:2]
    dt = state.x.dtype
    d_k = state.d_k
    (q0w, q1w), (k0w, k1w) = qwin, kwin
    chunk = max(1, chunk // block) * block if block > 0 else chunk
    win = {n: [] for n in ("alpha", "B", "A", "dS", "S")}
    pooled = {n: [] for n in ("alpha", "B", "A", "dS")}
    dQ, ent, ent_n = [], [], []
    dK, dV = torch.zeros_like(state.k), torch.zeros_like(state.v)
    usage = torch.zeros(R, N, dtype=dt)
    sums = {k: torch.zeros(R, dtype=torch.float64) for k in ("b", "b2", "cnt", "neg", "drive", "same", "smax", "s2")}
    for q0 in range(0, N, chunk):
        q1 = min(q0 + chunk, N)
        w = state.window(q0, q1, ("alpha", "B", "A", "dS", "S"))         # each (R, c, N)
        m = state.mask(q0, q1)                                            # (c, N)
        a, b, A, dS, s = w["alpha"], w["B"], w["A"], w["dS"], w["S"]     # s: −inf where masked
        # --- per-position gradients and stats (as StepState.positional)
        dSs = dS / math.sqrt(d_k)
        dQ.append(dSs @ state.k)
        dK += dSs.transpose(1, 2) @ state.q[:, q0:q1]
        dV += a.transpose(1, 2) @ state.U[:, q0:q1]
        usage += a.sum(1)
        e = -(a * torch.log(a.clamp_min(1e-30))).sum(-1)                  # (R, c)
        ent.append(e)
        support = m.sum(-1).to(dt)
        ent_n.append(torch.where(support > 1, e / torch.log(support.clamp_min(2)), torch.zeros_like(e)))
        # --- diagnostic sums
        mf = m.to(dt)
        sums["b"] += (b * mf).sum((1, 2)).double()
        sums["b2"] += (b * b * mf).sum((1, 2)).double()
        sums["cnt"] += mf.sum().double()
        sums["neg"] += (a * (b < 0)).sum((1, 2)).double()
        sums["drive"] += (dS * b).sum((1, 2)).double()
        same = (prev_sym[:, q0:q1, None] == prev_sym[:, None, :]).to(dt)
        sums["same"] += (a * same).sum((1, 2)).double()
        sm = s.masked_fill(~m, 0.0)
        sums["smax"] = torch.maximum(sums["smax"], sm.abs().amax((1, 2)).double())
        sums["s2"] += (sm * sm).sum((1, 2)).double()
        # --- windowed matrices
        lo, hi = max(q0, q0w), min(q1, q1w)
        if lo < hi:
            rows = slice(lo - q0, hi - q0)
            for n, t in (("alpha", a), ("B", b), ("A", A), ("dS", dS), ("S", s.masked_fill(~m, float("nan")))):
                win[n].append(t[:, rows, k0w:k1w])
        if block > 0:       # chunks hold whole block rows, so per-chunk block means are final
            for n, t in (("alpha", a), ("B", b), ("A", A), ("dS", dS)):
                pooled[n].append(pool_blocks(t, block, m))
    W = {n: torch.cat(v, 1) for n, v in win.items()}
    P = {}
    if block > 0:
        P = {n: torch.cat(v, 1) for n, v in pooled.items()}               # NaN for fully masked blocks
    dQ, ent, ent_n = torch.cat(dQ, 1), torch.cat(ent, 1), torch.cat(ent_n, 1)
    value_norm = state.v.norm(dim=-1)
    diag = _diagnostics(state, sums, usage, ent, ent_n, value_norm, W, H_bayes, h_min, prev_window_alpha)
    resid = routing_residual(state, q0w, q1w)
    diag["diag_routing_residual"] = resid       # also stored as the routing_residual array
    per_run = []
    for r in range(R):
        def one(t):
            return t[r][None, None, None]                                 # → (1, 1, 1, ...)
        rec = {"attn": one(W["alpha"]), "compat": one(W["B"]), "advantage": one(W["A"]),
               "score_grad": one(W["dS"]), "scores": one(W["S"]),
               "upstream": one(state.U), "values": one(state.v), "queries": one(state.q),
               "keys": one(state.k), "value_grad": one(dV), "query_grad": one(dQ), "key_grad": one(dK),
               "expected_compat": one(state.baseline), "attn_entropy": one(ent),
               "attn_entropy_norm": one(ent_n), "column_usage": one(usage), "value_norm": one(value_norm),
               "logit_max": sums["smax"][r].view(1, 1).float(),
               "logit_norm": torch.sqrt(sums["s2"][r] / sums["cnt"][r]).view(1, 1).float(),
               "routing_residual": resid[r].view(1, 1).float()}
        for n, key in (("alpha", "attn_pooled"), ("B", "compat_pooled"), ("A", "advantage_pooled"),
                       ("dS", "score_grad_pooled")):
            if n in P:
                rec[key] = one(P[n])
        per_run.append(rec)
    return per_run, diag, W["alpha"]


def _diagnostics(state, sums, usage, ent, ent_n, value_norm, W, H_bayes, h_min, prev_alpha) -> dict:
    R, N = usage.shape
    mean_b = sums["b"] / sums["cnt"]
    c = usage.double() / usage.double().sum(-1, keepdim=True)
    g = {n: state.grads[n].double().flatten(1).norm(dim=1) for n in state.grads}
    sq = {"qk": g["W_Q"] ** 2 + g["W_K"] ** 2, "v": g["W_V"] ** 2, "o": g["W_O"] ** 2}
    total = sum(sq.values()).clamp_min(1e-300)
    WK = torch.nn.functional.normalize(state.weights.W_K.double(), dim=1)   # columns (R, d_x, d_k)
    cos = (WK.transpose(1, 2) @ WK).abs()
    d = cos.shape[-1]
    off = (cos.sum((1, 2)) - cos.diagonal(dim1=1, dim2=2).sum(-1)) / (d * (d - 1))
    P = state.P.double()
    H_pred = -(P * torch.log(P + 1e-10)).sum(-1).mean(-1)
    diag = {
        "diag_b_mean": mean_b, "diag_b_std": torch.sqrt((sums["b2"] / sums["cnt"] - mean_b ** 2).clamp_min(0)),
        "diag_neg_b_mass": sums["neg"] / N,
        "diag_b_sv1": torch.linalg.matrix_norm(W["B"].double(), ord=2),
        "diag_routing_drive": sums["drive"] / N,
        "diag_eff_columns": torch.exp(-(c * torch.log(c.clamp_min(1e-300))).sum(-1)),
        "diag_max_usage": usage.double().amax(-1) / N, "diag_dead_values": (usage < 1e-3).sum(-1).double(),
        "diag_value_norm": value_norm.double().mean(-1),
        "diag_attn_entropy": ent.double().mean(-1), "diag_attn_entropy_norm": ent_n.double().mean(-1),
        **_pca_stats(state.G, H_bayes),
        "diag_key_orthogonality": off,
        "diag_same_symbol_mass": sums["same"] / N,
        "diag_grad_norm_qk": torch.sqrt(sq["qk"]), "diag_grad_norm_v": g["W_V"], "diag_grad_norm_o": g["W_O"],
        "diag_share_qk": sq["qk"] / total, "diag_share_v": sq["v"] / total, "diag_share_o": sq["o"] / total,
        "diag_js_drift": (_js(W["alpha"].double(), prev_alpha.double()).mean(-1) if prev_alpha is not None
                          else torch.full((R,), float("nan"), dtype=torch.float64)),
        "diag_entropy_gap": H_pred - h_min, "diag_excess_loss": state.loss.double() - h_min,
    }
    return diag
