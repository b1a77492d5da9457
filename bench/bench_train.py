"""Training-step benchmarks for dyntool train (all ratios measured inside ONE process).

    python bench/bench_train.py [--config wikitext_mhsa] [--preset small]
                                [--reps 5] [--steps 10] [--rec-steps 200] [--rec-reps 2] [--json FILE]

A. model step (forward + backward + AdamW, same batch shape, same dims): the plain nanoGPT-style
   reference (bench/nanogpt_ref.py) vs our ``mhsa`` vs ``span`` (the config's [span] section, default
   c1_orthogonal α=2).  Warmup, then ``--reps`` rounds, each timing ``--steps`` steps of every model
   in a rotated order; reported: median per-step time and the median of the per-round ratios
   (paired, so slow drifts of a shared machine cancel).  Targets: mhsa/ref ≤ 1.10, span/mhsa ≤ 1.25.
C. (parts) the cost of each recording piece next to one plain step, interleaved: exact and bound
   logit statistics, group grad norms, one probe capture + compute + float16 conversion.
B. recording overhead: the full trainer for ``--rec-steps`` steps with recording every 50 steps
   (probe capture, zarr writes, exact per-step max|logit|, per-group grad norms) vs recording off
   (no record, logit_stat off), alternating ``--rec-reps`` times; mean step time (recorded steps
   included).  Target: on/off ≤ 1.05.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from dyntool.data.wikitext import get_batch, load_wikitext   # noqa: E402
from dyntool.train.runner import load_config, run_training     # noqa: E402
from dyntool.train.gpt import GPT                           # noqa: E402
from nanogpt_ref import RefGPT                              # noqa: E402


def hardware() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "?"
    return f"{cpu}; torch threads {torch.get_num_threads()}; torch {torch.__version__}; loadavg {load}"


def bench_models(cfg, corpus, reps: int, steps: int) -> dict:
    d, m = cfg.data, cfg.model
    models = {}
    torch.manual_seed(0)
    models["ref"] = RefGPT(corpus.vocab_size, d.block_size, m.n_layer, m.n_head, m.n_embd, m.bias,
                           dropout=m.dropout, vocab_multiple=m.vocab_multiple)
    from dataclasses import replace
    for att in ("mhsa", "span"):
        torch.manual_seed(0)
        models[att] = GPT(replace(m, attention=att), corpus.vocab_size, d.block_size, cfg.span)
    opts = {k: torch.optim.AdamW(v.parameters(), lr=1e-4) for k, v in models.items()}
    gen = torch.Generator().manual_seed(0)
    batches = [get_batch(corpus.train, d.batch_size, d.block_size, gen) for _ in range(steps)]

    def run(name, n):
        model, opt = models[name], opts[name]
        t = time.perf_counter()
        for x, y in batches[:n]:
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t) / n

    for name in models:                                  # warmup: allocator, kernels, caches
        run(name, 3)
    names = list(models)
    times = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            times[n].append(run(n, steps))
    med = {n: statistics.median(v) for n, v in times.items()}
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))  # noqa: E731
    return {"step_s": med, "mhsa_over_ref": ratio("mhsa", "ref"), "span_over_mhsa": ratio("span", "mhsa"),
            "per_round": times}


def bench_parts(cfg, corpus, reps: int) -> dict:
    """Cost of each recording piece relative to one plain step, interleaved in one process."""
    from dyntool.capture import Capture
    from dyntool.train.gpt import group_grad_norms
    from dyntool.train.recording import logit_absmax, logit_bound
    d = cfg.data
    torch.manual_seed(0)
    model = GPT(cfg.model, corpus.vocab_size, d.block_size, cfg.span)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    x, y = get_batch(corpus.train, d.batch_size, d.block_size, gen)
    model.track_qk(True)

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def stat(fn):
        for blk in model.h:
            q, k = blk.last_qk()
            s = q.shape[-1] ** -0.5
            fn(q, k, blk.attn.core.allowed(q.shape[-2], q.device), s)

    def probe():
        with Capture(model, seqs=cfg.record.seqs) as cap:
            _, loss = model(x[:cfg.record.seqs], y[:cfg.record.seqs])
            loss.backward()
        qs = cap.compute()
        {k: v.cpu().numpy().astype("float16") for k, v in qs.items()}
        model.zero_grad(set_to_none=True)

    parts = {"step": step, "logit_exact": lambda: stat(logit_absmax),
             "logit_bound": lambda: stat(lambda q, k, a, s: logit_bound(q, k, s)),
             "grad_norms": lambda: group_grad_norms(model.grad_groups()),
             "probe_record": probe}
    step()
    out = {n: [] for n in parts}
    for _ in range(reps):
        for n, f in parts.items():
            if n == "grad_norms":                        # needs grads: time it right after a backward
                _, loss = model(x, y)
                loss.backward()
            t = time.perf_counter()
            f()
            out[n].append(time.perf_counter() - t)
            if n == "grad_norms":
                opt.zero_grad(set_to_none=True)
    med = {n: statistics.median(v) for n, v in out.items()}
    best = {n: min(v) for n, v in out.items()}            # least disturbed by other load
    return {"seconds": med, "fraction_of_step": {n: v / med["step"] for n, v in med.items()},
            "seconds_min": best, "fraction_of_step_min": {n: v / best["step"] for n, v in best.items()}}


def bench_recording(args, reps: int, steps: int) -> dict:
    base = [f"--train.max_steps={steps}", "--train.eval_every=0", "--train.final_eval=false",
            "--train.checkpoint=false"]
    variants = {"on": ["--record.every=50", "--train.logit_stat=exact"],
                "off": ["--record.enabled=false", "--train.logit_stat=off"]}
    means = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(reps):
            for k, extra in (variants.items() if r % 2 == 0 else reversed(list(variants.items()))):
                cfg = load_config(args.config, args.preset, args.overrides + base + extra)
                path, _ = run_training(cfg, tmp, name=f"{k}{r}", quiet=True, kind="bench")
                rows = [json.loads(s) for s in (path / "metrics.jsonl").read_text().splitlines()]
                means[k].append(statistics.fmean(x["step_time"] for x in rows))
    ratios = [a / b for a, b in zip(means["on"], means["off"])]
    return {"mean_step_s": means, "on_over_off": statistics.median(ratios), "per_rep_ratio": ratios}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="wikitext_span")
    p.add_argument("--preset", default="small")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rec-steps", type=int, default=200)
    p.add_argument("--rec-reps", type=int, default=2)
    p.add_argument("--skip-models", action="store_true")
    p.add_argument("--skip-recording", action="store_true")
    p.add_argument("--skip-parts", action="store_true")
    p.add_argument("--json", default=None)
    args, rest = p.parse_known_args(argv)
    args.overrides = rest
    cfg = load_config(args.config, args.preset, args.overrides)
    out = {"hardware": hardware(), "config": args.config, "preset": args.preset,
           "dims": {"n_layer": cfg.model.n_layer, "n_embd": cfg.model.n_embd, "n_head": cfg.model.n_head,
                    "B": cfg.data.batch_size, "T": cfg.data.block_size}}
    print(out["hardware"])
    if not args.skip_models:
        corpus = load_wikitext(cfg.data.path or None)
        a = bench_models(cfg, corpus, args.reps, args.steps)
        out["models"] = a
        for n, t in a["step_s"].items():
            print(f"  {n:5s} {t * 1000:8.1f} ms/step")
        print(f"  mhsa/ref  {a['mhsa_over_ref']:.3f}  (target <= 1.10)")
        print(f"  span/mhsa {a['span_over_mhsa']:.3f}  (target <= 1.25)")
    if not args.skip_parts:
        corpus = load_wikitext(cfg.data.path or None)
        c = bench_parts(cfg, corpus, args.reps)
        out["parts"] = c
        for n, f in c["fraction_of_step"].items():
            print(f"  {n:13s} median {c['seconds'][n] * 1000:8.2f} ms ({f:.4f} of a step)   "
                  f"min {c['seconds_min'][n] * 1000:8.2f} ms ({c['fraction_of_step_min'][n]:.4f})")
        every = 50
        for key in ("fraction_of_step", "fraction_of_step_min"):
            fr = c[key]
            est = 1 + fr["logit_exact"] + fr["grad_norms"] + fr["probe_record"] / every
            out["parts"][f"estimated_on_over_off_every50 ({key})"] = est
            print(f"  estimated recording overhead at every={every} ({key}): {est:.4f}x")
    if not args.skip_recording:
        b = bench_recording(args, args.rec_reps, args.rec_steps)
        out["recording"] = b
        print(f"  recording on  {statistics.median(b['mean_step_s']['on']) * 1000:8.1f} ms/step")
        print(f"  recording off {statistics.median(b['mean_step_s']['off']) * 1000:8.1f} ms/step")
        print(f"  on/off {b['on_over_off']:.3f}  (target <= 1.05; per rep {[round(r, 3) for r in b['per_rep_ratio']]})")
    out["loadavg_end"] = hardware().rsplit("loadavg ", 1)[1]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
