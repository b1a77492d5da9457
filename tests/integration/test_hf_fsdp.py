"""HFRecorderCallback under FSDP2: a ``transformers.Trainer`` on a tiny GPT-2 sharded at load time
(``DistributedConfig(fsdp_size=2)``), 2 processes on CPU (gloo).  Every rank runs the probe step
and records its shard; the merged record equals one process on the same global batches to 1e-6
(float32).  A probe that can't be recorded rank by rank is refused on every rank, without a hang
and without a run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("transformers.distributed", reason="transformers without DistributedConfig (FSDP2 loading)")

from dyntool.integrations.ranked import ShardError, is_sharded, split_probe  # noqa: E402
from dyntool.record.ranks import rank_dir  # noqa: E402
from dyntool.record.reader import RecordReader  # noqa: E402
from dyntool.run import open_run  # noqa: E402
from dyntool.storage import open_backend  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORKER = str(Path(__file__).with_name("hf_fsdp_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def worker(*args, ranks: int = 0, timeout: int = 300) -> subprocess.CompletedProcess:
    pre = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] \
        if ranks else [sys.executable]
    return subprocess.run([*pre, WORKER, *map(str, args)], env=ENV, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf-fsdp")
    assert worker("save", d / "model").returncode == 0
    for mode, ranks in (("single", 0), ("fsdp", 2)):
        p = worker(d / "model", d / "runs", mode, mode, ranks=ranks)
        assert p.returncode == 0, p.stderr[-3000:]
    return d


def test_hf_callback_under_fsdp_equals_one_process(runs):
    fs, one = open_run(runs / "runs" / "fsdp"), open_run(runs / "runs" / "single")
    assert fs.status == one.status == "finished" and not fs.problems and not one.problems, fs.problems
    assert fs.meta["parallel"] == "fsdp" and fs.meta["world_size"] == 2
    r1 = RecordReader(open_backend(runs / "runs" / "fsdp"), rank_dir(1))           # rank 1 wrote the 2nd sequence
    assert r1.attrs["rank"] == 1 and r1.attrs["seq_offset"] == 1 and r1["attn"].shape[3] == 1
    assert list(fs.steps) == list(one.steps) == [0, 2, 4, 5]
    assert fs.store.names() == one.store.names() and "attn" in one.store.names()
    for name in one.store.names():
        a, b = fs.arrays[name][:], one.arrays[name][:]
        assert a.shape == b.shape and a.dtype == b.dtype, name
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, equal_nan=True, err_msg=name)
    np.testing.assert_array_equal(fs.arrays["attn"][:, :, :, 1], r1["attn"][:, :, :, 0])
    ma, mb = fs.metrics.set_index("step"), one.metrics.set_index("step")
    for col in ("loss", "probe_loss", "attn_entropy/L1H0", "logit_max/L0H1", "recorded_logit_max"):
        m = mb[col].notna()
        np.testing.assert_allclose(ma[col][m], mb[col][m], rtol=1e-5, atol=1e-6, err_msg=col)


def test_fsdp_probe_that_cant_be_split_is_refused_on_every_rank(runs):
    p = worker(runs / "model", runs / "runs", "bad", "fsdp", 1, ranks=2, timeout=200)
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if "ShardError:" in l]
    assert lines and all("seqs=1 must equal the probe's 2 sequences" in l for l in lines), p.stderr[-2000:]
    assert not (runs / "runs" / "bad").exists()


def test_split_probe_and_is_sharded():
    x = torch.arange(12).reshape(4, 3)
    part = split_probe({"input_ids": x, "labels": x, "flag": True}, 1, 2, 4)
    assert torch.equal(part["input_ids"], x[2:]) and part["flag"] is True
    assert torch.equal(split_probe((x, x), 0, 4, 4)[1], x[:1])
    with pytest.raises(ShardError, match="3 sequence.*evenly over 2"):
        split_probe(x[:3], 0, 2, 3)
    with pytest.raises(ShardError, match="leading sizes"):
        split_probe({"a": x, "b": x[:2]}, 0, 2, 4)
    assert not is_sharded(torch.nn.Linear(2, 2))
