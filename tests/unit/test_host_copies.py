"""A recorded step's arrays reach the host without the training thread waiting (issue 45, item 5).

On a GPU the recorder casts a step's arrays on the device, queues their copies into pinned buffers
and records one event; the store's writer thread waits on that event before it reads the buffers.
Here the "device" is a stand-in event whose ``synchronize()`` is the moment the copies land: an
array appended with it holds placeholder values until then, so a writer that read before waiting
would store the placeholders.  And ``record.max_block_mib = 0`` sizes the tiers' blocks for the
device they run on (the GPU's budget from its memory)."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dyntool import cheap_stats
from dyntool.record.reader import RecordReader
from dyntool.record.store_writer import StoreWriter
from dyntool.storage import open_backend


class LateCopy:
    """The event of copies that land only when someone waits on it, on whichever thread waits."""

    def __init__(self, arrays: dict[str, np.ndarray], values: dict[str, float]):
        self.arrays, self.values, self.waited_on = arrays, values, []

    def synchronize(self):
        self.waited_on.append(threading.current_thread().name)
        for k, v in self.values.items():
            self.arrays[k][...] = v


def test_steps_are_read_after_their_copies_land(tmp_path):
    w = StoreWriter(tmp_path / "r.zarr", chunk_steps=2)
    events = []
    for s in range(5):
        arrays = {"logit_max": np.full((1, 2), -1.0, np.float32), "attn": np.full((1, 2, 1, 3, 3), -1, np.float16)}
        ev = LateCopy(arrays, {"logit_max": s, "attn": 10 + s})
        events.append(ev)
        w.append(s, arrays, ready=ev)
    w.close()
    r = RecordReader(open_backend(tmp_path), "r.zarr")
    assert r["logit_max"][:].tolist() == [[[s, s]] for s in range(5)]
    assert r["attn"][:, 0, 0, 0, 0, 0].tolist() == [10 + s for s in range(5)]
    assert all(ev.waited_on == ["dyntool-writer"] for ev in events)       # never the training thread


def test_streamed_rows_are_written_after_their_copies_land(tmp_path):
    w = StoreWriter(tmp_path / "r.zarr", chunk_steps=1)
    data = np.zeros((1, 1, 1, 4, 4), np.float32)
    ev = LateCopy({"attn": data}, {"attn": 7.0})
    w.write_rows_later(0, [("attn", (slice(None),) * 4, data, data.shape, (1, 1, 1, 4, 4))], ready=ev)
    w.append(0, {"logit_max": np.zeros((1, 1), np.float32)})
    w.close()
    r = RecordReader(open_backend(tmp_path), "r.zarr")
    assert float(r["attn"][0].min()) == 7.0 and ev.waited_on == ["dyntool-writer"]


def test_block_budget_is_sized_for_the_device(monkeypatch):
    assert cheap_stats.block_budget_mib(12.5, "cpu") == 12.5                 # a set value as it is
    assert cheap_stats.block_budget_mib(0, "cpu") == cheap_stats.CPU_BLOCK_MIB == 64
    for total_gib, want in ((80, 2048.0), (24, 768.0), (1, 64.0)):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda dev, t=total_gib: SimpleNamespace(total_memory=t * 2**30))
        assert cheap_stats.block_budget_mib(0, "cuda:0") == want
        assert cheap_stats.block_budget_mib(64, "cuda:0") == 64


@pytest.mark.parametrize("bad", [-1, float("nan")])
def test_negative_budget_is_refused(bad):
    from dyntool.errors import ConfigError
    from dyntool.record.policy import RecordConfig
    with pytest.raises(ConfigError, match="max_block_mib: must be > 0 .MiB. or 0 .sized for the device."):
        RecordConfig(max_block_mib=bad).validate()
