"""Recording on a CUDA device gives what it gives on the CPU (skipped without a GPU; a lent GPU
session runs ``pytest tests/gpu``).  Two runs of the same float32 config, same seed, one per
device: the step-0 record (taken before any optimizer step, so the weights are equal) and the
cheap tier's step-0 statistics agree to float32 accuracy; dense (every head) and streamed
(``record.heads``; gathered on the host, or written block by block) full tiers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dyntool.record import names
from dyntool.run import open_run
from tests.integration.test_train import rows, train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

COMMON = ("--max-steps", "2", "--train.dtype=float32", "--record.dtype=float32", "--record.every=1",
          "--record.cheap_every=1", "--train.final_eval=false", "--record.seqs=2", "--train.compile=false")


@pytest.mark.parametrize("heads,host_mib", [(None, 256), ("L1H0,L0H*", 256), ("L1H0,L0H*", 0)],
                         ids=["dense", "streamed-held", "streamed-rows"])
def test_cuda_record_equals_cpu_record(tmp_path, monkeypatch, heads, host_mib):
    from dyntool import recorder
    monkeypatch.setattr(recorder, "HOST_BUFFER_MIB", host_mib)   # 0: every block written as computed
    sel = () if heads is None else (f"--record.heads={heads}",)
    runs = {}
    for dev in ("cpu", "cuda"):
        rc, runs[dev] = train(tmp_path, *COMMON, *sel, f"--device={dev}", name=dev)
        assert rc == 0, dev
    c, g = open_run(runs["cpu"]), open_run(runs["cuda"])
    assert not g.problems and list(g.steps) == list(c.steps)
    compared = 0
    for name in c.store.names():
        if names.dims(name)[1:3] != ("layer", "head"):
            continue
        want, got = np.asarray(c.arrays[name][0]), np.asarray(g.arrays[name][0])   # step 0
        scale = np.nanmax(np.abs(want)) or 1.0
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * scale, equal_nan=True, err_msg=name)
        compared += 1
    assert compared >= 10
    r_cpu, r_gpu = rows(runs["cpu"])[0], rows(runs["cuda"])[0]
    cheap = [k for k in r_cpu if k.startswith(("attn_entropy/", "score_grad_norm/", "expected_compat/"))]
    assert cheap
    for k in cheap:
        assert r_gpu[k] == pytest.approx(r_cpu[k], rel=1e-3, abs=1e-6), k


def test_full_tier_step_makes_no_blocking_copy(tmp_path):
    """Recording a step's full tier on the GPU queues its copies and returns: no device-to-host copy
    blocks the training thread (the host reads left are the mask's, once per layer: counted)."""
    import warnings

    from dyntool.train.config import ModelConfig
    from dyntool.record.policy import RecordConfig
    from dyntool.record.store_writer import StoreWriter
    from dyntool.recorder import Recorder
    from dyntool.train.gpt import GPT
    torch.manual_seed(0)
    L = 2
    model = GPT(ModelConfig(n_layer=L, n_head=2, n_embd=32), 64, 32).cuda()
    x = torch.randint(0, 64, (2, 32), device="cuda")
    rec = Recorder(StoreWriter(tmp_path / "r.zarr"), RecordConfig(every=1, seqs=2), max_steps=1, T=32)
    with rec.capture(model) as cap:
        model(x, x)[1].backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rec.record_capture(0, cap)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= L, syncs
    rec.close()
