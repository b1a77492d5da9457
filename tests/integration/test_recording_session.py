"""One recording session (issue 51): the trainer's recording callback and a user's loop through
``RunRecorder`` drive the same machinery, so the same recording made both ways is the same record
and the same metrics.

The same model, data and seed are trained twice by the trainer: once recording with its own
callback, once with its recording off and a ``RunRecorder`` driven the way a plain loop drives it
(``probe_step`` before the step, ``train_step`` around each micro-step, ``log`` after it), on the
trainer's own probe batch.  Recording never touches training, so both runs take the same steps
(their losses agree exactly) and record the same model states."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from dyntool.data.wikitext import fixed_batch
from dyntool.flight import STATS
from dyntool.integrations import RunRecorder
from dyntool.record import metric_names as mn
from dyntool.run import open_run
from dyntool.train.runner import load_config, run_training
from dyntool.train.trainer import Callback

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = [f"--data.path={REPO / 'tests' / 'data' / 'tiny_wikitext'}", "--data.batch_size=4",
             "--data.block_size=16", "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=16",
             "--model.dropout=0.0", "--optim.accum=2", "--optim.warmup_steps=1", "--train.max_steps=5",
             "--train.eval_every=0", "--train.final_eval=off", "--train.logit_stat=exact",
             "--record.batch=probe", "--record.every=2", "--record.seqs=2", "--record.dtype=float32",
             "--record.cheap_every=3", "--train.log_every=1"]


class PlainLoopRecorder(Callback):
    """What a user's loop does with ``RunRecorder``, done from inside the trainer."""

    def __init__(self, out: Path, rc):
        self.out, self.rc = out, rc

    def on_train_start(self, trainer) -> None:
        cfg, rc = trainer.cfg, self.rc
        d = cfg.data
        probe = fixed_batch(trainer.corpus.split(d.probe_split), rc.seqs, d.block_size, d.probe_offset,
                            trainer.device)
        self.trainer = trainer
        self.rec = RunRecorder(trainer.raw, self.out, max_steps=cfg.train.max_steps, every=rc.every,
                               probe=probe, seqs=rc.seqs, dtype=rc.dtype, cheap_every=rc.cheap_every,
                               name="loop")

    def on_step_start(self, step: int) -> None:
        self.rec.probe_step(step)

    def micro_step_context(self, step: int, micro: int):
        return self.rec.train_step(step, grad_scale=self.trainer.grad_scale)

    def on_step_end(self, step: int, metrics: dict) -> None:
        self.rec.log(step, loss=metrics["loss"])

    def on_train_end(self, final: dict) -> None:
        self.rec.close()


def _rows(path: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in (path / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["step"], {}).update(r)
    return out


def test_the_trainer_and_run_recorder_record_the_same(tmp_path):
    cfg = load_config(None, None, OVERRIDES)
    trainer_path, _ = run_training(cfg, str(tmp_path), name="trainer", quiet=True)
    plain = PlainLoopRecorder(tmp_path, cfg.record)
    off = dataclasses.replace(cfg, record=dataclasses.replace(cfg.record, enabled=False))
    run_training(off, str(tmp_path), name="off", quiet=True, callbacks=[plain])

    a, b = open_run(trainer_path), open_run(plain.rec.path)
    assert list(a.steps) == list(b.steps) == [0, 2, 4]
    assert a.store.names() == b.store.names() and "attn" in a.store.names()
    for name in a.store.names():                     # the same model states, recorded the same way
        np.testing.assert_array_equal(a.store[name][:], b.store[name][:], err_msg=name)

    ra, rb = _rows(trainer_path), _rows(plain.rec.path)
    assert sorted(ra) == sorted(rb) == [0, 1, 2, 3, 4]
    checked = 0
    for step in ra:
        assert ra[step]["loss"] == rb[step]["loss"], step          # the same training
        heads = [_per_head(ra[step]), _per_head(rb[step])]
        assert heads[0] == heads[1], step
        for k in heads[0] | ({"probe_loss"} if step % 2 == 0 else set()):
            assert ra[step][k] == pytest.approx(rb[step][k], rel=1e-6, abs=1e-9), (step, k)
            checked += 1
    # the full tier on 0, 2, 4 (the probe's entropy), the cheap tier on 0 and 3 (its entropy wins on 0)
    assert [s for s in ra if mn.head(mn.ATTN_ENTROPY, 1, 1) in ra[s]] == [0, 2, 3, 4]
    assert [s for s in ra if mn.head(mn.SCORE_GRAD_NORM, 1, 1) in ra[s]] == [0, 3]
    n_cheap = len([n for n in STATS if n not in (mn.LOGIT_MAX, mn.SINK_MASS)])     # no sinks here
    assert checked == 2 * 4 * n_cheap + 2 * 4 + 3              # 2 cheap steps, 2 full-tier-only, 3 probes


def _per_head(row: dict) -> set[str]:
    """The row's per-head columns both recorders write: the entropy and the cheap tier's statistics
    (not max |logit|: the trainer's is its per-step statistic, RunRecorder's the recorded batch's)."""
    return {k for k in row if "/L" in k and k.split("/")[0] in {mn.ATTN_ENTROPY, *STATS} - {mn.LOGIT_MAX}}
