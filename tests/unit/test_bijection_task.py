"""The authors' wind tunnel as options (dyntool/sims/bijection_task.py): exact H_Bayes with
replacement, the pointer head, the losses' masks, the normed value read-out, the config."""
import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dyntool import config
from dyntool.cli import main
from dyntool.errors import ConfigError
from dyntool.manifold import manifold_metrics
from dyntool.sims import bijection_data as data
from dyntool.sims.bijection import BijectionConfig, BijectionModel, build_model
from dyntool.sims.bijection_analysis import analyze, evaluate, normed_value_geometry, value_loss
from dyntool.sims.bijection_task import (BijectionTask, pointer_logprobs, query_only, task_loss,
                                         value_position_targets, value_scores)

TOML = "dyntool/presets/bijection.toml"


# ---------------------------------------------------------------- H_Bayes with replacement

def _enumerated_entropy(tok: np.ndarray, V: int) -> np.ndarray:
    """H of the target at every target position by enumerating the V! bijections consistent with
    the pairs seen so far (uniform prior): the posterior over π(key) is the count of consistent
    bijections per value, normalised."""
    L = (len(tok) - 1) // 2
    perms = np.array(list(itertools.permutations(range(V))))                 # (V!, V)
    keys, vals = tok[0:2 * L:2], tok[1:2 * L:2] - V
    out = []
    for k in range(L + 1):
        key = tok[2 * k] if k < L else tok[2 * L]
        ok = np.ones(len(perms), bool)
        for j in range(k):                                                    # earlier pairs only
            ok &= perms[:, keys[j]] == vals[j]
        counts = np.bincount(perms[ok, key], minlength=V).astype(float)
        p = counts / counts.sum()
        out.append(float(-(p[p > 0] * np.log(p[p > 0])).sum()))
    return np.array(out)


@pytest.mark.parametrize("V,L,seed", [(5, 7, 0), (6, 9, 1), (4, 3, 2)])
def test_posterior_entropy_with_replacement_matches_enumeration(V, L, seed):
    tok, _ = data.sample(40, V, L, torch.Generator().manual_seed(seed), with_replacement=True)
    tok = tok.numpy()
    h = data.posterior_entropy(tok, V)
    brute = np.stack([_enumerated_entropy(t, V) for t in tok])
    assert np.abs(h - brute).max() < 1e-12
    assert (brute == 0).any() and len(np.unique(np.round(brute[:, L - 1], 9))) > 1   # H varies within a position


def test_with_replacement_a_predictor_blind_to_the_key_is_uniform():
    """The plateau of the with-replacement task (README): averaged over which key comes next (uniform
    on V, seen or not), the exact posterior given the earlier pairs is uniform on the V values, so a
    model that does not look the key up can do no better than log V at the key positions.  Checked
    by enumerating the bijections consistent with each context."""
    V, L = 5, 6
    tok, _ = data.sample(10, V, L, torch.Generator().manual_seed(9), with_replacement=True)
    perms = np.array(list(itertools.permutations(range(V))))
    for t in tok.numpy():
        for k in range(L + 1):
            ok = np.ones(len(perms), bool)
            for j in range(k):
                ok &= perms[:, t[2 * j]] == t[2 * j + 1] - V
            mix = np.mean([np.bincount(perms[ok, key], minlength=V) / ok.sum() for key in range(V)], axis=0)
            assert np.abs(mix - 1 / V).max() < 1e-12


# ---------------------------------------------------------------- the pointer head

def _pointer_loops(hq, hk, vals, V):
    """Brute force, float64 numpy: w = softmax(h_q·h_k/√C), p(v) = Σ_j w_j [vals_j = v]."""
    B, L, C = hk.shape
    out = np.zeros((B, V))
    for b in range(B):
        s = np.array([hq[b] @ hk[b, j] / math.sqrt(C) for j in range(L)])
        w = np.exp(s - s.max())
        w /= w.sum()
        for j in range(L):
            out[b, vals[b, j]] += w[j]
    return out


def test_pointer_head_is_a_proper_distribution_matching_brute_force():
    g = torch.Generator().manual_seed(0)
    B, L, C, V = 6, 7, 5, 9
    hq, hk = torch.randn(B, C, generator=g, dtype=torch.float64), torch.randn(B, L, C, generator=g, dtype=torch.float64)
    vals = torch.randint(V, (B, L), generator=g)
    vals[0] = 3                                                       # every key points to one value
    lp = pointer_logprobs(hq, hk, vals, V)
    p = lp.exp()
    assert torch.allclose(p.sum(-1), torch.ones(B, dtype=torch.float64), atol=1e-14) and (p >= 0).all()
    for b in range(B):
        absent = sorted(set(range(V)) - set(vals[b].tolist()))
        assert torch.isneginf(lp[b, absent]).all()                    # no mass where no key points
    assert np.abs(p.numpy() - _pointer_loops(hq.numpy(), hk.numpy(), vals.numpy(), V)).max() < 1e-14
    assert abs(float(lp[0, 3])) < 1e-15          # all the mass on value 3: log 1, to rounding (the
    # log-softmax + logsumexp round trip gives ±1e-16 on some CPUs, exactly 0 on others)


def test_pointer_head_gradient_agrees_with_finite_differences_float64():
    g = torch.Generator().manual_seed(1)
    B, L, C, V = 3, 6, 4, 5
    hq = torch.randn(B, C, generator=g, dtype=torch.float64, requires_grad=True)
    hk = torch.randn(B, L, C, generator=g, dtype=torch.float64, requires_grad=True)
    vals = torch.randint(V, (B, L), generator=g)
    y = vals[:, 2]                                                    # a value present in each context

    def nll(a, b):
        return F.cross_entropy(pointer_logprobs(a, b, vals, V), y)
    assert torch.autograd.gradcheck(nll, (hq, hk), eps=1e-6, atol=1e-8)
    # and against the brute-force forward, differentiated by central differences
    nll(hq, hk).backward()
    e, i = 1e-6, (1, 2)
    up, dn = hq.detach().clone(), hq.detach().clone()
    up[i] += e
    dn[i] -= e
    f = lambda a: -np.log(_pointer_loops(a.numpy(), hk.detach().numpy(), vals.numpy(), V)[np.arange(B), y.numpy()]).mean()
    assert hq.grad[i].item() == pytest.approx((f(up) - f(dn)) / (2 * e), rel=1e-7)


def _model(V=6, L=5, n_layer=2):
    cfg = BijectionConfig(V=V, L=L, with_replacement=True, model=BijectionModel(n_layer=n_layer, n_head=2, n_embd=8))
    torch.manual_seed(0)
    return cfg, build_model(cfg).double()


def test_value_scores_pointer_row_is_the_pointer_of_the_final_normed_states():
    cfg, model = _model()
    tok, _ = data.sample(4, cfg.V, cfg.L, torch.Generator().manual_seed(3), with_replacement=True)
    with torch.no_grad():
        base = value_scores(model, tok, cfg.V, "logits")
        ptr = value_scores(model, tok, cfg.V, "pointer")
        x = model.wte(tok) + model.wpe(torch.arange(tok.shape[1]))        # independent forward
        for blk in model.h:
            x = blk(x)
        h = model.ln_f(x)
    L, C = cfg.L, h.shape[-1]
    assert torch.equal(base, model(tok)[0][..., cfg.V:2 * cfg.V])
    assert torch.equal(ptr[:, :-1], base[:, :-1])                       # only the query row changes
    w = torch.softmax((h[:, -1:] * h[:, 0:2 * L:2]).sum(-1) / math.sqrt(C), -1)   # (B, L)
    p = torch.zeros(len(tok), cfg.V, dtype=torch.float64).scatter_add_(1, tok[:, 1:2 * L:2] - cfg.V, w)
    assert torch.allclose(ptr[:, -1].exp(), p, atol=1e-14)


# ---------------------------------------------------------------- the losses

def test_query_only_loss_masks_exactly_the_non_query_positions():
    cfg, model = _model()
    tok, tgt = data.sample(5, cfg.V, cfg.L, torch.Generator().manual_seed(4), with_replacement=True)
    q = query_only(tgt)
    T = tok.shape[1]
    assert (q[:, :T - 1] == data.IGNORE).all() and torch.equal(q[:, -1], tgt[:, -1])
    scores = torch.randn(5, T, cfg.V, dtype=torch.float64, requires_grad=True)
    loss = task_loss(scores, tok, tgt, cfg.V, BijectionTask(loss="query"))
    assert loss.item() == pytest.approx(F.cross_entropy(scores[:, -1], tgt[:, -1]).item(), rel=1e-14)
    loss.backward()
    touched = scores.grad.abs().sum(-1) > 0                             # (B, T)
    assert touched[:, -1].all() and not touched[:, :-1].any()
    # the default: keys + query, as before (value_loss)
    s2 = scores.detach()
    assert task_loss(s2, tok, tgt, cfg.V, BijectionTask()).item() == value_loss(
        torch.cat([torch.zeros(5, T, cfg.V, dtype=torch.float64), s2], -1), tgt, cfg.V).item()


def test_all_values_loss_is_the_authors_main_plus_aux():
    cfg, _ = _model()
    tok, tgt = data.sample(5, cfg.V, cfg.L, torch.Generator().manual_seed(5), with_replacement=True)
    L, T = cfg.L, tok.shape[1]
    vt = value_position_targets(tok, cfg.V)
    assert torch.equal(vt[:, 1:2 * L:2], tok[:, 1:2 * L:2] - cfg.V) and (vt[:, 0::2] == data.IGNORE).all()
    scores = torch.randn(5, T, cfg.V, dtype=torch.float64)
    lp = scores.log_softmax(-1)
    nll = -lp.gather(-1, tgt.clamp_min(0)[..., None])[..., 0]           # at key positions and query
    nll_v = -lp[:, 1:2 * L:2].gather(-1, vt[:, 1:2 * L:2, None])[..., 0]
    main = torch.cat([nll_v, nll[:, -1:]], 1).mean()
    aux = nll[:, 0:2 * L:2].mean()
    got = task_loss(scores, tok, tgt, cfg.V, BijectionTask(loss="all_values", aux_weight=0.3))
    assert got.item() == pytest.approx((main + 0.3 * aux).item(), rel=1e-13)


# ---------------------------------------------------------------- the read-out

def test_normed_value_readout_reads_the_final_normed_state_at_value_positions_in_bits():
    cfg, model = _model(V=6, L=5)
    tok, _ = data.sample(40, cfg.V, cfg.L, torch.Generator().manual_seed(6), with_replacement=True)
    h = data.posterior_entropy(tok.numpy(), cfg.V)
    an = analyze(model, tok, cfg.V, h_bayes=h, readout="normed_values", n_plot=3)
    with torch.no_grad():
        x = model.wte(tok) + model.wpe(torch.arange(tok.shape[1]))
        for blk in model.h:
            x = blk(x)
        normed = model.ln_f(x)[:, 1:2 * cfg.L:2].reshape(-1, 8).numpy()
    bits = h[:, :cfg.L].reshape(-1) / math.log(2)
    ref = manifold_metrics(normed, bits)
    m = an["metrics"]
    for k in ("pc1_share", "r_pc1", "r2_linear", "ordering_score"):
        assert m[f"manifold/normed_values/{k}"] == pytest.approx(getattr(ref, k), rel=1e-9, nan_ok=True)
    assert np.isfinite(m["manifold/normed_values/r2_partial"])             # H varies within a position
    assert an["arrays"]["pcs_normed_values"].shape == (1, 3 * cfg.L, 2)
    assert "manifold/normed_values/r2_linear" not in analyze(model, tok, cfg.V, h_bayes=h)["metrics"]
    # without replacement the position explains H: the partial R² has nothing left to explain
    tok2, _ = data.sample(40, cfg.V, cfg.L, torch.Generator().manual_seed(6))
    m2, _ = normed_value_geometry(torch.randn(40, 2 * cfg.L + 1, 8, dtype=torch.float64),
                                  data.posterior_entropy(tok2.numpy(), cfg.V), np.tile(np.eye(cfg.L), (40, 1)))
    assert np.isnan(m2["manifold/normed_values/r2_partial"])


def test_evaluate_with_the_pointer_head_has_finite_entropy():
    cfg, model = _model()
    tok, tgt = data.sample(7, cfg.V, cfg.L, torch.Generator().manual_seed(7), with_replacement=True)
    ev = evaluate(model, tok, tgt, cfg.V, head="pointer")
    assert np.isfinite(ev["entropy_per_position"]).all() and math.isfinite(ev["loss_query"])
    with torch.no_grad():
        lp = value_scores(model, tok, cfg.V, "pointer")[:, -1]
    assert ev["loss_query"] == pytest.approx(-lp.gather(-1, tgt[:, -1:]).mean().item(), rel=1e-12)
    n_distinct = max(len(set(t[0:2 * cfg.L:2].tolist())) for t in tok)
    assert ev["entropy_per_position"][-1] <= math.log(n_distinct) + 1e-12


# ---------------------------------------------------------------- config

@pytest.mark.parametrize("key,value", [("task.head", "pointer"), ("task.loss", "query"),
                                       ("task.loss", "all_values"), ("task.aux_weight", 0.25),
                                       ("task.readout", "normed_values"), ("with_replacement", True)])
def test_each_option_round_trips_through_config(key, value):
    cfg = config.load(BijectionConfig, TOML, "ci", overrides=[f"--{key}={value}"])
    sec, _, name = key.rpartition(".")
    got = getattr(cfg.task if sec else cfg, name)
    assert got == value and got != getattr(BijectionTask() if sec else BijectionConfig(), name)
    again = config.load(BijectionConfig, base=config.to_dict(cfg))       # a run's config.json
    assert again == cfg


def test_authors_presets_combine_the_options():
    for preset in ("authors", "authors_cpu"):
        cfg = config.load(BijectionConfig, TOML, preset)
        assert cfg.with_replacement and cfg.task == BijectionTask(head="pointer", loss="query",
                                                                  readout="normed_values")
    assert config.load(BijectionConfig, TOML).task.is_default


@pytest.mark.parametrize("arg", ["--task.head=pointers", "--task.loss=values", "--task.readout=normed",
                                 "--task.aux_weight=-1", "--task.colour=red"])
def test_unknown_option_values_are_a_one_line_exit_2(arg, tmp_path, capsys):
    assert main(["sim", "bijection", "--config", TOML, "--preset", "ci", "--quiet", "--out", str(tmp_path), arg]) == 2
    err = capsys.readouterr().err.strip()
    assert "config error: task." in err and "Traceback" not in err and len(err.splitlines()) == 1
    with pytest.raises(ConfigError):
        config.load(BijectionConfig, TOML, overrides=[arg])
