"""The dataflow adapter without q and k (an unseen score producer: α, B, ∂L/∂S, U, dV exact, dQ/dK
NaN), the einsum forms it follows, its refusal of NaN attention, and the cheap tier's backward
through the tracer (host reads, nothing kept)."""
import pytest
import torch

from dyntool.capture import Capture, CaptureError

from . import dataflow_reference as R
from .dataflow_models import batch, nano, nano_truth

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("padding", ["right", "left"])
def test_unseen_score_producer_records_all_but_dq_dk(padding):
    """Scores from no product dyntool sees (an elementwise q·k sum, as a fused kernel would give):
    α, B, advantages, ∂L/∂S, U and dV equal float64 autograd; dQ, dK and the τ q·k statistics are
    NaN and the record says why (the issue's "said unavailable")."""
    x, pad = batch(padding=padding)
    cap = nano_truth(nano(unseen=True), x, pad)
    assert cap.attrs["qk_grads"] == "unavailable" and "no matmul" in cap.attrs["qk_unavailable"]
    got = cap.compute()
    for name in ("queries", "keys", "query_grad", "key_grad", "logit_max", "logit_norm"):
        assert bool(got[name].isnan().all()), name
    assert not bool(got["attn"].isnan().any()) and not bool(got["value_grad"].isnan().any())


def test_unseen_score_producer_refused_by_a_recorder_that_needs_qk():
    """The cheap tier (FlightRecorder) computes its statistics from q and k: refused in one line."""
    from dyntool.adapters import AdapterError
    from dyntool.flight import FlightRecorder
    m = nano(unseen=True)
    x, pad = batch()
    with pytest.raises(AdapterError, match="q and k are unknown, and this recorder needs q and k; refused") as e:
        with FlightRecorder(m):
            m(x, pad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("eq,xs,ys", [("ibnd,jbnd->bnij", (5, 2, 3, 4), (6, 2, 3, 4)),     # XLNet's scores
                                      ("bnij,jbnd->ibnd", (2, 3, 5, 6), (6, 2, 3, 4)),     # XLNet's α·V
                                      ("bnij,bjnd->bind", (2, 3, 5, 6), (2, 6, 3, 4)),     # Funnel's α·V
                                      ("bhid,bjhd->bhij", (2, 3, 5, 4), (2, 6, 3, 4))])
def test_einsum_forms_are_the_matmul_of_permuted_views(eq, xs, ys):
    from dyntool.adapters.dataflow_trace import _einsum_as_matmul
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(xs, generator=g, dtype=torch.float64), torch.randn(ys, generator=g, dtype=torch.float64)
    follows = {id(x): None} if eq.split(",")[0].endswith("ij") else {}        # α·V: x is a follower of α
    a, b, perm = _einsum_as_matmul((eq, x, y), {}, follows)
    got = a @ b if perm is None else (a @ b).permute(perm)
    torch.testing.assert_close(got, torch.einsum(eq, x, y), rtol=1e-14, atol=1e-14)
    assert a.data_ptr() == x.data_ptr() and b.data_ptr() == y.data_ptr()       # views: the same tensors


def test_einsum_reordered_scores_are_not_followed():
    """Scores coming out in another layout than (batch…, i, j) would not match S: left unfollowed."""
    from dyntool.adapters.dataflow_trace import _einsum_as_matmul
    x, y = torch.randn(5, 2, 3, 4), torch.randn(6, 2, 3, 4)
    assert _einsum_as_matmul(("ibnd,jbnd->ijbn", x, y), {}, {}) is None


def test_cheap_tier_backward_reads_the_host_once_per_layer():
    """The cheap tier (FlightRecorder) through the tracer on a step that is not a check step: its
    statistics are reduced in the U hook during backward, and nothing is kept after.  The hook
    path's only host read is cheap_stats.key_ends' one ``.tolist()`` per layer (the key extent of
    each row block); no other .item(), .tolist(), .cpu(), .numpy(), float()/int()/bool() of a
    tensor runs there (a new one fails here)."""
    from dyntool.flight import FlightRecorder
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(R.FAMILIES["bloom"][1]()).eval()
    x = torch.randint(3, R.V, (2, 8), generator=torch.Generator().manual_seed(2))
    rec = FlightRecorder(model)
    syncs: list[str] = []
    names = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")
    real = {n: getattr(torch.Tensor, n) for n in names}

    def spy(n):
        def f(self, *a, **kw):
            syncs.append(n)
            return real[n](self, *a, **kw)
        return f
    for step in range(2):                        # step 0 runs the backward check (it compares: syncs)
        with rec:
            loss = model(input_ids=x, labels=x).loss
            if step == 1:
                assert not rec.adapter._checks
                for n in names:
                    setattr(torch.Tensor, n, spy(n))
            try:
                loss.backward()
            finally:
                for n in names:
                    setattr(torch.Tensor, n, real[n])
        assert rec._pending == 0                 # every site reduced in its U hook, references dropped
        stats = rec.result()
        rec.reset()
    assert syncs == ["tolist"] * len(rec.sites), syncs
    assert bool(torch.isfinite(stats["logit_max"]).all())


def test_nan_attention_weights_are_refused_saying_so():
    """A model whose own α is NaN (Canine's tiny default config in the scan) is refused saying its
    scores are not finite, in one line (was: "α weighs no key")."""
    m = nano(n_layer=1)
    with torch.no_grad():
        m.blocks[0].attn.c_attn.weight.fill_(float("nan"))
    x, pad = batch()
    with pytest.raises(CaptureError, match="not finite") as e:
        with Capture(m):
            m(x, pad).sum().backward()
    assert "\n" not in str(e.value)
