"""The streamed full tier on disk: ``record.heads`` and the crop through ``dyntool train``,
``RunRecorder``, ``HFRecorderCallback`` (same option names); the stored selection equals the
dense record of the same step, its attributes say which model layer/head each index is; bad
selections and budgets are one line, exit 2, nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dyntool.errors import ConfigError
from dyntool.integrations import RunRecorder
from dyntool.record import names
from dyntool.record.sites import site_label
from dyntool.run import open_run
from tests.integration.test_train import rows, train

MATS = names.MATRICES


def test_train_heads_and_crop_equal_the_dense_record(tmp_path):
    """Two identical float64 runs (same seed): one records every head dense, one streams L1H0 and
    L0H* with a query crop; the streamed arrays are the dense ones' slices (float32 storage)."""
    common = ("--max-steps", "2", "--train.dtype=float64", "--record.dtype=float32", "--record.every=1",
              "--train.final_eval=false", "--record.seqs=2")
    rc, dense = train(tmp_path, *common, name="dense")
    assert rc == 0
    rc, part = train(tmp_path, *common, "--record.heads=L1H0,L0H*", "--record.query_crop=[5,13]", name="part")
    assert rc == 0
    d, p = open_run(dense), open_run(part)
    assert not p.problems and list(p.steps) == list(d.steps) == [0, 1]
    at = p.store.attrs
    assert at["layers"] == [0, 1] and at["heads"] == [[0, 1], [0, -1]] and "layers" not in d.store.attrs
    assert site_label(at, 1) == "L1"
    assert p.arrays["attn"].attrs.get("query_offset") == 5
    for name in p.store.names():
        if names.dims(name)[1:3] != ("layer", "head"):            # per-step scalars
            continue
        got, want = np.asarray(p.arrays[name][:]), np.asarray(d.arrays[name][:])
        if name in MATS:                                          # the crop: query rows 5..12
            want = want[..., 5:13, :]
        np.testing.assert_allclose(got[:, 0, :2], want[:, 0, :2], rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(got[:, 1, 0], want[:, 1, 0], rtol=1e-6, atol=1e-7, err_msg=name)
        if name in MATS and name != "scores":                     # the empty slot: padding
            assert (got[:, 1, 1] == 0).all(), name
        else:
            assert np.isnan(got[:, 1, 1]).all(), name
    assert p.arrays["attn"].shape[-2:] == (8, 16)
    r = {x["step"]: x for x in rows(part)}[1]
    assert "attn_entropy/L1H0" in r and "attn_entropy/L1H1" not in r and "attn_entropy/L0H1" in r
    assert r["attn_entropy/L1H0"] == pytest.approx({x["step"]: x for x in rows(dense)}[1]["attn_entropy/L1H0"],
                                                   rel=1e-9)


@pytest.mark.parametrize("arg,words", [("--record.heads=L2H0", "L2: the model has layers 0..1"),
                                       ("--record.heads=L0H7", "H7: the model has heads 0..1"),
                                       ("--record.heads=L0X1", "unknown head selector"),
                                       ("--record.heads=", "empty head selection"),
                                       ("--record.max_block_mib=0.0001", "too small for one query-row block"),
                                       ("--record.query_crop=[20,30]", "the crop is empty")])
def test_train_bad_selection_exit_2_nothing_written(tmp_path, capsys, arg, words):
    rc, path = train(tmp_path, "--max-steps", "1", arg)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and not path.exists() and not any(tmp_path.iterdir()), err
    assert len(err) == 1 and words in err[0], err


def _gpt2():
    from tests.adapters.hf_reference import make_inputs, make_model
    return make_model("gpt2", "sdpa"), make_inputs("gpt2")


def test_run_recorder_and_hf_callback_take_heads(tmp_path, monkeypatch):
    """The streamed selection equals the dense record, whether the step is gathered on the host
    and written with one call per matrix (it fits HOST_BUFFER_MIB) or written block by block as
    it is computed (it does not); both store row chunks."""
    from dyntool import recorder
    from dyntool.record.store_writer import StoreWriter
    from tests.adapters.hf_reference import float64_softmax
    import threading
    calls, threads, real = [], {}, StoreWriter.write_rows

    def spy(self, name, *a, **k):
        calls.append(name)
        threads.setdefault(host_mib, set()).add(threading.current_thread().name)
        return real(self, name, *a, **k)
    monkeypatch.setattr(StoreWriter, "write_rows", spy)
    with float64_softmax():
        model, inputs = _gpt2()
        out, writes = {}, {}
        for name, heads, host_mib in (("all", "all", 256), ("held", "L1H1", 256), ("rows", "L1H1", 0)):
            monkeypatch.setattr(recorder, "HOST_BUFFER_MIB", host_mib)
            calls.clear()
            with RunRecorder(model, tmp_path, max_steps=1, every=1, probe=inputs, seqs=2, dtype="float32",
                             heads=heads, max_block_mib=4e-3 if heads != "all" else 64, name=name) as rec:
                rec.probe_step(0)
                rec.log(0, loss=1.0)
            out[name], writes[name] = open_run(rec.path), list(calls)
    assert sorted(writes["held"]) == sorted(MATS)                      # one write per matrix
    assert threads[256] == {"dyntool-writer"} and threads[0] == {threading.current_thread().name}
    assert len(writes["rows"]) > len(MATS) and set(writes["rows"]) == set(MATS)   # one per block
    d = out["all"]
    for p in (out["held"], out["rows"]):
        assert not p.problems and p.store.attrs["layers"] == [1] and p.store.attrs["heads"] == [[1]]
        assert len(p.store.attrs["sites"]) == 1 and p.store.attrs["sites"][0]["index"] == 1
        for name in MATS + ("value_grad", "attn_entropy"):
            np.testing.assert_allclose(p.arrays[name][0, 0, 0], d.arrays[name][0, 1, 1], rtol=1e-6, atol=1e-7,
                                       err_msg=name)
        assert p.arrays["attn"]._z.chunks[-2] < p.arrays["attn"].shape[-2]   # stored in row chunks
    with pytest.raises(ConfigError, match="L5: the model has layers 0..1"):
        RunRecorder(model, tmp_path / "no", max_steps=1, every=1, probe=inputs, heads="L5H0")
    with pytest.raises(ConfigError, match="H9: the model has heads 0..1"):
        RunRecorder(model, tmp_path / "no", max_steps=1, every=1, probe=inputs, heads="L0H9")
    assert not (tmp_path / "no").exists()


def test_hf_callback_heads(tmp_path):
    transformers = pytest.importorskip("transformers")
    from dyntool.integrations.hf import HFRecorderCallback
    model, inputs = _gpt2()
    model = model.float().train()
    data = [{k: v[i] for k, v in inputs.items()} for i in range(2)] * 2
    cb = HFRecorderCallback(tmp_path, probe=inputs, every=1, heads="L0H1,L1H*", name="hf")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
                                          logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                                          disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    run = open_run(cb.path)
    assert not run.problems and run.arrays["attn"].shape[1:3] == (2, 2)
    assert run.store.attrs["heads"] == [[1, -1], [0, 1]]
    assert json.loads((cb.path / "config.json").read_text())["record"]["heads"] == "L0H1,L1H*"
    assert torch.isfinite(torch.as_tensor(np.asarray(run.arrays["attn"][0, 0, 0]))).all()
