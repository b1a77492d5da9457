"""The recording session's pieces that need no training loop: rank 0's run reaching every rank
(or its refusal), and a row's pending cheap-tier values read when it is written."""
from __future__ import annotations

import pytest
import torch

from dyntool.errors import RunError
from dyntool.flight import PendingMetrics
from dyntool.recording_session import CHEAP, rank_writers, resolved
from dyntool.run_writer import RankRun, RunWriter


def test_rank_writers_hand_rank_0s_run_to_every_rank(tmp_path):
    sent = []

    def on_rank_0(obj):                       # a one-process stand-in for broadcast: rank 0's object back
        sent.append(obj)
        return obj
    run, own = rank_writers(0, lambda: RunWriter.create(tmp_path, "loop", {}, name="r"), on_rank_0)
    assert own is run and sent == [("ok", str(run.path))]
    run0, own1 = rank_writers(1, lambda: pytest.fail("only rank 0 makes the run"), lambda obj: sent[0])
    assert run0 is None and isinstance(own1, RankRun) and own1.rank == 1
    assert str(own1.path) == str(run.path)
    own1.open_store(attrs={"rank": 1}).close()
    assert (run.path / "record.rank1.zarr").is_dir()
    run.finish()


def test_rank_0s_refusal_is_raised_on_every_rank():
    sent = []

    def refuse():
        raise RunError("runs/x exists")
    with pytest.raises(RunError, match="runs/x exists"):
        rank_writers(0, refuse, lambda obj: sent.append(obj) or obj)
    assert sent == [("error", "runs/x exists")]           # the others hear it before rank 0 raises
    with pytest.raises(RunError, match="runs/x exists"):
        rank_writers(2, refuse, lambda obj: sent[0])
    with pytest.raises(RunError, match="could not create"):
        rank_writers(2, refuse, lambda obj: None)


def test_pending_cheap_values_are_read_when_the_row_is_written_and_win():
    vals = torch.arange(8, dtype=torch.float64).reshape(2, 2, 2)                   # (stats, L, nh)
    later = PendingMetrics(["attn_entropy", "score_max"], vals, {})
    row = {"attn_entropy/L0H0": -1.0, "probe_loss": 2.5, CHEAP: later}
    out = resolved(row)
    assert CHEAP not in out and CHEAP in row                      # the row itself is left as it was
    assert out["attn_entropy/L0H0"] == 0.0 and out["score_max/L1H1"] == 7.0 and out["probe_loss"] == 2.5
    assert len(out) == 1 + 8
    plain = {"loss": 1.0}
    assert resolved(plain) is plain
