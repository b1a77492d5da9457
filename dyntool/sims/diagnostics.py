"""Recorded-step quantities and the diagnostics D1–D11 (dyntool's numbering, table below) for batched
single-head runs.

``step_record(state, ...)`` makes ONE pass over query-row chunks of a
:class:`~dyntool.sims.single_head.StepState` (R runs at once) and returns, per run, the recorded
arrays in the (layer=1, head=1, seq=1, ...) layout of :mod:`dyntool.record.names` — cropped
matrices, block-pooled overviews (means over *visible* entries), per-position vectors — plus the
scalar diagnostics below.  Nothing N×N is ever held whole: at most (R, chunk, N).

=========================  ===================================================================
``diag_b_mean/std``        D1 mean / std of b_ij over the attended support (all allowed pairs)
``diag_neg_b_mass``        D1 Σ_ij α_ij 1[b_ij < 0] / N: attention mass on useful values
``diag_b_sv1``             D1 top singular value of B on the recorded crop
``diag_routing_drive``     D2 mean_i Var_{α_i}(b) = +mean_i Σ_j ∂L/∂s_ij · b_ij  (≥ 0: Σ_j α_ij(b_ij − E)b_ij
                           is a variance)
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
``diag_js_drift``          D10 mean JS(α_i(t) ‖ α_i(previous record)) on the recorded crop
``diag_entropy_gap``       D11 H_pred − H_min;  ``diag_excess_loss``: loss − H_min
``diag_routing_residual``  ‖∂L/∂S(autograd) − α⊙(B − E_α[b])‖ / ‖∂L/∂S(autograd)‖ on the recorded
                           query rows (autograd in float64 through the head): the engine checks itself
=========================  ===================================================================
"""
from __future__ import annotations

import contextlib
import math
from concurrent.futures import ThreadPoolExecutor

import torch

from .. import quantities as Q
from .step_state import MATRIX_NAMES, POOLED_NAMES, accumulate_grads, pool_to_width


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

    Row i of S only feeds loss term i, so the rows of the block can be checked on their own:
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
    closed = state.row_block(q0, q1, ("score_grad",))["score_grad"].double()
    return (auto - closed).flatten(1).norm(dim=1) / auto.flatten(1).norm(dim=1).clamp_min(1e-300)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-run Σ a ⊙ b over all but the leading axis, as one batched matmul (no (R, c, N) temporary)."""
    R = a.shape[0]
    return torch.bmm(a.reshape(R, 1, -1), b.reshape(R, -1, 1)).view(R).double()


def _logit_sums(s: torch.Tensor, visible: torch.Tensor, last_full: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(max |s|, Σ s²) per run over the visible entries of a chunk of scores (−inf where masked).
    Keys ≤ ``last_full`` are visible to every row: reduced in place on a view (one read each);
    only the rest is masked to 0 first."""
    full = s[..., :last_full + 1]
    mx = torch.linalg.vector_norm(full, float("inf"), dim=(1, 2)).double()
    sq = torch.linalg.vector_norm(full, 2, dim=(1, 2)).double() ** 2
    if s.shape[-1] > last_full + 1:
        rest = s[..., last_full + 1:].masked_fill(~visible[:, last_full + 1:], 0.0)
        mx = torch.maximum(mx, torch.linalg.vector_norm(rest, float("inf"), dim=(1, 2)).double())
        sq = sq + torch.linalg.vector_norm(rest, 2, dim=(1, 2)).double() ** 2
    return mx, sq


def _key_crop(t: torch.Tensor, k0: int, k1: int, fill: float) -> torch.Tensor:
    """Keys [k0, k1) of a chunk that may stop before k1 (at its last visible key): padded with the
    masked value ``fill``."""
    if t.shape[-1] < k1:
        t = torch.nn.functional.pad(t, (0, k1 - t.shape[-1]), value=fill)
    return t[..., k0:k1]


# the recorded crop of attn and compat is cut for every run (diagnostics); these only for stored runs
_STORED_ONLY = ("advantage", "score_grad", "scores")


class _Arrays:
    """The recorded arrays of the runs in ``idx``, accumulated chunk by chunk (public names)."""

    def __init__(self, state, idx: torch.Tensor, qcrop, kcrop, block: int):
        self.st, self.idx, self.block = state, idx, block
        self.every_run = torch.equal(idx, torch.arange(state.upstream.shape[0]))
        (self.q0c, self.q1c), (self.k0c, self.k1c) = qcrop, kcrop
        self.crop = {n: [] for n in _STORED_ONLY}
        self.pooled = {n: [] for n in POOLED_NAMES}
        self.q, self.k, self.u, self.e = (self._pick(t) for t in (state.queries, state.keys, state.upstream,
                                                                   state.expected_compat))
        self.dQ = []
        self.dK = torch.zeros_like(self.k)
        self.dV = torch.zeros(len(idx), state.N, state.values.shape[-1], dtype=state.x.dtype)

    def _pick(self, t: torch.Tensor) -> torch.Tensor:
        """The stored runs' slice of an (R, ...) tensor (a copy unless every run is stored)."""
        return t if self.every_run else t.index_select(0, self.idx)

    def add(self, q0: int, q1: int, vis: torch.Tensor, w: dict) -> None:
        # scores are only stored on the crop's rows: not copied whole
        w = {n: (t if n == "scores" else self._pick(t)) for n, t in w.items()}      # (r, c, k1) each
        # the advantage is only stored, never needed for a diagnostic: computed for these runs only
        w["advantage"] = Q.advantage(w["attn"], w["compat"], vis, expected=self.e[:, q0:q1])
        self.dQ.append(accumulate_grads(self.dK, self.dV, w["attn"], w["score_grad"], self.q, self.k, self.u,
                                        q0, q1, self.st.scale))
        lo, hi = max(q0, self.q0c), min(q1, self.q1c)
        if lo < hi:
            rows = slice(lo - q0, hi - q0)
            for n in _STORED_ONLY:
                t = w[n][:, rows]
                if n == "scores":
                    t = self._pick(t).masked_fill(~vis[rows], float("nan"))
                fill = float("nan") if n == "scores" else 0.0
                self.crop[n].append(_key_crop(t, self.k0c, self.k1c, fill))
        if self.block > 0:       # chunks hold whole block rows, so per-chunk block means are final
            for n in POOLED_NAMES:
                self.pooled[n].append(pool_to_width(w[n], self.block, vis, self.st.N))


def step_record(state, qcrop: tuple[int, int], kcrop: tuple[int, int], block: int, prev_sym: torch.Tensor,
                H_bayes: torch.Tensor, h_min: float, prev_crop_attn: torch.Tensor | None = None,
                chunk: int = 256, recorded=None) -> tuple[list[dict], dict[str, torch.Tensor], torch.Tensor]:
    """Returns (recorded arrays per run in ``recorded``, diagnostics {name: (R,)} for ALL runs,
    α on the crop (R, wq, wk)).

    ``recorded``: indices of the runs whose arrays are wanted (default all); the others only get
    their diagnostics, which need no N×N array kept.  ``prev_sym`` (R, N) previous symbol per
    position; ``H_bayes`` (R, N) Bayes predictive entropy.
    """
    R, N = state.upstream.shape[:2]
    dt = state.x.dtype
    (q0c, q1c), (k0c, k1c) = qcrop, kcrop
    idx = torch.arange(R) if recorded is None else torch.as_tensor(list(recorded), dtype=torch.long)
    arrays = _Arrays(state, idx, qcrop, kcrop, block) if len(idx) else None
    rows = max(1, chunk // block) * block if block > 0 else chunk
    ent, ent_n, crop_attn, crop_compat = [], [], [], []
    usage = torch.zeros(R, N, dtype=dt)
    # same-symbol mass Σ_j α_ij [prev_j = prev_i] as α @ onehot(prev): an (R, c, S) matmul, not (R, c, N)
    onehot = torch.nn.functional.one_hot(prev_sym, int(prev_sym.max()) + 1).to(dt)   # (R, N, S)
    sums = {k: torch.zeros(R, dtype=torch.float64) for k in ("b", "b2", "cnt", "neg", "drive", "same", "smax", "s2")}
    for q0, q1, m, w in state.chunks(rows, ("scores", "attn", "compat", "score_grad")):
        a, b, dS, s = w["attn"], w["compat"], w["score_grad"], w["scores"]   # (R, c, k1); s: −inf masked
        k1 = m.shape[-1]
        usage[:, :k1] += a.sum(1)
        e = Q.entropy(a)                                                  # (R, c)
        ent.append(e)
        ent_n.append(Q.normalised_entropy(e, m))
        # --- diagnostic sums (b, ∂L/∂S are 0 where masked, so no mask multiplies)
        sums["b"] += b.sum((1, 2)).double()
        sums["b2"] += _dot(b, b)
        sums["cnt"] += m.sum().double()
        sums["neg"] += torch.where(b < 0, a, 0.0).sum((1, 2)).double()
        sums["drive"] += _dot(dS, b)
        same = torch.bmm(a, onehot[:, :k1]).gather(-1, prev_sym[:, q0:q1, None])      # (R, c, 1)
        sums["same"] += same.sum((1, 2)).double()
        smax, s2 = _logit_sums(s, m, q0 if state.causal else k1 - 1)
        sums["smax"] = torch.maximum(sums["smax"], smax)
        sums["s2"] += s2
        lo, hi = max(q0, q0c), min(q1, q1c)
        if lo < hi:          # the recorded crop, every run (D1 top singular value, D10 JS drift)
            crop_attn.append(_key_crop(a[:, lo - q0:hi - q0], k0c, k1c, 0.0))
            crop_compat.append(_key_crop(b[:, lo - q0:hi - q0], k0c, k1c, 0.0))
        if arrays is not None:
            arrays.add(q0, q1, m, w)
    ent, ent_n = torch.cat(ent, 1), torch.cat(ent_n, 1)
    crop_attn, crop_compat = torch.cat(crop_attn, 1), torch.cat(crop_compat, 1)
    value_norm = state.values.norm(dim=-1)
    diag = _diagnostics(state, sums, usage, ent, ent_n, value_norm, crop_attn, crop_compat, H_bayes, h_min,
                        prev_crop_attn)
    resid = routing_residual(state, q0c, q1c)
    diag["diag_routing_residual"] = resid       # also stored as the routing_residual array
    per_run = [] if arrays is None else _per_run(state, arrays, {"attn": crop_attn, "compat": crop_compat}, sums,
                                                 usage, ent, ent_n, value_norm, resid)
    return per_run, diag, crop_attn


@contextlib.contextmanager
def _executor_of(state, workers: int):
    """The engine's idle worker threads when it has enough (no new threads, no new malloc arenas),
    else an executor for this call."""
    if state.executor is not None:      # step_record_threaded never asks for more workers than it has
        yield state.executor
        return
    with ThreadPoolExecutor(max_workers=workers) as own:
        yield own


def step_record_threaded(state, qcrop, kcrop, block, prev_sym, H_bayes, h_min, prev_crop_attn=None,
                         chunk: int = 256, recorded=None, workers: int = 2):
    """:func:`step_record` with the runs dealt to ``workers`` Python threads, each on one torch
    thread; results in the same layout and order.  Why: every diagnostic is per run, and (as in the
    training engine) one join per step keeps 2 cores busy where OpenMP's per-op barriers stall on a
    loaded machine (timings: docs/performance.md)."""
    R = state.upstream.shape[0]
    recorded = list(range(R)) if recorded is None else list(recorded)
    workers = max(1, min(workers, R, state.executor.n_workers if state.executor is not None else workers))
    if workers == 1:
        return step_record(state, qcrop, kcrop, block, prev_sym, H_bayes, h_min, prev_crop_attn, chunk, recorded)
    # deal recorded runs and the others round-robin, so every worker gets a similar share of both
    rec_set = set(recorded)
    order = recorded + [i for i in range(R) if i not in rec_set]
    groups = [sorted(order[w::workers]) for w in range(workers)]

    def one(g):
        gi = torch.as_tensor(g)
        prev = None if prev_crop_attn is None else prev_crop_attn[gi]
        local = [j for j, i in enumerate(g) if i in rec_set]
        return step_record(state.select(g), qcrop, kcrop, block, prev_sym[gi], H_bayes[gi], h_min, prev,
                           chunk, local)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _executor_of(state, workers) as executor:
            parts = list(executor.map(one, groups))
    finally:
        torch.set_num_threads(threads)
    arrays, diag, attn_w = {}, {}, None
    for g, (per_run, d, w) in zip(groups, parts):
        gi = torch.as_tensor(g)
        arrays.update(zip([i for i in g if i in rec_set], per_run))
        for k, v in d.items():
            diag.setdefault(k, torch.empty(R, dtype=v.dtype))[gi] = v
        attn_w = w.new_empty((R,) + w.shape[1:]) if attn_w is None else attn_w
        attn_w[gi] = w
    return [arrays[i] for i in recorded], diag, attn_w


def _per_run(state, arrays: _Arrays, every_run_crops: dict, sums, usage, ent, ent_n, value_norm,
             resid) -> list[dict]:
    """One dict per recorded run in the (layer=1, head=1, seq=1, ...) layout of record.names."""
    W = {n: torch.cat(v, 1) for n, v in arrays.crop.items()}
    P = {n: torch.cat(v, 1) for n, v in arrays.pooled.items() if v}      # NaN for fully masked blocks
    dQ = torch.cat(arrays.dQ, 1)
    out = []
    for j, r in enumerate(arrays.idx.tolist()):
        def one(t, i=r):
            return t[i][None, None, None]                                 # → (1, 1, 1, ...)
        rec = {n: one(W[n], j) if n in W else one(every_run_crops[n]) for n in MATRIX_NAMES}
        rec.update({f"{n}_pooled": one(t, j) for n, t in P.items()})
        rec.update(upstream=one(state.upstream), values=one(state.values), queries=one(state.queries),
                   keys=one(state.keys), value_grad=one(arrays.dV, j), query_grad=one(dQ, j),
                   key_grad=one(arrays.dK, j), expected_compat=one(state.expected_compat),
                   attn_entropy=one(ent), attn_entropy_norm=one(ent_n), column_usage=one(usage),
                   value_norm=one(value_norm),
                   logit_max=sums["smax"][r].view(1, 1).float(),
                   logit_norm=torch.sqrt(sums["s2"][r] / sums["cnt"][r]).view(1, 1).float(),
                   routing_residual=resid[r].view(1, 1).float())
        out.append(rec)
    return out


def _top_singular_value(B: torch.Tensor) -> torch.Tensor:
    """σ_max of each (R, w, w') matrix as √λ_max(B Bᵀ): a symmetric eigensolve, several times
    cheaper than the SVD behind ``matrix_norm(ord=2)`` (and never stuck in LAPACK's threads)."""
    G = B @ B.transpose(1, 2) if B.shape[1] <= B.shape[2] else B.transpose(1, 2) @ B
    return torch.linalg.eigvalsh(G)[:, -1].clamp_min(0).sqrt()


def _diagnostics(state, sums, usage, ent, ent_n, value_norm, crop_attn, crop_compat, H_bayes, h_min,
                 prev_attn) -> dict:
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
    P = state.probs.double()
    H_pred = -(P * torch.log(P + 1e-10)).sum(-1).mean(-1)
    diag = {
        "diag_b_mean": mean_b, "diag_b_std": torch.sqrt((sums["b2"] / sums["cnt"] - mean_b ** 2).clamp_min(0)),
        "diag_neg_b_mass": sums["neg"] / N,
        "diag_b_sv1": _top_singular_value(crop_compat.double()),
        "diag_routing_drive": sums["drive"] / N,
        "diag_eff_columns": torch.exp(-(c * torch.log(c.clamp_min(1e-300))).sum(-1)),
        "diag_max_usage": usage.double().amax(-1) / N, "diag_dead_values": (usage < 1e-3).sum(-1).double(),
        "diag_value_norm": value_norm.double().mean(-1),
        "diag_attn_entropy": ent.double().mean(-1), "diag_attn_entropy_norm": ent_n.double().mean(-1),
        **_pca_stats(state.head_out, H_bayes),
        "diag_key_orthogonality": off,
        "diag_same_symbol_mass": sums["same"] / N,
        "diag_grad_norm_qk": torch.sqrt(sq["qk"]), "diag_grad_norm_v": g["W_V"], "diag_grad_norm_o": g["W_O"],
        "diag_share_qk": sq["qk"] / total, "diag_share_v": sq["v"] / total, "diag_share_o": sq["o"] / total,
        "diag_js_drift": (_js(crop_attn.double(), prev_attn.double()).mean(-1) if prev_attn is not None
                          else torch.full((R,), float("nan"), dtype=torch.float64)),
        "diag_entropy_gap": H_pred - h_min, "diag_excess_loss": state.loss.double() - h_min,
    }
    return diag
