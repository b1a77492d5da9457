"""The fused Triton attention (dyntool.kernels) against float64, under the interpreter.

Per case: out, dq, dk, dv (and the sinks' gradient) equal float64 autograd to ≤ 1e-5 relative
(‖x − ref‖ / ‖ref‖), and every cheap-tier statistic the kernel writes equals
``flight.full_tier_reduction`` of the float64 full tier to ≤ 1e-5 relative, at trained-size
logits (max |τ q·k| ≥ 20).  Sizes are tiny (the interpreter runs each program in numpy) but
cover partial blocks (T not a multiple of 16), several key and query blocks, and padded head dims."""
from __future__ import annotations

import math

import pytest
import torch

from dyntool.cheap_stats import Sums
from dyntool.kernels import op
from dyntool.kernels import stats as kstats

from . import reference as ref
from .cases import CASES, make

TOL = 1e-5
MEASURED: dict[str, dict[str, float]] = {}       # case -> {quantity: relative error}, printed with -s


def rel(x, r):
    x, r = x.detach().double(), r.detach().double()
    if float(r.norm()) == 0.0:
        return float(x.norm())
    return float((x - r).norm() / r.norm())


def run_kernel(q, k, v, do, kw, slopes, sinks, stats=True, dq=None):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    sk = None if sinks is None else sinks.clone().requires_grad_()
    token = torch.zeros(op.bwd_stats_size(q, k), requires_grad=True) if stats else None
    out, lse, fst = op.attention(*leaves, alibi_slopes=slopes, sinks=sk, token=token, stats=stats, dq=dq, **kw)
    out.backward(do)
    return out.detach(), [t.grad for t in leaves], (None if sk is None else sk.grad), fst, token


def reference(q, k, v, do, kw, slopes, sinks):
    B, H, T, D = q.shape
    Tk = k.shape[2]
    allowed = ref.allowed_of(B, T, Tk, kw["causal"], kw["window"], kw["key_lengths"], kw["padding_side"],
                             kw["key_mask"])
    bias = None if slopes is None else ref.alibi_bias(slopes, T, Tk)
    args = (allowed, 1 / math.sqrt(D), kw["softcap"], bias, sinks)
    return ref.grads(q, k, v, do, *args), ref.statistics(q, k, v, do, *args)


@pytest.mark.parametrize("policy", op.DQ_POLICIES)
@pytest.mark.parametrize("name", list(CASES))
def test_fused_equals_float64(name, policy):
    check_case(name, policy)


def check_case(name, policy=None):
    """One case under a dQ policy (``op.dq_policy``; None: the process default, as the tiles
    test's subprocess sets it)."""
    q, k, v, do, kw, slopes, sinks = make(CASES[name])
    out, (dq, dk, dv), dsink, fst, token = run_kernel(q, k, v, do, kw, slopes, sinks, dq=policy)
    (r_out, r_dq, r_dk, r_dv, r_dsink), r_stats = reference(q, k, v, do, kw, slopes, sinks)
    assert float(r_stats["logit_max"].max()) >= 20.0          # trained-size logits
    errs = {"out": rel(out, r_out), "dq": rel(dq, r_dq), "dk": rel(dk, r_dk), "dv": rel(dv, r_dv)}
    if sinks is not None:
        errs["dsink"] = rel(dsink, r_dsink)
    sums = Sums(q.shape[1], torch.float64, q.device)
    kstats.add_to(sums, kstats.head_sums(fst, token.grad), q.shape[0], q.shape[2], has_sinks=sinks is not None)
    mine = sums.finish()
    assert set(mine) == set(r_stats)
    for n, r in r_stats.items():
        assert torch.isfinite(r).all(), n
        errs[n] = rel(mine[n], r)
    MEASURED[f"{name}/{policy}"] = errs
    bad = {n: e for n, e in errs.items() if not e <= TOL}
    assert not bad, f"{name}: relative errors above {TOL}: {bad}"


def test_statistics_off_changes_nothing_and_empty_rows_are_zero():
    """stats=False gives the same output and gradients bit for bit; a row with no visible key
    outputs 0 and gets no gradient (SDPA's semantics, as the eager path)."""
    q, k, v, do, kw, slopes, sinks = make(CASES["left_pad_lengths_gqa"], seed=3)
    on = run_kernel(q, k, v, do, kw, slopes, sinks, stats=True)
    off = run_kernel(q, k, v, do, kw, slopes, sinks, stats=False)
    assert torch.equal(on[0], off[0])
    for a, b in zip(on[1], off[1]):
        assert torch.equal(a, b)
    empty = slice(0, 18 - 7)                                  # sequence 1: causal + 11 left pads
    assert on[0][1, :, empty].abs().max() == 0
    assert on[1][0][1, :, empty].abs().max() == 0


def test_deterministic():
    small = dict(CASES["everything"], shape=(1, 2, 1, 17, 17, 32), key_lengths=[12])
    q, k, v, do, kw, slopes, sinks = make(small, seed=5)
    a = run_kernel(q, k, v, do, kw, slopes, sinks)
    b = run_kernel(q, k, v, do, kw, slopes, sinks)
    assert torch.equal(a[3], b[3]) and torch.equal(a[4].grad, b[4].grad)
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def test_atomic_dq_changes_only_dq_and_the_score_sums_order():
    """The atomic policy computes the same out, dK, dV and column/forward statistics bit for bit
    (the same programs, the same order); dQ and the two score sums it moves into the dK/dV
    programs (var, ds2) are summed in another order, so they agree to rounding only."""
    q, k, v, do, kw, slopes, sinks = make(CASES["left_pad_lengths_gqa"], seed=4)
    s = run_kernel(q, k, v, do, kw, slopes, sinks, dq="split")
    a = run_kernel(q, k, v, do, kw, slopes, sinks, dq="atomic")
    assert torch.equal(s[0], a[0]) and torch.equal(s[3], a[3])
    assert torch.equal(s[1][1], a[1][1]) and torch.equal(s[1][2], a[1][2])
    assert rel(a[1][0], s[1][0]) < 1e-6 and a[1][0].dtype == q.dtype and a[1][0].stride() == s[1][0].stride()
    names = op.kstats.BACKWARD_SUMS
    gs, ga = s[4].grad.view(-1, len(names)), a[4].grad.view(-1, len(names))
    for i, n in enumerate(names):
        if n in ("var", "ds2"):
            assert rel(ga[:, i], gs[:, i]) < 1e-6, n
        else:
            assert torch.equal(ga[:, i], gs[:, i]), n


def test_float16_error_within_twice_sdpa():
    """float16 inputs, fp32 accumulation: the error against float64 is at most 2× torch SDPA's own
    float16 error on the same inputs (bfloat16 is checked on the GPU: the interpreter has none)."""
    import torch.nn.functional as F
    case = CASES["causal"]
    q, k, v, do, kw, slopes, sinks = make(case)
    r_out, r_dq, r_dk, r_dv, _ = ref.grads(q, k, v, do, ref.allowed_of(2, 20, 20, True), 1 / math.sqrt(32))
    h = [t.half() for t in (q, k, v, do)]
    out, (dq, dk, dv), *_ = run_kernel(*h, kw, slopes, sinks, stats=False)
    leaves = [t.clone().requires_grad_() for t in h[:3]]
    s_out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    s_out.backward(h[3])
    for mine, sdpa, r in ((out, s_out, r_out), (dq, leaves[0].grad, r_dq), (dk, leaves[1].grad, r_dk),
                          (dv, leaves[2].grad, r_dv)):
        assert mine.dtype == torch.float16
        assert rel(mine, r) <= 2 * rel(sdpa, r), (rel(mine, r), rel(sdpa, r))


def test_compiled_fullgraph_equals_eager():
    """torch.compile(fullgraph=True) over forward + backward with statistics (aot_eager on the CPU,
    where the op is opaque; on a GPU tracing goes through triton_op/wrap_triton: tests/gpu's)."""
    small = dict(CASES["window_per_head_ls"], shape=(1, 2, 1, 20, 20, 32), window=[5, 0])
    q, k, v, do, kw, slopes, sinks = make(small, seed=2)

    def step(q, k, v, token):
        out, _, fst = op.attention(q, k, v, token=token, stats=True, **kw)
        return out, fst
    got = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        token = torch.zeros(op.bwd_stats_size(q, k), requires_grad=True)
        out, fst = fn(*leaves, token)
        out.backward(do)
        got.append([out, fst, token.grad] + [t.grad for t in leaves])
    for a, b in zip(*got):
        assert torch.equal(a, b)


def test_bad_arguments_are_refused():
    q, k, v, *_ = make(CASES["causal"])
    with pytest.raises(ValueError, match="multiple of"):
        op.attention(q[:, :1].expand(-1, 3, -1, -1).contiguous(), k, v)
    with pytest.raises(ValueError, match="padding_side"):
        op.attention(q, k, v, key_lengths=[3, 4], padding_side="middle")
    with pytest.raises(ValueError, match="key_lengths"):
        op.attention(q, k, v, key_lengths=[3, 4, 5])
    with pytest.raises(ValueError, match="window has 3 entries"):
        op.attention(q, k, v, window=[1, 2, 3])
    with pytest.raises(ValueError, match="no bfloat16"):
        op.attention(*(t.bfloat16() for t in (q, k, v)))


def teardown_module(module):
    for name, errs in MEASURED.items():
        print(f"\n{name}: " + " ".join(f"{n}={e:.1e}" for n, e in errs.items()))
