import json
import threading
import time

import numpy as np
import pytest

from dyntool.errors import ConfigError
from dyntool.record.policy import RecordConfig, check_budget, estimate_bytes, schedule
from dyntool.record.pooling import pool_blocks
from dyntool.record.reader import RecordReader
from dyntool.record.store_writer import StoreWriter, chunk_shape
from dyntool.storage import open_backend


def test_roundtrip_dims_and_marker(tmp_path):
    w = StoreWriter(tmp_path / "r.zarr", chunk_steps=4)
    for s in range(10):
        w.append(s * 5, {"attn": np.full((1, 2, 1, 3, 3), s, np.float16), "logit_max": np.full((1, 2), s, np.float32)})
    # nothing is visible before a flush except whole chunks already handed over
    w.flush()
    r = RecordReader(open_backend(tmp_path), "r.zarr")
    assert r.steps_written == 10
    assert r["attn"].dims == ("step", "layer", "head", "seq", "query", "key")
    assert r["attn"].shape == (10, 1, 2, 1, 3, 3)
    assert list(r["step"][:]) == [0, 5, 10, 15, 20, 25, 30, 35, 40, 45]
    assert r["attn"][7, 0, 1, 0].tolist() == [[7] * 3] * 3
    assert r["attn"][-1].max() == 9
    with pytest.raises(IndexError):
        r["attn"][10]
    w.close()


def test_steps_must_increase_and_shapes_stay(tmp_path):
    w = StoreWriter(tmp_path / "r.zarr")
    w.append(3, {"a": np.zeros(2)})
    with pytest.raises(ValueError, match="increase"):
        w.append(3, {"a": np.zeros(2)})
    with pytest.raises(ValueError, match="differ"):
        w.append(4, {"a": np.zeros(3)})
    w.close()


def test_existing_store_is_never_overwritten(tmp_path):
    StoreWriter(tmp_path / "r.zarr").close()
    with pytest.raises(Exception):
        StoreWriter(tmp_path / "r.zarr")


def test_reader_never_sees_unwritten_rows(tmp_path):
    """A reader polling during writes must never read fill values (NaN) below the marker."""
    w = StoreWriter(tmp_path / "r.zarr", chunk_steps=1)
    stop = threading.Event()
    torn = []

    def read():
        while not stop.is_set():
            try:
                r = RecordReader(open_backend(tmp_path), "r.zarr")
                if r.steps_written:
                    data = r["x"][: r.steps_written]
                    if np.isnan(data).any():
                        torn.append(r.steps_written)
            except KeyError:
                pass

    t = threading.Thread(target=read)
    t.start()
    for s in range(60):
        w.append(s, {"x": np.random.rand(64, 64).astype(np.float32)})
    w.close()
    stop.set()
    t.join()
    assert torn == []
    assert RecordReader(open_backend(tmp_path), "r.zarr").steps_written == 60


def test_chunks_split_heads_for_big_matrices():
    assert chunk_shape((2, 4, 1, 2000, 2000), 2, 16) == (1, 1, 1, 1, 2000, 2000)
    assert chunk_shape((1, 1, 1, 5, 5), 4, 16) == (16, 1, 1, 1, 5, 5)


def test_schedule_policies():
    cfg = RecordConfig(every=0, steps=[3, 1, 99], log_spaced=0)
    assert schedule(cfg, 50).tolist() == [1, 3]
    cfg = RecordConfig(every=10)
    assert schedule(cfg, 35).tolist() == [0, 10, 20, 30, 34]
    cfg = RecordConfig(every=0, log_spaced=5)
    s = schedule(cfg, 1000)
    assert s[0] == 0 and s[-1] == 999 and len(s) == 5 and np.all(np.diff(np.log(s + 1)) > 0)
    assert schedule(RecordConfig(enabled=False), 10).size == 0


def test_budget_estimate_and_error(tmp_path):
    cfg = RecordConfig(dtype="float16", arrays=["attn"])
    # (L=1, H=1, S=1, 2000, 2000) fp16 = 8 MB/step (+ grad_scale, step)
    per = estimate_bytes(cfg, 1, L=1, H=1, T=2000, d_k=10, d_v=15)
    assert abs(per - 8e6) < 100
    with pytest.raises(ConfigError, match=r"~0\.80 GB.*budget of 0\.5 GB"):
        check_budget(RecordConfig(dtype="float16", arrays=["attn"], disk_budget_gb=0.5), 100, tmp_path,
                     L=1, H=1, T=2000, d_k=10, d_v=15)
    windowed = RecordConfig(dtype="float16", arrays=["attn"], query_crop=[1800, 2000], pool=50)
    # a 200-query window (200 × 2000) plus a 40 × 40 pooled overview
    assert estimate_bytes(windowed, 1, L=1, H=1, T=2000, d_k=10, d_v=15) == 2 * (200 * 2000 + 40 * 40) + 4 + 8


def test_pool_blocks_means_including_ragged_edges():
    import torch
    x = torch.arange(25, dtype=torch.float64).view(5, 5)
    p = pool_blocks(x, 2)
    assert p.shape == (3, 3)
    assert p[0, 0] == (0 + 1 + 5 + 6) / 4
    assert p[2, 2] == 24
    assert p[0, 2] == (4 + 9) / 2
