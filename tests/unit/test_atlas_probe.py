"""The atlas probe on a real (tiny) GPT against autograd in float64: the manual backend's scores
``S`` and values ``V`` with their gradients from ``loss.backward()``, independently of the probe's
U-based formulas; and the probe leaves the training state alone."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dyntool.observe import Observer
from dyntool.record import metric_names as mn
from dyntool.train.atlas_probe import AtlasProbe, AtlasSettings, repeated_batch
from dyntool.train.config import ModelConfig, TrainConfig
from dyntool.train.gpt import GPT

T, V = 12, 50


class _Corpus:
    vocab_size = V

    def split(self, name):
        return np.random.default_rng({"train": 0, "valid": 1, "test": 2}[name]).integers(0, V, 4000).astype(np.int32)


def _probe(attention="mhsa", T=T):
    torch.manual_seed(0)
    cfg = TrainConfig()
    cfg.data.block_size = T
    mc = ModelConfig(attention=attention, n_layer=2, n_head=2, n_embd=8, backend="manual", init_std=0.5)
    model = GPT(mc, V, T).double().train()
    tr = SimpleNamespace(raw=model, cfg=cfg, corpus=_Corpus(), device=torch.device("cpu"))
    p = AtlasProbe(AtlasSettings(probe_seqs=3, rep_seqs=2, rep_vocab=30))
    p.on_train_start(tr)
    return p, model


class _Scores(Observer):
    def __init__(self):
        self.s, self.v = [], []

    def observe(self, site, q, k, v, out, allowed, scale, heads_dim=1, grads="standard", scores=None, **m):
        scores.retain_grad()
        v.retain_grad()
        self.s.append(scores)
        self.v.append(v)


def _autograd(model, x, y):
    obs = _Scores()
    for blk in model.h:
        blk.attn.core.attach(obs)
    model.eval()
    logits, _ = model(x)
    n = y.shape[1]
    F.cross_entropy(logits[:, :n].reshape(-1, V), y.reshape(-1)).backward()
    for blk in model.h:
        blk.attn.core.detach(obs)
    model.zero_grad(set_to_none=True)
    return [(torch.softmax(s.detach(), -1), s.grad.nan_to_num(0.0), v.grad) for s, v in zip(obs.s, obs.v)]


@pytest.mark.parametrize("attention, T", [("mhsa", T), ("qknorm", T), ("mhsa", T + 1)])
def test_probe_scores_match_autograd_float64(attention, T):
    """Both batches run as one pass (an odd T pads the repeats): each scored against its own batch's
    autograd, as if it ran alone."""
    p, model = _probe(attention, T)
    got = p.measure()
    assert model.training and all(q.grad is None for q in model.parameters())    # training state untouched
    x, y = p.wiki
    for l, (a, ds, dv) in enumerate(_autograd(model, x, y)):
        for h in range(2):
            adv0 = (-ds[:, h, 1:, 0] / a[:, h, 1:, 0]).mean()
            assert got[mn.head("atlas_first_mass", l, h)] == pytest.approx(a[:, h, :, 0].mean().item(), rel=1e-9)
            assert got[mn.head("atlas_first_adv", l, h)] == pytest.approx(adv0.item(), rel=1e-6, abs=1e-12)
            assert got[mn.head("atlas_first_ds_share", l, h)] == pytest.approx(
                (ds[:, h, 1:, 0].norm() / ds[:, h].norm()).item(), rel=1e-9)
            assert got[mn.head("atlas_first_value_grad", l, h)] == pytest.approx(
                dv[:, h, 0].pow(2).sum(-1).mean().sqrt().item(), rel=1e-9)
            prev = torch.stack([a[:, h, i, i - 1] for i in range(1, T)]).mean()
            assert got[mn.head("atlas_prev_token", l, h)] == pytest.approx(prev.item(), rel=1e-9)
    L = T // 2
    r = p.rep
    assert torch.equal(r[:, :L], r[:, L:])
    for l, (a, ds, _) in enumerate(_autograd(model, r, r[:, 1:])):
        for h in range(2):
            ind = torch.stack([a[:, h, i, i - L + 1] for i in range(L, 2 * L)]).mean()
            cadv = torch.stack([-ds[:, h, i, i - L + 1] / a[:, h, i, i - L + 1] for i in range(L, 2 * L)]).mean()
            assert got[mn.head("atlas_induction", l, h)] == pytest.approx(ind.item(), rel=1e-9)
            assert got[mn.head("atlas_copy_adv", l, h)] == pytest.approx(cadv.item(), rel=1e-6, abs=1e-12)
    with torch.no_grad():                       # the losses of each batch alone
        model.eval()
        lw = F.cross_entropy(model(x)[0].transpose(1, 2), y, reduction="none")
        lr = F.cross_entropy(model(r)[0][:, :-1].transpose(1, 2), r[:, 1:], reduction="none")
        model.train()
    assert got["atlas_probe_loss"] == pytest.approx(lw.mean().item(), rel=1e-12)
    assert got["atlas_rep_gap"] == pytest.approx((lr[:, L - 1:].mean() - lr[:, :L - 1].mean()).item(), rel=1e-12)
    fm = np.array([[got[mn.head("atlas_first_mass", l, h)] for h in range(2)] for l in range(2)])
    assert got["atlas_sink_gu"] == pytest.approx(float((fm > 0.3).mean()))


def test_repeated_batch_draws_distinct_frequent_tokens_reproducibly():
    train = np.repeat(np.arange(10), np.arange(10, 0, -1))        # token t occurs 10 − t times
    a = repeated_batch(train, 12, 3, 4, top=6, seed=5)
    assert a.shape == (3, 8) and torch.equal(a, repeated_batch(train, 12, 3, 4, top=6, seed=5))
    assert int(a.max()) < 6                                         # the 6 most frequent: 0..5
    assert all(len(set(row[:4].tolist())) == 4 for row in a)


def test_forward_only_probe_gives_the_same_scores_without_the_head():
    """The forward scores of the cheap schedule equal the full pass's, and that forward stops after
    the last layer's attention (the vocabulary head never runs) with no autograd graph."""
    p, model = _probe("mhsa", T + 1)
    full = p.measure(grad=True)
    calls = []
    hook = model.lm_head.register_forward_hook(lambda *a: calls.append(1))
    mlp = model.h[-1].mlp.register_forward_hook(lambda *a: calls.append(2))
    fwd = p.measure(grad=False)
    hook.remove(), mlp.remove()
    assert calls == [] and model.training
    names = {n.split("/")[0] for n in fwd}
    assert names == {"atlas_first_mass", "atlas_prev_token", "atlas_induction", "atlas_sink_gu", "atlas_sink_ours"}
    for k, v in fwd.items():
        assert v == pytest.approx(full[k], rel=1e-12, abs=1e-15), k


@pytest.mark.parametrize("every, grad_every, want", [
    (1, 16, ["grad"] + ["forward"] * 15 + ["grad", "forward"]),
    (4, 6, ["grad", None, None, None, "forward", None, "grad", None, "forward", None, None, None, "grad", None,
            None, None, "forward", None])])
def test_schedule_of_the_two_sides(every, grad_every, want):
    s = AtlasSettings(every=every, grad_every=grad_every)
    assert [s.probes(i) for i in range(18)] == want


def test_copying_score_is_the_eigenvalues_of_the_full_token_map():
    """Per head: Σ Re λ / Σ |λ| of the top tokens' V'×V' map ``E' D_f W_O W_V D_1 E'ᵀ`` (LN gains
    included), computed directly, against the probe's batched C×C eigensolve."""
    p, model = _probe("mhsa")
    with torch.no_grad():
        for blk in model.h:                                  # gains away from 1, so they matter
            blk.ln_1.weight.uniform_(0.5, 1.5)
        model.ln_f.weight.uniform_(0.5, 1.5)
    got = p.measure()
    E = model.wte.weight[p.top].detach()
    C, hs = 8, 4
    for l, blk in enumerate(model.h):
        for h in range(2):
            wv = blk.attn.c_attn.weight[2 * C + h * hs: 2 * C + (h + 1) * hs].detach()
            wo = blk.attn.c_proj.weight[:, h * hs:(h + 1) * hs].detach()
            m = E @ torch.diag(model.ln_f.weight.detach()) @ wo @ wv @ torch.diag(blk.ln_1.weight.detach()) @ E.T
            lam = torch.linalg.eigvals(m)
            assert got[mn.head("atlas_copying", l, h)] == pytest.approx((lam.real.sum() / lam.abs().sum()).item(),
                                                                        abs=1e-9)
