"""What the recording tiers cost (all ratios measured inside ONE process, interleaved, medians).

    python bench/bench_tiers.py [--quick] [--reps 5] [--steps 6] [--json FILE]

A. the cheap tier every step on dyntool's GPT at the ``small`` preset's shape (dyntool/presets/wikitext_mhsa.toml:
   4 layers, 4 heads, C = 128, B = 16, T = 64; random tokens over WikiText-2's vocabulary, so no
   data is read):
   a training step (forward + backward + AdamW) with the cheap tier attached and its statistics
   read (``FlightRecorder``: with, result, metrics, reset) vs recording off.  Target ≤ 1.05.
B. the same mhsa + cheap tier vs the plain nanoGPT-style reference (bench/nanogpt_ref.py):
   tokens/s of both and their ratio.
C. a GPT-2-shaped Hugging Face model (GPT2LMHeadModel, SDPA; 12 × 12 × 768 at T = 256, B = 1;
   ``--quick``: 4 × 4 × 256, B = 4): step with the cheap tier vs without.  Target ≤ 1.10.  Reference
   in the same rounds: TransformerLens on the same shape, ``run_with_cache`` + backward hooks vs
   its plain step.
D. the full tier's memory at T = 8192, one layer, one head: peak resident memory (sampled every
   0.5 ms) above what the forward/backward left, for today's dense full tier (the per-layer
   ``head_quantities`` that ``Capture.compute()`` runs), in a child process so peaks do not mix.
E. ``full_tier_T8192_peak_extra_mib``: the same for the streamed full tier, end to end (the head
   selected with ``record.heads``, computed in query-row blocks of ``record.max_block_mib`` = 64
   and written into ``record.zarr`` block by block).  Target ≤ 512 MiB; and the values it stores at
   T = 1024 (budget 4 MiB, several blocks) equal the dense ``Capture.compute()`` to 1e-6.
F. the streamed full tier's compute (``stream``, no writer) of every head of the ``small`` preset's
   GPT (S = 4 sequences, T = 64 and 256): a layer's heads together in one block (``max_block_mib`` =
   64, what the recorder passes; on the CPU capped at ``stream.CPU_BLOCK_ENTRIES``, so T = 256 keeps
   one head a block) vs one head at a time; ratio ``together_over_one_head``.

Rounds rotate the order of the arms; each arm's per-round time is the mean of ``--steps`` steps;
ratios are the medians of the per-round ratios (paired, so the drift of a shared machine cancels).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import hardware                                    # noqa: E402
from dyntool.flight import FlightRecorder                      # noqa: E402
from dyntool.train.gpt import GPT                              # noqa: E402
from dyntool.train.runner import load_config                   # noqa: E402
from nanogpt_ref import RefGPT                                 # noqa: E402

VOCAB = 33278                  # WikiText-2's vocabulary (the small preset's lm_head size)


def interleave(arms: dict, reps: int, steps: int) -> dict[str, list[float]]:
    """Per-round mean step time of every arm, rounds rotating the order; one warm-up round."""
    names = list(arms)
    for n in names:
        arms[n](2)
    times = {n: [] for n in names}
    for r in range(reps):
        for n in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            arms[n](steps)
            times[n].append((time.perf_counter() - t) / steps)
    return times


def ratio(times, a, b) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def trainer(model, batch, loss_fn, flight: FlightRecorder | None = None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run(n):
        for _ in range(n):
            if flight is None:
                loss_fn(model, batch).backward()
            else:
                with flight:
                    loss_fn(model, batch).backward()
                flight.metrics()                        # the host sync the trainer pays
                flight.reset()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return run


def bench_gpt(reps: int, steps: int) -> dict:
    cfg = load_config("wikitext_mhsa", "small", [])
    d, m = cfg.data, cfg.model
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (d.batch_size, d.block_size), generator=g)
    batch = (x, torch.roll(x, -1, 1))
    models = {}
    for name in ("off", "cheap"):
        torch.manual_seed(0)
        models[name] = GPT(m, VOCAB, d.block_size)
    torch.manual_seed(0)
    models["ref"] = RefGPT(VOCAB, d.block_size, m.n_layer, m.n_head, m.n_embd, m.bias, dropout=m.dropout,
                           vocab_multiple=m.vocab_multiple)
    loss = lambda mod, b: mod(*b)[1]                  # noqa: E731
    arms = {"off": trainer(models["off"], batch, loss),
            "cheap": trainer(models["cheap"], batch, loss, FlightRecorder(models["cheap"])),
            "ref": trainer(models["ref"], batch, loss)}
    t = interleave(arms, reps, steps)
    tok = d.batch_size * d.block_size
    med = {n: statistics.median(v) for n, v in t.items()}
    return {"shape": f"L={m.n_layer} nh={m.n_head} C={m.n_embd} B={d.batch_size} T={d.block_size} V={VOCAB}",
            "step_s": med, "tokens_per_s": {n: tok / s for n, s in med.items()},
            "cheap_over_off": ratio(t, "cheap", "off"), "cheap_over_ref": ratio(t, "cheap", "ref"),
            "off_over_ref": ratio(t, "off", "ref")}


def bench_hf(reps: int, steps: int, quick: bool) -> dict:
    """C: GPT-2 small's shape (12 × 12 × 768, T = 256, B = 1) or, with ``--quick``, 4 × 4 × 256.
    The reference beside it, in the same rounds: TransformerLens on the same shape, a plain step
    vs ``run_with_cache(..., incl_bwd=True)`` (its forward cache + backward hooks on the
    attention's q, k, v, scores, pattern and z), the way a TL user records these quantities."""
    import transformers
    L, C, nh, T, B = (4, 256, 4, 256, 4) if quick else (12, 768, 12, 256, 1)
    cfg = transformers.GPT2Config(n_layer=L, n_embd=C, n_head=nh, n_positions=T, vocab_size=50257,
                                  attn_pdrop=0, resid_pdrop=0, embd_pdrop=0)
    cfg._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50257, (B, T), generator=g)
    batch = {"input_ids": ids, "labels": ids}
    loss = lambda mod, b: mod(**b).loss              # noqa: E731
    models = {}
    for name in ("off", "cheap"):
        torch.manual_seed(0)
        models[name] = transformers.GPT2LMHeadModel(cfg).train()
    arms = {"off": trainer(models["off"], batch, loss),
            "cheap": trainer(models["cheap"], batch, loss, FlightRecorder(models["cheap"]))}
    arms.update(tl_arms(L, C, nh, T, ids))
    t = interleave(arms, reps, steps)
    out = {"shape": f"GPT2LMHeadModel L={L} nh={nh} C={C} B={B} T={T} V=50257 (sdpa)",
           "step_s": {n: statistics.median(v) for n, v in t.items()}, "cheap_over_off": ratio(t, "cheap", "off")}
    if "tl_cache" in t:
        out["tl_cache_over_tl_off"] = ratio(t, "tl_cache", "tl_off")
        out["cheap_over_tl_cache"] = ratio(t, "cheap", "tl_cache")
    return out


def tl_arms(L, C, nh, T, ids) -> dict:
    """TransformerLens' way, same shape: a plain training step, and one with ``run_with_cache``
    and backward hooks on every attention's internals (empty if TransformerLens is missing)."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        return {}
    cfg = HookedTransformerConfig(n_layers=L, d_model=C, n_heads=nh, d_head=C // nh, n_ctx=T, d_vocab=50257,
                                  act_fn="gelu_new", normalization_type="LN", d_mlp=4 * C)
    keep = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")

    def arm(cache: bool):
        torch.manual_seed(0)
        model = HookedTransformer(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def run(n):
            for _ in range(n):
                if cache:                              # forward cache + backward hooks; it calls backward
                    model.run_with_cache(ids, return_type="loss", incl_bwd=True,
                                         names_filter=lambda name: name.endswith(keep))
                else:
                    model(ids, return_type="loss").backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        return run
    return {"tl_off": arm(False), "tl_cache": arm(True)}


# resident memory of a child process, and a thread sampling its peak every 0.5 ms
_PEAK = r"""
def now():                                                                   # resident MiB
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
peak = [0.0]
def watch():                                                                 # sample the peak
    while True:
        peak[0] = max(peak[0], now())
        time.sleep(0.0005)
threading.Thread(target=watch, daemon=True).start()
"""

_CHILD = r"""
import sys, threading, time, torch
sys.path.insert(0, {root!r})
torch.manual_seed(0)
T, d = {T}, 64
{peak}x = torch.randn(1, T, d, requires_grad=True)
wq, wk, wv = (torch.randn(d, d) / d ** 0.5 for _ in range(3))
def attn(x):
    q, k, v = ((x @ w).unsqueeze(1) for w in (wq, wk, wv))                     # (1, 1, T, d)
    return q, k, v, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
q, k, v, o = attn(x)
o.square().sum().backward()                                                  # the model's own work
time.sleep(0.05)
base = peak[0] = now()
if {mode!r} == "full":
    from dyntool.quantities import head_quantities
    from dyntool.observe import causal_allowed
    with torch.no_grad():
        u = 2 * o.detach()
        qs = head_quantities(q.detach(), k.detach(), v.detach(), u, causal_allowed(T)[None, None], d ** -0.5)
time.sleep(0.05)
print(peak[0] - base)
"""


def bench_memory(T: int) -> dict:
    out = {}
    for mode in ("none", "full"):
        r = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT), T=T, mode=mode, peak=_PEAK)],
                           capture_output=True, text=True, timeout=600)
        out[mode] = float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else f"failed: {r.stderr[-200:]}"
    return {"T": T, "full_tier_dense_extra_mib": out["full"], "baseline_extra_mib": out["none"],
            "what": "dyntool.quantities.head_quantities (what Capture.compute runs per layer), one head, B=1"}


_STREAM_CHILD = r"""
import sys, tempfile, threading, time, json, torch
import numpy as np
sys.path.insert(0, {root!r})
torch.manual_seed(0)
from dyntool.capture import Capture
from dyntool.record.policy import RecordConfig
from dyntool.recorder import Recorder
from dyntool.record.store_writer import StoreWriter
from dyntool.train.config import ModelConfig
from dyntool.train.gpt import GPT
{peak}def record(T, mib, heads):
    torch.manual_seed(0)
    m = GPT(ModelConfig(n_layer=1, n_head=1, n_embd=64), 64, T)            # one layer, one head, float32
    x = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(1))
    with Capture(m) as cap:
        m(x, x)[1].backward()
    d = tempfile.mkdtemp()
    cfg = RecordConfig(every=1, seqs=1, dtype="float32", heads=heads, max_block_mib=mib)
    rec = Recorder(StoreWriter(d + "/record.zarr", flush_seconds=0), cfg, 1, T)
    time.sleep(0.05)
    base = peak[0] = now()
    small = rec.record_capture(0, cap)
    rec.close()
    time.sleep(0.05)
    return cap, rec, d, peak[0] - base
mode = {mode!r}
if mode == "stream":
    _, rec, _, extra = record({T}, 64.0, "L0H0")
    print(json.dumps({{"extra": extra, "rows": rec._stream[0]}}))
else:                                                   # streamed at T = 1024 vs the dense compute()
    import zarr
    cap, rec, d, _ = record(1024, 4.0, "L0H0")
    dense = cap.compute()
    g = zarr.open_group(d + "/record.zarr", mode="r")
    err = {{}}
    for n in ("attn", "scores", "compat", "advantage", "score_grad", "value_grad", "key_grad", "query_grad",
              "attn_entropy", "column_usage", "expected_compat", "logit_max"):
        got, want = np.asarray(g[n][0]), dense[n].numpy()
        fin = np.isfinite(want)
        assert (np.isfinite(got) == fin).all(), n
        err[n] = float(np.abs(got[fin] - want[fin]).max() / max(np.abs(want[fin]).max(), 1e-30))
    print(json.dumps({{"rows": rec._stream[0], "max_rel_err": err}}))
"""


def bench_memory_streamed(T: int) -> dict:
    """The streamed full tier (``Recorder.record_capture`` into a zarr store on disk, one layer,
    one head, float32, ``record.max_block_mib`` = 64): peak resident memory above what the
    forward/backward left, sampled every 0.5 ms in a child process; and, at T = 1024 (budget 4 MiB:
    several blocks), the stored values against the dense ``Capture.compute()``."""
    out = {}
    for mode in ("stream", "check"):
        r = subprocess.run([sys.executable, "-c", _STREAM_CHILD.format(root=str(ROOT), T=T, mode=mode, peak=_PEAK)],
                           capture_output=True, text=True, timeout=900)
        out[mode] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else f"failed: {r.stderr[-300:]}"
    st, ck = out["stream"], out["check"]
    return {"T": T, "full_tier_T8192_peak_extra_mib": st["extra"] if isinstance(st, dict) else st,
            "rows_per_block": st["rows"] if isinstance(st, dict) else None,
            "T1024_vs_dense_max_rel_err": ck["max_rel_err"] if isinstance(ck, dict) else ck,
            "T1024_rows_per_block": ck["rows"] if isinstance(ck, dict) else None,
            "T1024_within_1e-6": isinstance(ck, dict) and max(ck["max_rel_err"].values()) <= 1e-6,
            "what": "peak RSS (sampled every 0.5 ms) above the post-backward level while Recorder.record_capture "
                    "streams one head (record.heads=L0H0, max_block_mib=64) of a 1-layer dyntool GPT into "
                    "record.zarr; values: streamed T=1024 read back from zarr vs Capture.compute(), max |diff| / max |value|"}


def bench_stream_heads(reps: int, steps: int, Ts=(64, 256), S: int = 4) -> dict:
    """F: ``stream`` of all heads, a layer's heads in one block vs one at a time (same capture)."""
    from dyntool.capture import Capture
    from dyntool.record.selection import resolve
    from dyntool.stream import heads_per_block, rows_per_block, stream
    out = {}
    for T in Ts:
        m = load_config("wikitext_mhsa", "small", []).model
        torch.manual_seed(0)
        model = GPT(m, VOCAB, T)
        x = torch.randint(0, VOCAB, (S, T), generator=torch.Generator().manual_seed(0))
        with Capture(model) as cap:
            model(x, torch.roll(x, -1, 1))[1].backward()
        sel, rows = resolve("all", m.n_layer, m.n_head), rows_per_block(S, T, 4, 64.0)
        arms = {mode: (lambda n, mib=mib: [stream(cap, sel, lambda *a: None, rows=rows, max_block_mib=mib)
                                           for _ in range(n)])
                for mode, mib in (("one_head", None), ("together", 64.0))}
        t = interleave(arms, reps, steps)
        out[f"T{T}"] = {"shape": f"L={m.n_layer} nh={m.n_head} S={S} T={T} rows={rows} "
                                 f"heads/block={heads_per_block(S, T, rows, 4, 64.0, cpu=True)}",
                        "ms": {n: 1e3 * statistics.median(v) for n, v in t.items()},
                        "together_over_one_head": ratio(t, "together", "one_head")}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="≤ 3 min on 2 cores: fewer rounds, smaller HF model")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--T", type=int, default=8192, help="length of the memory measurement")
    p.add_argument("--json", default=None)
    p.add_argument("--only-memory", action="store_true", help="only D and E (the memory measurements)")
    p.add_argument("--only-stream", action="store_true", help="only F (the streamed full tier's heads together)")
    a = p.parse_args(argv)
    reps = a.reps or (3 if a.quick else 7)
    steps = a.steps or (3 if a.quick else 6)
    res = {"hardware": hardware(), "reps": reps, "steps": steps, "quick": a.quick}
    t0 = time.perf_counter()
    if not a.only_memory:
        res["stream_heads"] = bench_stream_heads(reps, steps)
        print(json.dumps(res["stream_heads"], indent=1), flush=True)
    if a.only_stream:
        print(f"{time.perf_counter() - t0:.0f} s on {res['hardware']}")
        return 0
    if not a.only_memory:
        res["gpt"] = bench_gpt(reps, steps)
        print(json.dumps(res["gpt"], indent=1), flush=True)
        res["hf"] = bench_hf(reps, steps, a.quick)
        print(json.dumps(res["hf"], indent=1), flush=True)
    res["memory"] = bench_memory(a.T)
    print(json.dumps(res["memory"], indent=1), flush=True)
    res["memory_streamed"] = bench_memory_streamed(a.T)
    res["full_tier_T8192_peak_extra_mib"] = res["memory_streamed"]["full_tier_T8192_peak_extra_mib"]
    print(json.dumps(res["memory_streamed"], indent=1), flush=True)
    res["seconds"] = time.perf_counter() - t0
    print(f"total {res['seconds']:.0f} s on {res['hardware']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
