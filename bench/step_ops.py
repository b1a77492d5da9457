"""The recorded step's work outside the compiled graph: ATen ops and blocking host reads that
reading the cheap tier's statistics costs (issue 45's census, the part that is not a kernel).

    TRITON_INTERPRET=1 python bench/step_ops.py [--layers 12] [--heads 12]

Runs dyntool's GPT with every site on the fused kernel (under the interpreter on a CPU: the op
count does not depend on the device), records a step's cheap tier, and counts the ATen ops that
``FlightRecorder.metrics_later()`` dispatches and how many of them read the host
(``_local_scalar_dense``, a copy to the CPU).  The second step is the one counted: the first makes
per-device constants once.  ``bench/kernel_census.py --step`` prints it beside the programs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dyntool.flight import FlightRecorder  # noqa: E402
from dyntool.train.config import ModelConfig  # noqa: E402
from dyntool.train.gpt import GPT  # noqa: E402

HOST_READS = ("_local_scalar_dense", "aten.item")


class CountOps(TorchDispatchMode):
    """Every ATen op dispatched inside the ``with``, by name."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def step_ops(n_layer: int = 12, n_head: int = 12, T: int = 20, steps: int = 2):
    """(ATen ops, host reads, the pending row) of ``metrics_later`` after the last of ``steps``
    recorded steps of a GPT with ``n_layer`` × ``n_head`` fused sites."""
    torch.manual_seed(0)
    V = 40
    m = GPT(ModelConfig(n_layer=n_layer, n_head=n_head, n_embd=8 * n_head), V, T)
    x = torch.randint(0, V, (2, T))
    flight = FlightRecorder(m, kernel="fused", grad_scale=0.5)
    for _ in range(steps):
        flight.reset()
        with flight:
            (m(x, x)[1] * 0.5).backward()
        with CountOps() as c:
            pending = flight.metrics_later()
    reads = [o for o in c.ops if any(r in o for r in HOST_READS) or ("_to_copy" in o and "cpu" in o)]
    return c.ops, reads, pending


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--json", action="store_true", help="one JSON line instead of text")
    args = ap.parse_args(argv)
    ops, reads, _ = step_ops(args.layers, args.heads)
    if args.json:
        print(json.dumps({"layers": args.layers, "heads": args.heads, "ops": len(ops), "host_reads": len(reads)}))
    else:
        print(f"recorded step, {args.layers} layers x {args.heads} heads, all fused: {len(ops)} ATen ops to read the "
              f"statistics, {len(reads)} blocking host reads (bounds: <= 20, 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
