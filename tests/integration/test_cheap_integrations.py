"""The cheap tier through RunRecorder, HFRecorderCallback and LightningRecorder: the same option
names as ``dyntool train`` (cheap_every, cheap_seqs, max_block_mib), metrics in each step's row."""
from __future__ import annotations

import json

import pytest
import torch

from dyntool.flight import STATS, full_tier_reduction
from dyntool.integrations import RunRecorder
from dyntool.record import metric_names as mn
from dyntool.run import open_run
from tests.adapters.hf_reference import float64_softmax, make_inputs, make_model

FULL = ("attn", "compat", "expected_compat", "column_usage", "scores", "logit_max", "attn_entropy",
        "score_grad", "upstream", "value_grad")


def rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def head_table(row, name, L, H):
    return torch.tensor([[row[mn.head(name, l, h)] for h in range(H)] for l in range(L)], dtype=torch.float64)


def test_run_recorder_both_tiers_on_one_hf_step(tmp_path):
    """Llama (GQA, padding) in a plain loop: the full tier on the training batch and the cheap tier
    on the same steps share one adapter; the row's cheap statistics equal the recorded full tier's
    reduction (float32 storage); cheap_every=2 leaves odd steps without them."""
    with float64_softmax():
        model = make_model("llama", "sdpa")
        inputs = make_inputs("llama")
        with RunRecorder(model, tmp_path, max_steps=3, every=1, batch="train", seqs=2, dtype="float32",
                         cheap_every=1, name="both") as rec:
            for step in range(3):
                with rec.train_step(step):
                    model(**inputs).loss.backward()
                model.zero_grad()
                rec.log(step, loss=1.0)
        run, m = open_run(rec.path), rows(rec.path)
        assert [r["step"] for r in m] == [0, 1, 2] and all(r["loss"] == 1.0 for r in m)
        for i, r in enumerate(m):
            full = full_tier_reduction({n: torch.as_tensor(run.arrays[n][i]).double() for n in FULL})
            for name in STATS[:-1]:
                torch.testing.assert_close(head_table(r, name, 2, 4), full[name], rtol=2e-5, atol=1e-7, msg=name)
        with RunRecorder(model, tmp_path, max_steps=4, every=0, batch="train", cheap_every=2, name="two") as rec:
            for step in range(4):
                for micro in range(2):                   # two micro-steps add up in one row
                    with rec.train_step(step, grad_scale=0.5):
                        (0.5 * model(**inputs).loss).backward()
                model.zero_grad()
                rec.log(step, loss=float(step))
        m = rows(rec.path)
        assert [r["step"] for r in m] == [0, 1, 2, 3]
        assert [("attn_entropy/L1H3" in r) for r in m] == [True, False, True, False]


def test_run_recorder_refuses_bad_budget():
    model = make_model("gpt2", "sdpa")
    with pytest.raises(Exception, match="max_block_mib"):
        RunRecorder(model, "unused", max_steps=1, cheap_every=1, max_block_mib=-1, batch="train")


def test_hf_trainer_callback_cheap_tier(tmp_path):
    transformers = pytest.importorskip("transformers")
    from dyntool.integrations.hf import HFRecorderCallback
    model = make_model("gpt2", "sdpa").float().train()
    inputs = make_inputs("gpt2")
    data = [{k: v[i] for k, v in inputs.items()} for i in range(2)] * 4
    cb = HFRecorderCallback(tmp_path, probe=inputs, every=2, cheap_every=1, name="hf")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2,
                                          gradient_accumulation_steps=2, logging_steps=1, report_to=[],
                                          use_cpu=True, save_strategy="no", disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    m = {}
    for r in rows(cb.path):                  # the Trainer's summary comes as a second row of the last step
        m.setdefault(r["step"], {}).update(r)
    for step in range(3):
        assert all(mn.head(n, l, h) in m[step] for n in STATS[:-1] for l in range(2) for h in range(2)), step
        assert m[step]["score_grad_norm/L0H0"] > 0


def test_lightning_callback_cheap_tier(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from dyntool.integrations.lightning import LightningRecorder
    hf = make_model("gpt2", "sdpa").float()
    inputs = make_inputs("gpt2")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = hf

        def training_step(self, batch, i):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = torch.utils.data.DataLoader([{k: v[i] for k, v in inputs.items()} for i in range(2)] * 4, batch_size=2)
    cb = LightningRecorder(tmp_path, probe=inputs, every=0, cheap_every=1, name="pl")
    pl.Trainer(max_steps=3, callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, accelerator="cpu", accumulate_grad_batches=2).fit(Module(), loader)
    got = [r for r in rows(cb.path) if "score_grad_norm/L1H1" in r]
    assert sorted({r["step"] for r in got}) == [0, 1, 2]


def test_run_recorder_cheap_tier_without_train_step_says_so_in_one_line(tmp_path, capsys):
    """cheap_every set but the loop never wraps its steps: one warning line naming the fix
    (once, not per step); the same loop with train_step gets the statistics and no warning."""
    model = make_model("gpt2", "sdpa")
    inputs = make_inputs("gpt2")
    with RunRecorder(model, tmp_path, max_steps=3, every=0, batch="train", cheap_every=1, name="bare") as rec:
        for step in range(3):
            model(**inputs).loss.backward()
            model.zero_grad()
            rec.log(step, loss=1.0)
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    assert err[0].startswith("dyntool: warning: RunRecorder(cheap_every=1) recorded no per-step statistics")
    assert "rec.train_step(step)" in err[0]
    assert not any("attn_entropy/L0H0" in r for r in rows(rec.path))
    with RunRecorder(model, tmp_path, max_steps=2, every=0, batch="train", cheap_every=1, name="wrapped") as rec:
        for step in range(2):
            with rec.train_step(step):
                model(**inputs).loss.backward()
            model.zero_grad()
            rec.log(step, loss=1.0)
    assert "warning" not in capsys.readouterr().err
    assert all("attn_entropy/L0H0" in r for r in rows(rec.path))


def test_run_recorder_cheap_tier_never_logged_warns_at_close(tmp_path, capsys):
    model = make_model("gpt2", "sdpa")
    with RunRecorder(model, tmp_path, max_steps=2, every=0, batch="train", cheap_every=1, name="silent"):
        pass
    err = capsys.readouterr().err
    assert err.count("dyntool: warning: RunRecorder(cheap_every=1) recorded no per-step statistics") == 1
