"""``dyntool figures`` given two recorded runs: each recorded_* figure is one run's grid, so the
command names the run it did not draw (and how to draw it) instead of leaving it out silently."""
from __future__ import annotations

import pytest
import torch

from dyntool.cli import main
from dyntool.integrations import RunRecorder

transformers = pytest.importorskip("transformers")


def _record(root, name: str, seed: int) -> None:
    torch.manual_seed(seed)
    T = 8
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=20, n_positions=T, n_embd=16, n_layer=1, n_head=2, attn_pdrop=0.0, resid_pdrop=0.0,
        embd_pdrop=0.0))
    probe = torch.arange(T).view(1, T)
    with RunRecorder(model, root, max_steps=2, every=1, name=name, probe={"input_ids": probe, "labels": probe}) as rec:
        for step in range(2):
            rec.probe_step(step)
            rec.log(step, loss=1.0)


def test_two_recorded_runs_the_one_not_drawn_is_named(tmp_path, capsys):
    root = tmp_path / "runs"
    _record(root, "first", 0)
    _record(root, "second", 1)
    out = tmp_path / "figs"
    rc = main(["figures", str(root / "first"), str(root / "second"), "--out", str(out), "--format", "png",
               "--only", "recorded_attn,recorded_head_stats"])
    assert rc == 0
    text = capsys.readouterr().out
    notes = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("note")]
    assert len(notes) == 1, text
    assert notes[0].startswith("note    recorded_attn, recorded_head_stats drew ")
    assert f"drew {root / 'first'} only; not drawn: {root / 'second'}" in notes[0]
    assert "first" in (out / "recorded_attn.txt").read_text()
    # one run: nothing to name
    rc = main(["figures", str(root / "second"), "--out", str(tmp_path / "f2"), "--format", "png",
               "--only", "recorded_attn"])
    assert rc == 0 and "not drawn" not in capsys.readouterr().out
