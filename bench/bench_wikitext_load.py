"""Load time and peak RSS of the WikiText loader on a synthetic corpus of wikitext-103's size.

    python bench/bench_wikitext_load.py            # ~103M train tokens (wikitext-103-v1's size)
    python bench/bench_wikitext_load.py --quick    # ~2M tokens (wikitext-2's size)

Writes the corpus in the hub's layout (``wikitext-103-v1/{train,validation,test}-*.parquet``, one
row per line, the train split in two shards) under a temporary folder, then loads it in fresh
processes: ``cold`` (tokenize + write the memory-mapped ``.npy`` cache) and ``warm`` (cache hit:
checksum + memory map), each reporting wall time and peak RSS (``ru_maxrss``), and the
size of the cache.  Every phase then touches the ids once (a sum), so the time includes reading them; the peak RSS is
given after the imports (torch), after the load, and at the end (the touched pages of the map
count as RSS there, though they are page cache the kernel can drop).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FULL = (103_227_021, 217_646, 245_569)       # wikitext-103-v1 train/valid/test tokens
QUICK = (2_088_628, 217_646, 245_569)        # wikitext-2 size
VOCAB = 267_735                              # wikitext-103's vocabulary size
LINE = 56                                    # mean tokens per line (incl. <eos>) in wikitext-103 train


def write_corpus(root: Path, sizes, seed: int = 0) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(VOCAB)], dtype=object)
    cfg = root / "wikitext-103-v1"
    cfg.mkdir(parents=True)
    for split, n, shards in (("train", sizes[0], 2), ("validation", sizes[1], 1), ("test", sizes[2], 1)):
        lines, left = [], n
        while left > 0:
            k = int(min(left, max(1, rng.integers(1, 2 * LINE))))      # k - 1 words + <eos>
            left -= k
            lines.append(" " + " ".join(words[rng.integers(0, VOCAB if split == "train" else 5000, k - 1)]) + " \n"
                         if k > 1 else "")
        if split == "train":                                             # every word occurs in train
            lines[0] = " " + " ".join(words) + " \n"
        per = -(-len(lines) // shards)
        for i in range(shards):
            pq.write_table(pa.table({"text": lines[i * per:(i + 1) * per]}),
                           cfg / f"{split}-{i:05d}-of-{shards:05d}.parquet")
    return cfg


def phase(data: str, cache: str) -> dict:
    sys.path.insert(0, str(REPO))
    from dyntool.data.wikitext import load_wikitext
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024       # imports (torch) alone
    t0 = time.perf_counter()
    c = load_wikitext(data, cache_dir=cache)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # before the ids are touched
    total = int(c.train.sum(dtype="int64")) + int(c.valid.sum(dtype="int64")) + int(c.test.sum(dtype="int64"))
    dt = time.perf_counter() - t0
    return {"seconds": round(dt, 2), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rss_after_imports_mb": round(base, 1), "peak_rss_after_load_mb": round(loaded, 1),
            "tokens": [len(c.train), len(c.valid), len(c.test)], "vocab": c.vocab_size,
            "memmap": type(c.train).__name__, "checksum": total}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="wikitext-2-sized corpus (~2M tokens)")
    ap.add_argument("--keep", default=None, help="folder to write the corpus to (kept)")
    ap.add_argument("--phase", nargs=2, metavar=("DATA", "CACHE"), help=argparse.SUPPRESS)
    ap.add_argument("--write", nargs=2, metavar=("ROOT", "SIZES"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase:
        print(json.dumps(phase(*a.phase)))
        return
    if a.write:
        write_corpus(Path(a.write[0]), json.loads(a.write[1]))
        return
    sizes = QUICK if a.quick else FULL
    tmp = Path(a.keep or tempfile.mkdtemp(prefix="bench-wt-"))
    t0 = time.perf_counter()
    data = tmp / "wikitext-103-v1"
    if not data.is_dir():    # in a child: Linux keeps a parent's peak RSS in ru_maxrss across fork+exec
        subprocess.run([sys.executable, __file__, "--write", str(tmp), json.dumps(sizes)], check=True)
    made = time.perf_counter() - t0
    cache = tmp / "cache"
    shutil.rmtree(cache, ignore_errors=True)                # cold means cold
    out = {"sizes": sizes, "corpus_seconds": round(made, 1),
           "parquet_mb": round(sum(f.stat().st_size for f in data.glob("*.parquet")) / 2**20, 1),
           "load_avg": os.getloadavg(), "cpus": os.cpu_count()}
    for name in ("cold", "warm"):
        r = subprocess.run([sys.executable, __file__, "--phase", str(data), str(cache)],
                           capture_output=True, text=True, check=True)
        out[name] = json.loads(r.stdout.strip().splitlines()[-1])
    out["cache_mb"] = round(sum(f.stat().st_size for f in cache.glob("*.npy")) / 2**20, 1)
    out["load_avg_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
