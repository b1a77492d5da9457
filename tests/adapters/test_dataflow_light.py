"""The dataflow adapter between its check steps: the cheap tier takes the model's own α, τ q kᵀ and S
and reads nothing on the host (issue 47: "no host sync"), with the statistics of the checked path."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dyntool import cheap_stats
from dyntool.adapters import dataflow as D
from dyntool.flight import FlightRecorder

from . import dataflow_reference as R
from .dataflow_models import batch, nano

transformers = pytest.importorskip("transformers")

SYNCS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__", "nonzero")


@pytest.fixture
def float64_default():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


@pytest.fixture
def light_calls(monkeypatch):
    """How many forwards took the path between checks."""
    calls = []
    real = D.DataflowAdapter._observe_light
    monkeypatch.setattr(D.DataflowAdapter, "_observe_light", lambda self, *a: (calls.append(a[0]), real(self, *a))[1])
    return calls


def _steps(model, run, check_every, n=3, spy_step=None):
    """``n`` cheap-tier steps: the statistics of each, and the host reads of step ``spy_step``."""
    rec = FlightRecorder(model)
    rec.adapter.check_every = check_every
    out, reads, real = [], [], {name: getattr(torch.Tensor, name) for name in SYNCS}
    for step in range(n):
        if step == spy_step:
            for name in SYNCS:
                setattr(torch.Tensor, name, lambda self, *a, _n=name, **k: (reads.append(_n), real[_n](self, *a, **k))[1])
        try:
            with rec, R.float64_softmax():
                run(model, step).backward()
        finally:
            for name in SYNCS:
                setattr(torch.Tensor, name, real[name])
        out.append({k: v.clone() for k, v in rec.result().items()})
        rec.reset()
    return out, reads


def _hf(family, padding):
    model = R.make(family).eval()
    x = R.inputs(padding)
    return model, lambda m, step: m(**x).loss


# ALiBi (bloom), GQA with rotary (falcon_rope), rows with no visible key whose τ is not one number
# (openai, xglm under left padding: τ's median, as the check step takes it), float32 q·k (gpt_neo)
CASES = [("bloom", "left"), ("falcon_rope", "left"), ("openai", "left"), ("xglm", "left"), ("gpt_neo", "right"),
         ("mpt", "right")]


@pytest.mark.parametrize("family,padding", CASES)
def test_between_checks_nothing_is_read_on_the_host(family, padding, float64_default, monkeypatch, light_calls):
    """On a GPU (``cheap_stats.host_reads`` off) a step between checks reads nothing, forward and
    backward; a check step does (the counter can see reads)."""
    monkeypatch.setattr(cheap_stats, "host_reads", lambda device: False)
    model, run = _hf(family, padding)
    _, first = _steps(model, run, 100, n=1, spy_step=0)
    assert first, "a check step reads the host (τ, the forward check): the counter sees nothing"
    _, reads = _steps(model, run, 100, n=3, spy_step=2)
    assert len(light_calls) == 2 * 2                      # two layers on steps 1 and 2
    assert reads == [], reads


@pytest.mark.parametrize("family,padding", CASES)
def test_between_checks_the_statistics_are_the_checked_paths(family, padding, float64_default, light_calls):
    """Every cheap-tier statistic from the model's own α (between checks) equals the one recomputed
    from q, k and the recorded bias (every step checked), itself tested against float64 autograd."""
    model, run = _hf(family, padding)
    checked, _ = _steps(model, run, 1)
    assert not light_calls
    light, _ = _steps(model, run, 100)
    assert len(light_calls) == 2 * 2                      # two layers on steps 1 and 2
    tol = R.TOL.get(family, 1e-12)                        # float32 α or q·k in the model itself
    for a, b in zip(checked, light):
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=tol, atol=tol, equal_nan=True, msg=name)


class TemperedAttention(nn.Module):
    """Causal attention whose factor on q·kᵀ is a learned temperature (it moves every step)."""

    def __init__(self, d=16, n_head=2):
        super().__init__()
        self.n_head, self.qkv = n_head, nn.Linear(d, 3 * d)
        self.temp = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * self.temp                                   # (B, nh, T, T)
        att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)


def test_a_learned_temperature_is_taken_again_every_step(float64_default, light_calls):
    """τ moves between steps: logit_max between checks is the checked path's at every step."""
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Embedding(29, 16), TemperedAttention(), nn.Linear(16, 29))
    x = torch.randint(0, 29, (2, 8), generator=torch.Generator().manual_seed(1))

    def run(m, step):
        with torch.no_grad():
            m[1].temp.fill_(1.5 + step)
        return F.cross_entropy(m(x).flatten(0, 1), x.flatten())
    checked, _ = _steps(make(), run, 1)
    light, _ = _steps(make(), run, 100)
    assert len(light_calls) == 2
    assert checked[2]["logit_max"].max() > checked[0]["logit_max"].max() * 1.5      # it did move
    for a, b in zip(checked, light):
        torch.testing.assert_close(b["logit_max"], a["logit_max"], rtol=1e-12, atol=1e-12)


def test_a_changed_forward_is_checked_again(light_calls):
    """Another sequence length, or attention dropout switched on after a check step, is not the
    computation the check step passed: it runs the checks (dropout is refused with its residual)."""
    m = nano(dropout=0.5, T=8).eval()
    x, pad = batch(T=8)
    rec = FlightRecorder(m)
    rec.adapter.check_every = 100
    for T in (8, 8, 6):
        with rec:
            m(x[:, :T], pad[:, :T]).square().sum().backward()
        rec.reset()
    assert len(light_calls) == 2                          # step 1's two layers; T = 6 was checked
    m.train()
    with pytest.raises(Exception, match=r"dropout p=0.5 is on") as e:
        with rec:
            m(x, pad).square().sum().backward()
    assert "\n" not in str(e.value)
