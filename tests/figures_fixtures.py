"""Fixture runs for the figure tests and ``bench/bench_figures.py``, written through the core API.

* :func:`make_toy` — a real ``dyntool sim toy`` run;
* :func:`make_sticky_study` — a sticky-chain study (``summary.json`` + ``seed{S}-{arm}`` runs) with
  the lead's layout: per-step ``loss``/``entropy``/``accuracy`` metrics, ``diag_*`` on recorded
  steps, ``attn`` (and friends) on a query/key crop, ``attn_pooled``, ``values``/``upstream`` at
  every position, statics ``bayes_entropy``/``targets``/``prev_symbol``; with ``heldout`` (default)
  also ``heldout_loss``/``heldout_entropy`` every 5 steps and ``heldout_{g,v}_*`` manifold metrics;
  the learning-rate control arms (readout, routing, all) where ``arms`` names them.  The data (inputs, Bayes
  entropies) are a real sticky chain; the training dynamics are synthetic but shaped like the
  paper's: EM-like routing settles early, values keep moving, losses fall from log 8;
* :func:`make_train_run`, :func:`make_ls_study`, :func:`make_span_study` — WikiText-shaped
  ``train`` runs (metrics ``loss``, ``val_loss``, ``val_ppl``, ``logit_max/L{l}H{h}``,
  ``logit_max/L{l}``, ``logit_max``; array ``logit_max``; ``meta.final``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dyntool.run_writer import RunWriter

LOG8 = math.log(8)


# ---------------------------------------------------------------------------------------------
# toy
# ---------------------------------------------------------------------------------------------

def make_toy(out, name: str = "toy", steps: int = 60, seed: int = 0) -> Path:
    from dyntool.sims.toy import ToyConfig, run_toy
    return run_toy(ToyConfig(seed=seed, steps=steps), str(out), name=name, quiet=True).path


def make_bijection(out, name: str = "bijection", steps: int = 12) -> Path:
    """A tiny wind-tunnel run (the ``ci`` preset of dyntool/presets/bijection.toml)."""
    from dyntool import config
    from dyntool.sims.bijection import BijectionConfig, run_bijection
    cfg = config.load(BijectionConfig, Path(__file__).parent.parent / "dyntool" / "presets" / "bijection.toml", "ci",
                      [f"--steps={steps}"])
    return run_bijection(cfg, str(out), name=name, quiet=True).path


def make_icl_markov(out, name: str = "icl-markov") -> Path:
    """A tiny in-context Markov chain study (the ``ci`` preset of dyntool/presets/icl_markov.toml)."""
    from dyntool import config
    from dyntool.sims.icl_markov_config import ICLMarkovConfig
    from dyntool.sims.icl_markov_study import run_study
    return run_study(config.load(ICLMarkovConfig, "icl_markov.toml", "ci"), str(out), name=name, quiet=True)


# ---------------------------------------------------------------------------------------------
# sticky chain
# ---------------------------------------------------------------------------------------------

def _transition(n: int = 8, rho: float = 0.3) -> np.ndarray:
    """The authors' script construction (arXiv 2512.22473, sticky Markov-chain task), circulant."""
    row = np.zeros(n)
    for j in range(n):
        d = min(j, n - j)
        row[j] = rho if d == 0 else 1.0 / d
    row = row / row.sum() * (1 - rho)
    row[0] += rho
    row /= row.sum()
    return np.stack([np.roll(row, i) for i in range(n)])


def sticky_data(seed: int, T: int, n: int = 8, d_x: int = 20):
    """(x (N, d_x), y (N,), prev (N,), bayes_entropy (N,), P, h_min), N = T − 1."""
    P = _transition(n)
    mu = np.random.default_rng(0).standard_normal((n, d_x))
    rng = np.random.default_rng(seed + 1)
    seq = [int(rng.integers(n))]
    for _ in range(T - 1):
        seq.append(int(rng.choice(n, p=P[seq[-1]])))
    seq = np.array(seq)
    prev, y = seq[:-1], seq[1:]
    x = mu[prev] + rng.standard_normal((T - 1, d_x))
    sq = ((x[:, None, :] - mu[None]) ** 2).sum(-1)
    lp = -0.5 * sq
    post = np.exp(lp - lp.max(1, keepdims=True))
    post /= post.sum(1, keepdims=True)
    pred = post @ P
    H = -(pred * np.log(np.clip(pred, 1e-300, None))).sum(1)
    h_min = float(-(P * np.log(P + 1e-10)).sum(1).mean())
    return x, y, prev, H, P, h_min


def _pool(a: np.ndarray, b: int) -> np.ndarray:
    """Causal block means over visible entries, exactly as the recorder writes ``*_pooled``."""
    from dyntool.record.pooling import pool_blocks
    return pool_blocks(a, b, np.tri(*a.shape, dtype=bool))


def _attention(same: np.ndarray, noise: np.ndarray, beta: float) -> np.ndarray:
    """Causal α (N × N, float32): content routing to same-symbol positions with strength beta."""
    s = beta * same + noise
    s[~np.tri(len(s), dtype=bool)] = -np.inf
    s -= s.max(1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(1, keepdims=True)
    return s


# learning rates W_Q/W_K/W_V/W_O per arm (as dyntool.sims.single_head.arm_lrs gives them at lr 0.01, ×10)
_LRS = {"sgd": (0.01,) * 4, "em": (0.01, 0.01, 0.1, 0.01), "readout": (0.01, 0.01, 0.01, 0.1),
        "routing": (0.1, 0.1, 0.01, 0.01), "all": (0.1,) * 4}
_FAST = {"sgd": 0.0, "em": 1.0, "em_like": 1.0, "readout": 0.9, "routing": 1.4, "all": 2.2}   # synthetic speed


def make_sticky_study(out, name: str = "sticky-study", seeds=(0, 1, 2), arms=("sgd", "em"), T: int = 120,
                      steps: int = 60, every: int = 5, crop: int = 24, pool: int = 8, d_v: int = 6,
                      sweep: bool = True, dtype=np.float32, summary: bool = True, heldout: bool = True) -> Path:
    """A sticky-markov study directory; see the module docstring.  Recorded steps: 0, every, ...,
    and steps − 1.  Matrices (attn, compat, advantage, score_grad) on queries/keys [N − crop, N)."""
    study = Path(out) / name
    study.mkdir(parents=True)
    rec_steps = sorted(set(range(0, steps, every)) | {steps - 1})
    per_seed, curves = [], {}
    for seed in seeds:
        x, y, prev, H, P, h_min = sticky_data(seed, T)
        N = len(y)
        q0 = k0 = N - crop
        rng_w = np.random.default_rng(100 + seed)
        W0 = 0.1 * rng_w.standard_normal((x.shape[1], d_v))
        Wf = W0 + 0.4 * rng_w.standard_normal((x.shape[1], d_v))
        hc = (H - H.mean()) / (H.std() or 1.0)
        direction = rng_w.standard_normal(d_v)
        entry = {"seed": seed}
        for arm in arms:
            fast = _FAST.get(arm, 1.0)                                     # 0 = SGD, 1 = EM-like
            route_rate = 0.25 + 0.5 * fast                                 # routing settles early
            value_rate = 0.6 + 1.8 * fast                                  # values keep moving
            floor = 2.06 - 0.05 * fast - 0.003 * seed
            run = RunWriter.create(study, "sticky-markov",
                                   {"seed": seed, "arm": arm, "steps": steps, "T": T, "n": 8, "rho": 0.3,
                                    "crop": crop, "record": {"every": every, "pool": pool}},
                                   name=f"seed{seed}-{arm}", seeds=[seed], tags=["sticky", arm])
            with run:
                st = run.open_store(chunk_steps=16, attrs={"task": "sticky-markov"})
                for m in ("attn", "compat", "advantage", "score_grad"):
                    st.declare(m, attrs={"query_offset": q0, "key_offset": k0, "T": N})
                st.declare("attn_pooled", attrs={"block": pool, "T": N})
                st.write_static("bayes_entropy", H.astype(np.float32), ("query",))
                st.write_static("targets", y.astype(np.int64), ("query",))
                st.write_static("prev_symbol", prev.astype(np.int64), ("query",))
                rng = np.random.default_rng(1000 * seed + (7 if arm == "sgd" else 11 + 3 * (arm not in ("em", "em_like"))))
                same = (prev[:, None] == prev[None, :]).astype(np.float32)
                noise = (0.3 * rng.standard_normal((N, N))).astype(np.float32)
                causal_w = np.tri(N, dtype=bool)[q0:, k0:]
                losses = []
                for step in range(steps):
                    t = step / max(steps - 1, 1)
                    loss = floor + (LOG8 + 0.002 - floor) * math.exp(-3.0 * (0.4 + fast) * t) \
                        + 0.0015 * rng.standard_normal() * (1 - t)
                    losses.append(loss)
                    ent = loss + 0.008 * (1 - t)
                    row = {"loss": loss, "entropy": ent,
                           "accuracy": 0.125 + (0.3 - 0.125) * (1 - math.exp(-3 * t * (0.4 + fast)))}
                    if heldout and (step % 5 == 0 or step == steps - 1):     # the held-out sequence
                        row.update(heldout_loss=loss + 0.012 * t, heldout_entropy=ent + 0.006 * t)
                    if step in rec_steps:
                        r_t = 1 - math.exp(-6 * route_rate * t)
                        v_t = 1 - math.exp(-value_rate * t)
                        A = _attention(same, noise, 3.0 * r_t)
                        ent_rows = -(A * np.log(np.maximum(A, 1e-30))).sum(1)
                        W = W0 + v_t * (Wf - W0)
                        V = x @ W + 1.5 * v_t * hc[:, None] * direction[None]
                        U = 0.05 * (1 - t) * rng.standard_normal((N, d_v)) / N
                        Aw = A[q0:, k0:]
                        B = np.where(causal_w, U[q0:] @ V[k0:].T, 0.0)
                        eb = (A[q0:] * np.where(np.tri(N, dtype=bool)[q0:], U[q0:] @ V.T, 0.0)).sum(1)
                        adv = np.where(causal_w, eb[:, None] - B, 0.0)
                        lead = (1, 1, 1)
                        arrays = {
                            "attn": Aw.reshape(lead + Aw.shape).astype(dtype),
                            "compat": B.reshape(lead + B.shape).astype(dtype),
                            "advantage": adv.reshape(lead + adv.shape).astype(dtype),
                            "score_grad": (-Aw * adv).reshape(lead + adv.shape).astype(dtype),
                            "values": V.reshape(lead + V.shape).astype(dtype),
                            "upstream": U.reshape(lead + U.shape).astype(dtype),
                            "attn_entropy": ent_rows.reshape(lead + (N,)).astype(dtype),
                            "grad_scale": np.float32(1.0),
                        }
                        if pool:
                            arrays["attn_pooled"] = _pool(A, pool)[None, None, None].astype(dtype)
                        st.append(step, arrays)
                        if heldout:                               # manifold metrics on held-out positions
                            row.update(diag_r_pc1_entropy=0.1 + 0.3 * v_t * fast,
                                       **{f"heldout_{g}_{k}": val for g, f in (("g", 0.5), ("v", 0.3)) for k, val in
                                          (("pc1_share", 0.3 + f * v_t), ("r_pc1", f * v_t * (0.5 + 0.5 * fast)),
                                           ("r_best", 0.05 + f * v_t), ("r2_linear", f * v_t * 0.8),
                                           ("ordering_score", 0.5 + 0.4 * f * v_t))})
                        row.update(diag_attn_entropy=float(ent_rows.mean()), diag_pc1_share=0.3 + 0.5 * v_t,
                                   diag_share_qk=0.2 * (1 - r_t), diag_share_v=0.6,
                                   diag_share_o=0.2 + 0.2 * r_t)
                    run.log(step, **row)
                final = {"final_loss": losses[-1], "entropy": losses[-1] + 0.004, "accuracy": 0.2 + 0.05 * fast,
                         "losses": losses}
                if heldout:
                    final.update(heldout_loss=losses[-1] + 0.012, heldout_entropy=losses[-1] + 0.014)
                run.update_meta(final={"loss": final["final_loss"], "entropy": final["entropy"]})
            entry[arm] = final
            curves.setdefault(arm, []).append(np.array(losses))
        per_seed.append(entry)
    if summary:
        s = {"kind": "sticky-markov", "h_min": h_min, "log_n": LOG8, "steps": steps, "T": T,
             "seeds": list(seeds), "arms": list(arms), "per_seed": per_seed}
        em = next((a for a in arms if a in ("em", "em_like")), None)
        if "sgd" in arms and em:
            thr = float(np.mean([c[-1] for c in curves["sgd"]]))
            hits = [int(np.nonzero(c < thr)[0][0]) if (c < thr).any() else steps for c in curves[em]]
            s["em_steps_to_sgd_final"] = {"mean": float(np.mean(hits)), "std": float(np.std(hits, ddof=1)),
                                          "per_seed": hits}
            s["speedup"] = steps / float(np.mean(hits))
            s["t_test"] = {"t": -4.5, "p": 0.01}
            s["entropy_gap"] = {a: float(np.mean([p[a]["entropy"] for p in per_seed]) - h_min) for a in arms}
            s["sgd_final_threshold"] = thr
            # the per-arm table (as dyntool.sims.summary writes it; control arms only in a --controls study)
            def to_target(a):
                h = [int(np.nonzero(c < thr)[0][0]) if (c < thr).any() else steps for c in curves[a]]
                return {"mean": float(np.mean(h)), "std": float(np.std(h, ddof=1)), "per_seed": h}
            s["arms"] = {a: {"lrs": list(_LRS.get(a, _LRS["sgd"])), "steps_to_target": to_target(a),
                             "final_heldout_loss": {"mean": float(np.mean([c[-1] for c in curves[a]])) + 0.01,
                                                    "std": float(np.std([c[-1] for c in curves[a]]))}}
                         for a in arms}
        if sweep:
            s["value_lr_sweep"] = []
            for m in (1, 3, 10, 30):
                mean = steps * (0.9 / (1 + 0.25 * m) + 0.1)
                per = [mean + 0.05 * steps * (k - (len(seeds) - 1) / 2) for k in range(len(seeds))]
                s["value_lr_sweep"].append({"mult": m, "steps_mean": float(np.mean(per)),
                                            "steps_std": float(np.std(per, ddof=1)), "per_seed": per})
        (study / "summary.json").write_text(json.dumps(s, indent=1))
    return study


# ---------------------------------------------------------------------------------------------
# WikiText-shaped training runs
# ---------------------------------------------------------------------------------------------

def make_train_run(out, name: str, attention: str = "mhsa", seed: int = 0, steps: int = 80, n_layer: int = 2,
                   n_head: int = 4, n_local: int = 3, window: int = 16, span: dict | None = None,
                   val_every: int = 20, record_every: int = 20, diverge_at: int | None = None,
                   loss_shift: float = 0.0, per_head: bool = True, block_size: int = 64) -> Path:
    """One ``train`` run shaped like ``dyntool train`` output (see the module docstring)."""
    cfg = {"seed": seed, "device": "cpu",
           "data": {"path": "", "batch_size": 4, "block_size": block_size},
           "model": {"attention": attention, "n_layer": n_layer, "n_head": n_head, "n_embd": 64,
                     "n_local": n_local, "n_global": n_head - n_local, "window": window,
                     "qk_norm": attention == "qknorm"},
           "span": {"candidate": "c1_orthogonal", "alpha_q": 1.0, "beta_q": 1.0, "alpha_k": 1.0, "beta_k": 1.0,
                    "alpha0": 0.0, "alpha0_col": 0.0, "apply_q": True, "apply_k": True, "eps": 1e-6,
                    "impl": "auto", **(span or {})},
           "optim": {"lr": 2e-3}, "train": {"max_steps": steps, "eval_every": val_every},
           "record": {"every": record_every}}
    rng = np.random.default_rng(seed * 31 + len(attention) + window + n_local)
    growth = {"mhsa": 2.2, "ls": 0.7, "qknorm": 0.25, "span": 2.0}.get(attention, 1.0) * (block_size / 64) ** 0.5
    run = RunWriter.create(out, "train", cfg, name=name, seeds=[seed], tags=["wikitext", attention])
    st = run.open_store(chunk_steps=8, attrs={"task": "wikitext", "attention": attention})
    last_val = None
    try:
        for step in range(steps):
            t = (step + 1) / steps
            loss = 5.2 + loss_shift + 2.5 * math.exp(-5 * t) + 0.04 * rng.standard_normal()
            row = {"loss": loss, "lr": 2e-3, "grad_norm": 1.0 / math.sqrt(step + 1)}
            lm = np.empty((n_layer, n_head))
            for l in range(n_layer):
                for h in range(n_head):
                    local = attention == "ls" and h < n_local
                    g = growth * (0.3 if local else 1.0) * (1 + 0.3 * l)
                    lm[l, h] = 2.0 + g * 10 * t ** 1.5 + 0.2 * rng.random()
                    if per_head:
                        row[f"logit_max/L{l}H{h}"] = lm[l, h]
                row[f"logit_max/L{l}"] = lm[l].max()
            row["logit_max"] = lm.max()
            if diverge_at is not None and step == diverge_at:
                row["loss"] = float("nan")
                run.log(step, **row)
                raise _Diverged(step)
            if (step + 1) % val_every == 0 or step == steps - 1:
                last_val = loss + 0.15 + 0.01 * step / steps
                row.update(val_loss=last_val, val_ppl=math.exp(last_val))
            if step % record_every == 0 or step == steps - 1:
                st.append(step, {"logit_max": lm.astype(np.float32)})
            run.log(step, **row)
    except _Diverged as e:
        run.finish("failed", error=f"non-finite loss at step {e.step}", failed_step=e.step)
        return run.path
    run.finish("finished", final={"steps": steps, "valid_loss": last_val, "valid_ppl": math.exp(last_val),
                                  "test_loss": last_val + 0.02, "test_ppl": math.exp(last_val + 0.02)})
    return run.path


class _Diverged(Exception):
    def __init__(self, step):
        self.step = step


def make_ls_study(out, name: str = "ls-logits", seeds=(0, 1), steps: int = 80, ablations: bool = True,
                  diverge: bool = True) -> Path:
    """mhsa / ls / qknorm × seeds (mhsa seed 1 diverging), plus LS window and global-head ablations."""
    d = Path(out) / name
    d.mkdir(parents=True)
    for s in seeds:
        make_train_run(d, f"mhsa-s{s}", "mhsa", s, steps, diverge_at=(steps - 15) if (diverge and s == 1) else None)
        make_train_run(d, f"ls-s{s}", "ls", s, steps)
        make_train_run(d, f"qknorm-s{s}", "qknorm", s, steps)
        if ablations:
            for w in (4, 64):
                make_train_run(d, f"ls-w{w}-s{s}", "ls", s, steps, window=w, loss_shift=0.02 * math.log2(16 / w))
            make_train_run(d, f"ls-g2-s{s}", "ls", s, steps, n_local=2, loss_shift=-0.01)
    (d / "summary.json").write_text(json.dumps({"study": "ls-logits", "seeds": list(seeds)}))
    return d


def make_ls_context_study(out, name: str = "ls-context", seeds=(0, 1), Ts=(128, 256, 512), steps: int = 30) -> Path:
    """The ls-logits sweep over context length: mhsa and ls at several data.block_size."""
    d = Path(out) / name
    d.mkdir(parents=True)
    for T in Ts:
        for s in seeds:
            make_train_run(d, f"mhsa-T{T}-s{s}", "mhsa", s, steps, block_size=T)
            make_train_run(d, f"ls-T{T}-s{s}", "ls", s, steps, block_size=T)
    (d / "summary.json").write_text(json.dumps({"study": "ls-logits", "seeds": list(seeds)}))
    return d


def make_span_study(out, name: str = "span", seeds=(0, 1, 2), steps: int = 60) -> Path:
    """Baseline (mhsa) and two span-recon settings × seeds."""
    d = Path(out) / name
    d.mkdir(parents=True)
    settings = {"a": {"alpha_q": 2.0, "alpha_k": 2.0}, "b": {"beta_q": 0.5, "beta_k": 0.5}}
    for s in seeds:
        make_train_run(d, f"baseline-s{s}", "mhsa", s, steps, per_head=False)
        for k, sp in settings.items():
            make_train_run(d, f"span-{k}-s{s}", "span", s, steps, span=sp, per_head=False,
                           loss_shift=(-0.03 if k == "a" else 0.01) + 0.005 * s)
    (d / "summary.json").write_text(json.dumps({"study": "span", "seeds": list(seeds)}))
    return d


def make_user_run(out, name: str = "user-model", steps: int = 4, L: int = 2, H: int = 2, T: int = 6) -> Path:
    """A user's model recorded by the HF Trainer callback: its recorded quantities (computed by
    dyntool.quantities from random q, k, v, u) and Trainer-style metrics, whose last row is the
    end-of-training summary without a ``loss`` key (that must not read as divergence)."""
    import torch

    from dyntool.quantities import head_quantities
    run = RunWriter.create(out, "hf-callback", {"model": {"class": "LlamaForCausalLM", "attention": "sdpa",
                                                          "adapter": "hf"}}, name=name)
    st = run.open_store(chunk_steps=2, attrs={"task": "custom", "adapter": "hf"})
    g = torch.Generator().manual_seed(7)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    for k in range(steps):
        q, kk, v, u = (torch.randn(L, H, 1, T, 4, generator=g) * (1 + k) for _ in range(4))
        qs = head_quantities(q, kk, v, u * 1e-3, allowed)
        st.append(k * 10, {n: qs[n].numpy().astype(np.float32) for n in
                           ("attn", "scores", "compat", "advantage", "score_grad", "attn_entropy", "logit_max")})
        run.log(k * 10, loss=3.0 - 0.2 * k, learning_rate=1e-3)
    run.log(steps * 10, train_runtime=1.0, train_loss=2.7)
    run.finish("finished")
    return run.path


def make_atlas_study(out, name: str = "atlas") -> Path:
    """A real `dyntool study atlas --preset ci` run (one qknorm seed, 6 steps): the atlas figures read
    per-step probe metrics no synthetic writer here produces."""
    from dyntool.cli import main
    rc = main(["study", "atlas", "--preset", "ci", "--seeds", "0", "--arms", "qknorm", "--out", str(out),
               "--name", name, "--quiet", "--atlas.probe_seqs=2", "--atlas.rep_seqs=2"])
    assert rc == 0
    return Path(out) / name
