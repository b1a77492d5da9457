"""FlightRecorder(kernel="fused") on dyntool's GPT, under the interpreter: the kernel computes the
attention and its statistics; they equal the eager path's on the float64 copy of the same model
and batch (an independent computation) to ≤ 1e-5 relative, and so do the model's gradients."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from dyntool.flight import STATS, FlightError, FlightRecorder
from dyntool.train.config import ModelConfig
from dyntool.train.gpt import GPT

V, T = 40, 20           # T = 20: two query blocks of 16, the second partial


def gpt(attention="mhsa", **kw):
    torch.manual_seed(0)
    m = GPT(ModelConfig(attention=attention, n_layer=2, n_head=2, n_embd=32, **kw), V, T)
    with torch.no_grad():                  # trained-size logits
        for blk in m.h:
            blk.attn.c_attn.weight[:64] *= 20.0
            if blk.attn.q_norm is not None:
                blk.attn.q_norm.weight *= 3.5
                blk.attn.k_norm.weight *= 3.5
    return m


def step(model, kernel, grad_scale=1.0, seqs=None):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, V, (3, T), generator=g), torch.randint(0, V, (3, T), generator=g)
    flight = FlightRecorder(model, kernel=kernel, grad_scale=grad_scale, seqs=seqs)
    with flight:
        (model(x, y)[1] * grad_scale).backward()
    return flight, flight.result(), {n: p.grad.clone() for n, p in model.named_parameters()}


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def flat(grads: dict) -> torch.Tensor:
    """All parameters' gradients as one float64 vector, in name order."""
    return torch.cat([grads[n].flatten().double() for n in sorted(grads)])


@pytest.mark.parametrize("attention,kw", [("mhsa", {}), ("ls", dict(n_local=1, n_global=1, window=6)),
                                          ("qknorm", {})])
def test_fused_step_equals_eager(attention, kw):
    m = gpt(attention, **kw)
    m64 = copy.deepcopy(m).double()
    flight, fused, g_fused = step(m, "fused", grad_scale=0.5, seqs=2)
    assert set(flight.paths().values()) == {"fused"}
    eager_flight, eager, g_eager = step(m64, "eager", grad_scale=0.5, seqs=2)
    assert all(p.startswith("eager: ") for p in eager_flight.paths().values())
    assert float(eager["logit_max"].max()) > 20.0
    assert set(fused) == set(eager) == {n for n in STATS if n != "sink_mass"}
    for n in STATS:
        if n in eager:
            assert rel(fused[n], eager[n]) <= 1e-5, (n, rel(fused[n], eager[n]))
    # all parameters as one vector (k_norm.bias's true gradient is 0: a row-constant score shift)
    assert rel(flat(g_fused), flat(g_eager)) <= 1e-5


def test_fused_refuses_in_one_line_and_auto_says_why():
    m = gpt("span")
    with pytest.raises(FlightError, match=r"^record.kernel=fused: L0: span keeps its own backward$"):
        FlightRecorder(m, kernel="fused")
    with pytest.raises(FlightError, match="record.kernel must be one of auto, eager, fused"):
        FlightRecorder(m, kernel="fast")
    paths = FlightRecorder(gpt(), kernel="auto").paths()
    assert paths == {"L0": "eager: auto picks the kernel on CUDA only (device cpu)",
                     "L1": "eager: auto picks the kernel on CUDA only (device cpu)"}
    with pytest.raises(FlightError, match="float64 model"):
        FlightRecorder(gpt().double(), kernel="fused")


def test_no_backward_is_reported_and_eval_forward_untouched():
    m = gpt()
    flight = FlightRecorder(m, kernel="fused")
    x = torch.randint(0, V, (2, T))
    with flight:
        with torch.no_grad():
            m(x)                                  # no grad: the model's own attention, nothing kept
        m(x)                                      # a forward whose backward never comes
    assert all(c.fused_fn is None for c in (b.attn.core for b in m.h))
    with pytest.raises(FlightError, match="2 attention output"):
        flight.result()


def test_auto_falls_back_to_eager_when_the_kernel_fails(monkeypatch):
    """kernel="auto" (fused where it serves) never fails a step for the kernel: a site whose launch
    raises goes back to the eager path with a warning and says so in paths(); "fused" raises."""
    from dyntool.kernels import op
    m = gpt()
    x, y = torch.randint(0, V, (2, T)), torch.randint(0, V, (2, T))
    eager = FlightRecorder(m, kernel="eager")
    with eager:
        m(x, y)[1].backward()
    want = eager.result()
    m.zero_grad()

    def broken(*a, **kw):
        raise RuntimeError("no kernel today")
    monkeypatch.setattr(op, "attention", broken)
    flight = FlightRecorder(m, kernel="fused")
    with pytest.raises(RuntimeError, match="no kernel today"), flight:
        m(x, y)[1].backward()
    flight = FlightRecorder(m, kernel="fused")
    for fs in flight._fused.values():                # what kernel="auto" builds on a GPU
        fs.fallback = True
    with pytest.warns(RuntimeWarning, match="fused kernel failed"), flight:
        m(x, y)[1].backward()
    got = flight.result()
    assert set(flight.paths().values()) == {"eager: the fused kernel failed (RuntimeError: no kernel today)"}
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=0, atol=0)


def test_compiled_step_equals_eager_step():
    """A ``torch.compile(fullgraph=True)``d step (aot_eager here: the interpreter's launches run
    as they are) after ``prepare``: the same statistics, logit maxima and gradients, bit for bit,
    as the eager step; micro-steps add up the same way."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, V, (3, T), generator=g), torch.randint(0, V, (3, T), generator=g)
    got = {}
    for mode in ("eager", "compiled"):
        m = gpt("ls")                                      # local + global heads: two windows
        flight = FlightRecorder(m, kernel="fused")
        flight.prepare(3, T)
        net = m if mode == "eager" else torch.compile(m, fullgraph=True, backend="aot_eager")
        for _ in range(2):
            with flight:
                net(x, y)[1].backward()
        res = flight.result()
        with flight.logits():
            net(x, y)
        got[mode] = (res, flight.logit_max(), {n: p.grad.clone() for n, p in m.named_parameters()})
    torch._dynamo.reset()
    (ra, la, ga), (rb, lb, gb) = got["eager"], got["compiled"]
    assert ra.keys() == rb.keys() and len(ra) >= 10 and set(ra) <= set(STATS)
    for n in ra:
        assert torch.equal(ra[n], rb[n]), n
    assert torch.equal(la, lb) and torch.equal(la, ra["logit_max"])    # one forward's max = the step's
    for n in ga:
        assert torch.equal(ga[n], gb[n]), n


def test_compiled_step_refusals():
    """Compiled recording needs every site on the kernel (span: eager) and one forward per ``with``."""
    with pytest.raises(FlightError, match="fused kernel of dyntool's attention only; not on L0"):
        FlightRecorder(gpt("span"), kernel="auto").prepare(3, T)
    m = gpt()
    flight = FlightRecorder(m, kernel="fused")
    flight.prepare(3, T)
    x = torch.randint(0, V, (3, T))
    net = torch.compile(m, fullgraph=True, backend="aot_eager")
    with flight:
        (net(x, x)[1] + net(x, x)[1]).backward()
    torch._dynamo.reset()
    with pytest.raises(FlightError, match="two forwards of one site"):
        flight.result()


@contextlib.contextmanager
def input_dtypes(seen: list):
    """Append the (q, k, v) dtypes of every fused-kernel call inside the block to ``seen``."""
    from dyntool.kernels import op
    real = op.attention

    def spy(q, k, v, **kw):
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, **kw)
    op.attention = spy
    try:
        yield seen
    finally:
        op.attention = real


class Float32Out(torch.nn.Module):
    """A LayerNorm whose output stays float32 under autocast, as CUDA autocast runs it (CPU
    autocast keeps the input dtype, so the CPU alone would never show the mix)."""

    def __init__(self, ln):
        super().__init__()
        self.ln = ln

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            return self.ln(x.float())


def test_qknorm_under_autocast_takes_the_autocast_dtype():
    """qknorm's float32 q, k beside a half v under autocast (the GPU's qknorm preset failed on it in
    the kernel's tl.dot): the site casts them to the autocast dtype as SDPA does, so the fused step,
    eager and compiled, gives the model's own half-precision attention's loss and gradients; the
    kernel itself refuses mixed dtypes in one line."""
    from dyntool.kernels import op
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, V, (3, T), generator=g), torch.randint(0, V, (3, T), generator=g)
    got, seen = {}, {}
    for mode in ("own", "fused", "compiled"):
        m = gpt("qknorm")
        for blk in m.h:
            blk.attn.q_norm, blk.attn.k_norm = Float32Out(blk.attn.q_norm), Float32Out(blk.attn.k_norm)
        flight = FlightRecorder(m, kernel="eager" if mode == "own" else "fused")
        if mode == "compiled":
            flight.prepare(3, T)
        net = torch.compile(m, fullgraph=True, backend="aot_eager") if mode == "compiled" else m
        with flight, input_dtypes(seen.setdefault(mode, [])):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = net(x, y)[1]
            loss.backward()
        assert set(flight.paths().values()) == ({"fused"} if mode != "own" else {"eager: record.kernel=eager"})
        got[mode] = (loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}, flight.result())
    torch._dynamo.reset()
    assert seen["own"] == [] and seen["fused"] == seen["compiled"] == [(torch.float16,) * 3] * 2
    own_loss, own_grads, own_stats = got["own"]
    for mode in ("fused", "compiled"):
        loss, grads, stats = got[mode]
        assert rel(loss, own_loss) <= 1e-3, mode                   # half precision on both sides
        assert rel(flat(grads), flat(own_grads)) <= 2e-2, mode
        assert rel(stats["logit_max"], own_stats["logit_max"]) <= 1e-2, mode
    for n in got["fused"][1]:                                      # compiled = eager, bit for bit
        assert torch.equal(got["fused"][1][n], got["compiled"][1][n]), n
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(ValueError, match="^fused attention: q, k, v in one dtype, got torch.float32, "
                                         "torch.float32, torch.float16$"):
        op.attention(q, q, q.half())


def test_reading_a_recorded_step_costs_a_fixed_handful_of_ops():
    """Issue 45: the fused sites' statistics reach a metrics row in a few device ops whatever the
    number of layers (the per-site path ran ~1,125 at 12 layers × 12 heads), and none reads the
    host: ``metrics_later`` leaves the values on the device until ``get``.  (bench/step_ops.py, the
    census's count; the second step is counted: the divisors are made once, on the first.)"""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from step_ops import step_ops

    counts = []
    for n_layer in (2, 5):
        ops, reads, pending = step_ops(n_layer, 2, T)
        assert len(ops) <= 20, ops
        assert reads == [] and not any("_local_scalar_dense" in o for o in ops), ops          # no host read
        counts.append(len(ops))
        row = pending.get()
        assert len(row) == n_layer * 2 * len([n for n in STATS if n != "sink_mass"])
        assert all(v == v for v in row.values())                                  # finite, not NaN
    assert counts[0] == counts[1], counts
