"""Fixture runs for the app tests and the app benchmark, written through the core API.

* :func:`make_toy` — a real ``dyntool sim toy`` run (T = 5, every step recorded);
* :func:`make_multihead` — a "train"-kind run, several layers × heads, probe tokens, WikiText-like
  metrics (``loss``, ``val_loss``, ``val_ppl``, ``lr``, ``grad_norm``, ``logit_max/L{l}``);
* :func:`make_sticky_study` — a sticky-chain-like study: ``summary.json`` + one run per
  (seed, arm), matrices on a query/key crop plus pooled overviews, a ``static`` group;
* bad inputs: :func:`make_corrupted`, :func:`make_partial`, :func:`make_missing_arrays`;
* :func:`make_big` — a ≥ 1 GB float16 ``attn`` recording for ``bench/bench_app.py``.

Arrays are synthetic but well formed: attention rows are softmaxes over the causal support,
B is U Vᵀ, A and dS follow :mod:`dyntool.quantities`, so the pages see realistic values.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

from dyntool import quantities as Q
from dyntool.record.policy import RecordConfig
from dyntool.recorder import Recorder
from dyntool.run_writer import RunWriter

REPO = Path(__file__).resolve().parents[2]
APP_DIR = Path(importlib.util.find_spec("dyntool.app").origin).parent     # the installed app package

WORDS = ("the cat sat on the mat and then it ran to the door while a dog watched from the "
         "garden near an old tree").split()


def load_app_package():
    """The package :mod:`dyntool.app` with its submodules imported."""
    for sub in ("data", "analysis", "plots", "downloads", "ui"):
        importlib.import_module(f"dyntool.app.{sub}")
    return sys.modules["dyntool.app"]


# ---------------------------------------------------------------------------------------
# synthetic head quantities
# ---------------------------------------------------------------------------------------

def _base(rng: torch.Generator, L: int, H: int, T: int, d: int, symbols=None, entropy=None) -> dict:
    """Per-run parameters of (L, H, 1, T, ·) synthetic causal heads.  With ``symbols`` (T,), queries
    and keys carry an embedding of the previous symbol (heads learn to attend to positions that
    followed the same symbol, the sticky chain's structure) and values drift towards a per-symbol
    direction; with ``entropy`` (T,), the first value coordinate drifts with it (a 1-D manifold)."""
    r = lambda *s: torch.randn(*s, generator=rng, dtype=torch.float64)      # noqa: E731
    q, k, v, u = (r(L, H, 1, T, d) for _ in range(4))
    drift = 0.3 * r(L, H, 1, T, d)
    if symbols is not None:
        sym = torch.as_tensor(np.asarray(symbols))
        emb = 1.5 * r(int(sym.max()) + 1, d)
        prev = torch.roll(sym, 1)
        q, k = 0.4 * q + emb[prev], 0.4 * k + emb[prev]
        drift = drift + 1.5 * r(int(sym.max()) + 1, d)[sym]
    if entropy is not None:
        e = torch.as_tensor(np.asarray(entropy, dtype=np.float64))
        drift[..., 0] += 20 * (e - e.mean())
    return {"q": q, "k": k, "v": v, "u": u, "drift": drift}


def _heads(base: dict, t: float):
    """Head quantities at training progress ``t`` ∈ [0, 1]: attention sharpens, values drift."""
    q = base["q"] * (0.5 + 3.0 * t)
    v = 0.5 * base["v"] + t * base["drift"]
    u = 0.1 * base["u"] * (1.2 - t)
    allowed = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
    return Q.head_quantities(q, base["k"], v, u, allowed)


def _record_cfg(**kw) -> RecordConfig:
    arrays = ["attn", "scores", "compat", "advantage", "score_grad", "upstream", "values",
              "attn_entropy", "column_usage", "value_norm", "logit_max", "logit_norm"]
    return RecordConfig(every=1, arrays=kw.pop("arrays", arrays), dtype=kw.pop("dtype", "float32"), **kw)


def _write_head_run(out: Path, name: str, kind: str, config: dict, L: int, H: int, T: int, d: int,
                    steps: int, record: RecordConfig, metrics_fn, attrs: dict, seed: int = 0,
                    tags=(), status: str = "finished", static: dict | None = None, every: int = 1,
                    symbols=None, entropy=None):
    rng = torch.Generator().manual_seed(seed)
    base = _base(rng, L, H, T, d, symbols, entropy)
    run = RunWriter.create(out, kind, {**config, "record": vars(record)}, name=name, seeds=[seed],
                           tags=list(tags))
    store = run.open_store(chunk_steps=record.chunk_steps, attrs=attrs)
    rec = Recorder(store, record, steps * every, T)
    if static:
        grp = store.group.create_group("static")
        for key, arr in static.items():
            grp.create_array(key, data=np.asarray(arr))
    for i in range(steps):
        step = i * every
        qs = _heads(base, i / max(steps - 1, 1))
        rec.record(step, qs)
    for step in range(steps * every):
        run.log(step, **metrics_fn(step))
    if status == "running":      # what a live writer leaves between flushes
        store.close()
        run._metrics.close()
        run.update_meta(status="running")
        return run
    run.finish(status, final=metrics_fn(steps * every - 1))
    return run


def make_toy(out: str | Path, name: str = "toy-a", steps: int = 40, seed: int = 0) -> Path:
    """A real toy run (``dyntool sim toy``), T = 5, recorded every step."""
    from dyntool.sims.toy import ToyConfig, run_toy
    run = run_toy(ToyConfig(seed=seed, steps=steps), str(out), name=name, quiet=True)
    return run.path


def make_multihead(out: str | Path, name: str = "train-a", L: int = 3, H: int = 4, T: int = 12,
                   steps: int = 12, seed: int = 0, attention: str = "mhsa", every: int = 10,
                   status: str = "finished") -> Path:
    """A WikiText-like training run: several layers and heads, probe tokens on the axes."""
    def metrics(step):
        t = step + 1
        loss = 6.0 / (1 + 0.02 * t) + 0.05 * math.sin(t + seed)
        m = {"loss": loss, "lr": 3e-4 * min(1.0, t / 20), "tokens_per_s": 5e4 + 100 * seed,
             "grad_norm": 1.0 / math.sqrt(t)}
        if step % every == 0:
            m.update(val_loss=loss + 0.1, val_ppl=math.exp(loss + 0.1))
        for l in range(L):
            m[f"logit_max/L{l}"] = (3 + l) * math.log1p(t) * (1.0 if attention == "mhsa" else 0.5)
        return m
    tokens = [WORDS[i % len(WORDS)] for i in range(T)]
    cfg = {"seed": seed, "model": {"n_layer": L, "n_head": H, "block_size": T, "attention": attention}}
    run = _write_head_run(Path(out), name, "train", cfg, L, H, T, 8, steps, _record_cfg(),
                          metrics, {"task": "wikitext", "probe_tokens": [tokens]}, seed=seed,
                          tags=["wikitext", attention], status=status, every=every)
    return run.path


def make_sticky_study(out: str | Path, name: str = "sticky-study", seeds=(0, 1), arms=("sgd", "em"),
                      T: int = 96, crop: tuple[int, int] = (64, 96), pool: int = 8,
                      steps: int = 8, every: int = 5) -> Path:
    """A sticky-chain-like study directory with cropped matrices, pooled overviews, statics."""
    study = Path(out) / name
    study.mkdir(parents=True)
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 8, size=T)
    bayes = 1.83 + 0.2 * rng.random(T)
    for seed in seeds:
        for arm in arms:
            speed = 2.3 if arm == "em" else 1.0

            def metrics(step, seed=seed, speed=speed):
                x = speed * (step + 1) / (steps * every)
                loss = 1.83 + 0.25 * math.exp(-4 * x) + 0.01 * seed
                return {"loss": loss, "entropy": loss + 0.01, "accuracy": 0.3 * (1 - math.exp(-3 * x)),
                        "diag_value_pc1": min(0.9, x)}
            rc = _record_cfg(query_crop=list(crop), key_crop=[0, crop[1]], pool=pool,
                             dtype="float16")
            _write_head_run(study, f"seed{seed}-{arm}", "sticky-markov", {"seed": seed, "arm": arm},
                            1, 1, T, 6, steps, rc, metrics, {"task": "sticky-markov"}, seed=seed,
                            tags=["sticky", arm], static={"bayes_entropy": bayes, "targets": targets},
                            every=every, symbols=targets, entropy=bayes)
    (study / "summary.json").write_text(json.dumps({"kind": "sticky-markov", "seeds": list(seeds),
                                                    "arms": list(arms), "h_min": 1.8292}))
    return study


# ---------------------------------------------------------------------------------------
# bad inputs
# ---------------------------------------------------------------------------------------

def make_corrupted(out: str | Path, name: str = "bad-corrupt") -> Path:
    """meta.json is not JSON, record.zarr metadata is garbage, metrics has a broken line."""
    p = Path(out) / name
    (p / "record.zarr").mkdir(parents=True)
    (p / "meta.json").write_text("{not json")
    (p / "config.json").write_text("{}")
    (p / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "lo\n{"step": 2, "loss": 0.5}\n')
    (p / "record.zarr" / "zarr.json").write_text("\x00garbage")
    return p


def make_partial(out: str | Path, name: str = "live-partial") -> Path:
    """A run still being written: status 'running', and ``attn`` already resized past the commit
    marker (rows of NaN fill), as zarr's append leaves it mid-flush."""
    import zarr
    p = make_multihead(out, name=name, L=1, H=2, T=8, steps=4, status="running")
    z = zarr.open_array(str(p / "record.zarr" / "attn"), mode="r+")
    z.resize((z.shape[0] + 3, *z.shape[1:]))
    return p


def make_missing_arrays(out: str | Path, name: str = "attn-only") -> Path:
    """A run that recorded only ``attn`` (no B, advantages, values)."""
    rc = _record_cfg(arrays=["attn"])
    run = _write_head_run(Path(out), name, "toy", {"seed": 0}, 1, 1, 6, 3, 5, rc,
                          lambda s: {"loss": 1.0 / (s + 1)}, {"task": "toy"})
    return run.path


# ---------------------------------------------------------------------------------------
# big recording for the benchmark
# ---------------------------------------------------------------------------------------

def make_big(out: str | Path, name: str = "big", steps: int = 64, L: int = 2, H: int = 4, T: int = 1024,
             causal: bool = False, log=print) -> Path:
    """float16 attn of shape (steps, L, H, 1, T, T): 64 × 2 × 4 × 2 MiB = 1 GiB.  Full (non-causal)
    attention by default, so the rows are dense and the recording is ~1 GiB on disk too (a causal
    one compresses to about half)."""
    run = RunWriter.create(out, "train", {"model": {"n_layer": L, "n_head": H, "block_size": T}},
                           name=name, tags=["bench"])
    store = run.open_store(chunk_steps=2, attrs={"task": "bench"})
    store.declare("attn", attrs={"query_offset": 0, "key_offset": 0, "T": T})
    rng = np.random.default_rng(0)
    mask = np.tril(np.ones((T, T), dtype=bool)) if causal else np.ones((T, T), dtype=bool)
    base = rng.standard_normal((H, T, T), dtype=np.float32)
    for s in range(steps):
        per_layer = []
        for l in range(L):
            x = np.roll(base, s * 7 + l * 13, axis=-1) * (1 + s / steps)
            x = np.where(mask, x, -np.inf)
            x = np.exp(x - x.max(-1, keepdims=True))
            per_layer.append((x / x.sum(-1, keepdims=True)).astype(np.float16))
        attn = np.stack(per_layer)[:, :, None]                         # (L, H, 1, T, T)
        lm = np.abs(attn).reshape(L, H, -1).max(-1).astype(np.float32)
        store.append(s, {"attn": attn, "logit_max": lm})
        run.log(s, loss=5.0 / (s + 1))
        if log and s % 16 == 0:
            log(f"  big fixture: step {s}/{steps}")
    run.finish()
    return run.path
