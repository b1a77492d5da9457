"""Behaviour kept through refactors: the recorded arrays of the toy run, the sticky study's `ci`
preset and a 10-step tiny `dyntool train` hash exactly as at the commit the fixture was made from
(tests/data/record_hashes/hashes.json, written by ``--regenerate``: ``python -m
tests.integration.test_record_hashes``).  Floating-point results depend on the CPU's kernels and
on torch's version, so the test compares only on the machine kind and torch the fixture names,
and says so otherwise."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "data" / "record_hashes" / "hashes.json"
TINY = REPO / "tests" / "data" / "tiny_wikitext"
COMMANDS = {
    "toy": ["sim", "toy", "--steps", "40"],
    "sticky": ["sim", "sticky-markov", "--preset", "ci"],
    "train": ["train", "--config", "wikitext_mhsa", "--preset", "small", "--max-steps", "10",
              f"--data.path={TINY}", "--data.block_size=16", "--model.n_layer=2", "--model.n_head=2",
              "--model.n_embd=16", "--record.every=2", "--record.seqs=2", "--record.dtype=float32",
              "--train.final_eval=false", "--train.eval_every=0"],
}


def machine() -> dict:
    import torch
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return {"cpu": cpu, "torch": torch.__version__, "machine": platform.machine()}


def record_hashes(out: Path) -> dict:
    from dyntool.run import open_run
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for name, argv in COMMANDS.items():
        subprocess.run([sys.executable, "-m", "dyntool", *argv, "--out", str(out), "--name", name, "--quiet"],
                       env=env, check=True, capture_output=True, cwd=REPO)
    hashes = {}
    for meta in sorted(out.rglob("meta.json")):
        st = open_run(meta.parent).store
        hashes[meta.parent.relative_to(out).as_posix()] = {
            n: hashlib.sha256(np.ascontiguousarray(st[n][:]).tobytes()).hexdigest() for n in st.names()}
    return hashes


def test_recorded_arrays_hash_as_the_fixture(tmp_path):
    want = json.loads(FIXTURE.read_text())
    here = machine()
    if {k: want["machine"][k] for k in here} != here:
        pytest.skip(f"the fixture was made on {want['machine']}, this is {here}: bitwise hashes differ across CPUs")
    got = record_hashes(tmp_path)
    assert sorted(got) == sorted(want["runs"])
    for run, arrays in want["runs"].items():
        differ = sorted(n for n in set(arrays) | set(got[run]) if arrays.get(n) != got[run].get(n))
        assert not differ, f"{run}: {differ} changed"


if __name__ == "__main__":                     # regenerate the fixture (say why in the commit)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        FIXTURE.write_text(json.dumps({"machine": machine(), "runs": record_hashes(Path(d))}, indent=1,
                                      sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
