"""What the light paths import and cost: ``import dyntool`` and ``dyntool --help`` (issue 51 item 2).

    python bench/light_paths.py [--rounds 7] [--base DIR] [--json FILE]

Each round runs, in fresh interpreters, ``import dyntool`` under ``-X importtime`` (the package's
cumulative import time) and ``python -m dyntool --help`` (wall time), and reports the modules each
loaded and which heavy libraries among them.  ``--base DIR``: a second tree holding a ``dyntool/``
package (``git archive REV dyntool | tar -x -C DIR``), measured in the same rounds, alternating
with this one, so the ratios are paired and a loaded machine's drift cancels; medians reported.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "matplotlib", "streamlit", "transformers", "zarr", "numpy", "pandas", "xarray",
         "dask", "obstore", "scipy", "sklearn", "pyarrow", "tqdm")
LOADED = ("import json, sys; print(json.dumps([len(sys.modules), len([m for m in sys.modules "
          "if m.split('.')[0] == 'dyntool']), sorted({m.split('.')[0] for m in sys.modules} & set(%r))]))" % (HEAVY,))


def _run(tree: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=tree, capture_output=True, text=True, timeout=300)


def loaded(tree: Path) -> dict:
    """Modules (all, dyntool's) and heavy libraries of each path, from one fresh interpreter each."""
    help_code = ("import contextlib, io\nfrom dyntool.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
                 "    try: main(['--help'])\n    except SystemExit: pass\n")
    out = {}
    for name, code in (("import dyntool", "import dyntool\n"), ("dyntool --help", help_code)):
        n, own, heavy = json.loads(_run(tree, ["-c", code + LOADED]).stdout.splitlines()[-1])
        out[name] = {"modules": n, "dyntool_modules": own, "heavy": heavy}
    return out


def one_round(tree: Path) -> tuple[float, float]:
    """(import dyntool's cumulative import time in ms, `python -m dyntool --help` wall time in s)."""
    r = _run(tree, ["-X", "importtime", "-c", "import dyntool"])
    line = next(l for l in reversed(r.stderr.splitlines()) if l.rstrip().endswith("| dyntool"))
    t0 = time.perf_counter()
    assert _run(tree, ["-m", "dyntool", "--help"]).returncode == 0
    return int(line.split("|")[1]) / 1000, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--base", type=Path, help="a tree with a dyntool/ package to compare with (same rounds)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    trees = {"this": ROOT, **({"base": a.base.resolve()} if a.base else {})}
    res = {k: {"loaded": loaded(t), "import_ms": [], "help_s": []} for k, t in trees.items()}
    for i in range(a.rounds):
        for k in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
            ms, s = one_round(trees[k])
            res[k]["import_ms"].append(ms)
            res[k]["help_s"].append(s)
    for k, r in res.items():
        r["import_ms_median"] = statistics.median(r["import_ms"])
        r["help_s_median"] = statistics.median(r["help_s"])
        print(f"{k}: {json.dumps(r['loaded'])}\n  import dyntool {r['import_ms_median']:.1f} ms (cumulative, "
              f"-X importtime), dyntool --help {r['help_s_median']:.2f} s wall (medians of {a.rounds})")
    if a.base:
        ratio = statistics.median(x / y for x, y in zip(res["this"]["help_s"], res["base"]["help_s"]))
        res["help_ratio_this_over_base"] = ratio
        print(f"--help this/base: {ratio:.3f} (median of the paired rounds)")
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    res["hardware"] = f"{cpu}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}"
    print(res["hardware"])
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
