"""Cost of the dataflow adapter (issue 47): tiny BLOOM and Falcon (eager), float32, CPU.

For each model, beside an identical model dyntool never touches, steps interleaved one by one:

1. a non-recording training step with a RunRecorder attached (nothing scheduled at that step: the
   tracer is not pushed, no hook is on the model) vs a plain step: ratio of medians (target ≤ 1.01×);
2. a recording step's forward/backward inside ``Capture`` (the tracer pushed in every attention
   forward, the scale probe, the forward and backward checks) vs a plain forward/backward, and the
   ``Capture.compute`` after it;
3. a pass-through ``TorchFunctionMode`` around the whole forward: µs per torch call (what the
   adapter avoids paying on every step by scoping its mode to the found modules' recording forwards);
4. the cheap tier on every step (``FlightRecorder``, its statistics read after each step) vs a plain
   step: with the adapter's check steps every 10th (the other steps take the model's own α and read
   nothing on the host) and with every step a check step.

    python bench/bench_dataflow.py [--quick] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch.overrides import TorchFunctionMode

from common import hardware

from dyntool.capture import Capture
from dyntool.flight import FlightRecorder
from dyntool.integrations import RunRecorder


def make(kind: str, seed: int = 0):
    import transformers
    torch.manual_seed(seed)
    if kind == "bloom":
        cfg = transformers.BloomConfig(vocab_size=512, hidden_size=64, n_layer=2, n_head=4)
    else:
        cfg = transformers.FalconConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        alibi=True, new_decoder_architecture=False, multi_query=True)
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()     # eval: no dropout while recording
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def step(model, opt, x):
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


class _Count(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def bench(kind: str, n: int, B: int, T: int) -> None:
    plain_m, plain_o = make(kind)
    att_m, att_o = make(kind)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randint(512, (B, T), generator=g) for _ in range(8)]
    probe = {"input_ids": xs[0][:1], "labels": xs[0][:1]}
    tmp = tempfile.mkdtemp(prefix="bench_dataflow_")
    quiet = RunRecorder(att_m, tmp, max_steps=10**9, every=0, steps=[10**9 - 1], probe=probe)
    for _ in range(3):
        step(plain_m, plain_o, xs[0])
        step(att_m, att_o, xs[0])
    # 1. non-recording step, recorder attached vs plain
    att, plain = [], []
    for i in range(n):
        x = xs[i % len(xs)]
        for which in (("plain", "att") if i % 2 == 0 else ("att", "plain")):
            t0 = time.perf_counter()
            if which == "att":
                quiet.probe_step(i)
                with quiet.train_step(i):
                    step(att_m, att_o, x)
                att.append(time.perf_counter() - t0)
            else:
                step(plain_m, plain_o, x)
                plain.append(time.perf_counter() - t0)
    quiet.close()
    # 2. a recording forward/backward (Capture open) vs a plain forward/backward, and compute()
    rec, fb, comp = [], [], []
    for i in range(max(4, n // 5)):
        x = xs[i % len(xs)]
        t0 = time.perf_counter()
        with Capture(att_m, seqs=1) as cap:
            att_m(input_ids=x, labels=x).loss.backward()
        t1 = time.perf_counter()
        cap.compute()
        comp.append(time.perf_counter() - t1)
        rec.append(t1 - t0)
        att_m.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        plain_m(input_ids=x, labels=x).loss.backward()
        fb.append(time.perf_counter() - t0)
        plain_m.zero_grad(set_to_none=True)
    # 3. a pass-through mode around the whole forward: µs per torch call
    counter = _Count()
    with torch.no_grad(), counter:
        plain_m(input_ids=xs[0])
    wrapped, bare = [], []
    with torch.no_grad():
        for i in range(n):
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                if which:
                    with _Count():
                        plain_m(input_ids=xs[0])
                    wrapped.append(time.perf_counter() - t0)
                else:
                    plain_m(input_ids=xs[0])
                    bare.append(time.perf_counter() - t0)
    # 4. the cheap tier on every step vs plain: check steps every 10th, and every step checked
    cheap = {}
    for every in (10, 1):
        fl = FlightRecorder(att_m)
        fl.adapter.check_every = every
        on, off = [], []
        for i in range(n):
            x = xs[i % len(xs)]
            for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                if which:
                    with fl:
                        step(att_m, att_o, x)
                    fl.result()
                    fl.reset()
                    on.append(time.perf_counter() - t0)
                else:
                    step(plain_m, plain_o, x)
                    off.append(time.perf_counter() - t0)
        cheap[every] = (statistics.median(on), statistics.median(off))
    med = statistics.median
    print(f"{kind} eager, 2 layers x 4 heads, d=64, T={T}, B={B}, float32")
    print(f"  1. non-recording step, recorder attached vs plain: {med(att) / med(plain):.4f}x "
          f"(median {1e3 * med(att):.1f} ms vs {1e3 * med(plain):.1f} ms over {n} steps)  target <= 1.01x")
    print(f"  2. recording forward/backward in Capture vs plain: {med(rec) / med(fb):.2f}x "
          f"({1e3 * med(rec):.1f} ms vs {1e3 * med(fb):.1f} ms); compute() {1e3 * med(comp):.1f} ms")
    print(f"  3. pass-through mode around the whole forward: {counter.n} torch calls, "
          f"{1e6 * (med(wrapped) - med(bare)) / counter.n:.2f} us per call ({med(wrapped) / med(bare):.2f}x)")
    for every, (on, off) in cheap.items():
        print(f"  4. cheap tier every step, check steps every {every}: {on / off:.2f}x a plain step "
              f"({1e3 * on:.1f} ms vs {1e3 * off:.1f} ms)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    n = 40 if a.quick else 200
    print(f"hardware: {hardware()}")
    for kind in ("bloom", "falcon"):
        bench(kind, n, B=8, T=64)


if __name__ == "__main__":
    main()
