"""Out-of-core analysis bench: write a large synthetic record, reduce it with dask.

    python bench/bench_dask.py --gb 1.0 [--cluster] [--out DIR]
    python bench/bench_dask.py --reduce-only RUN [--cluster]     # reduce an existing record again

Writes ``attn``, ``compat`` and ``score_grad`` (float32, (step, L, H, S, T, T), causal) through the
ordinary StoreWriter until the record holds ``--gb`` GB uncompressed, then, in a fresh process,
computes the routing-law residual over every step (:func:`dyntool.scale.routing_residual`) on the
threaded scheduler (or a ``dask.distributed`` LocalCluster with ``--cluster``) and reports the
record's size, the reduction's time, throughput and the reducing process's peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

L, H, S, T = 4, 4, 2, 256


def write(out: Path, gb: float) -> dict:
    from dyntool.run_writer import RunWriter
    per_step = 3 * L * H * S * T * T * 4
    n = max(2, int(gb * 1e9 // per_step))
    rng = np.random.default_rng(0)
    causal = np.tril(np.ones((T, T), bool))
    t0 = time.perf_counter()
    with RunWriter.create(out, "synthetic", {"bench": "dask"}, name="big") as run:
        st = run.open_store(chunk_steps=4, flush_seconds=0)
        s = np.where(causal, rng.normal(size=(L, H, S, T, T)).astype(np.float32), -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        b = np.where(causal, rng.normal(size=a.shape), 0).astype(np.float32)
        variants = []                              # compat rolled over heads: H distinct steps,
        for k in range(H):                         # computed once, so writing is compress + I/O
            bb = np.roll(b, k, axis=1)
            dS = (a * (bb - (a * bb).sum(-1, keepdims=True))).astype(np.float32)
            variants.append({"attn": a, "compat": bb, "score_grad": dS})
        for step in range(n):
            st.append(step, variants[step % H])
    return {"steps": n, "gb_uncompressed": n * per_step / 1e9, "write_s": time.perf_counter() - t0}


def reduce(run_path: str, cluster: bool) -> dict:
    import dyntool
    from dyntool.scale import routing_residual
    client = None
    if cluster:
        from distributed import Client, LocalCluster
        client = Client(LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                     dashboard_address=None, memory_limit="1GB"))
    run = dyntool.open_run(run_path)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    res = routing_residual(run.to_xarray(["attn", "compat", "score_grad"], chunks="record")).compute()
    dt = time.perf_counter() - t0
    load1 = os.getloadavg()[0]
    if client is not None:
        client.close()
    gb = sum(int(np.prod(run.arrays[n].shape)) * np.dtype(run.arrays[n].dtype).itemsize
             for n in ("attn", "compat", "score_grad")) / 1e9
    return {"gb_uncompressed": gb, "reduce_s": dt, "gb_per_s": gb / dt,
            "mb_per_s_per_core": 1e3 * gb / dt / os.cpu_count(), "max_residual": float(res.max()),
            "shape": list(res.shape), "disk_gb": run.size_bytes() / 1e9, "cpus": os.cpu_count(),
            "load_1min": [load0, load1],
            "scheduler": "LocalCluster(2 workers x 1 thread)" if cluster else "threaded",
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--cluster", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reduce-only", default=None, metavar="RUN",
                    help="only reduce the record of RUN (written by an earlier --out)")
    a = ap.parse_args()
    if a.reduce_only:
        print(json.dumps(reduce(a.reduce_only, a.cluster)))
        return
    out = Path(a.out or tempfile.mkdtemp(prefix="bench-dask-"))
    w = write(out, a.gb)
    args = [sys.executable, __file__, "--reduce-only", str(out / "big")] + (["--cluster"] if a.cluster else [])
    r = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
    r.update(w)
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
