"""``dyntool sim icl-markov --resume STUDY`` (dyntool/sims/icl_markov_resume.py, issue 46): a study
stopped by stop_at_step or SIGINT continues in its folder; a finished run is skipped, the stopped
one continues into ``RUN-resumeSTEP`` whose rows (cheap tier every step, full tier on the schedule)
and final parameters are bitwise the uninterrupted run's on the CPU, and the summary is the same."""
from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

import dyntool
from dyntool.cli import main
from dyntool.sims import icl_markov
from tests.integration.test_sim_resume import _arrays_from, _rows, _same_params, refused_in_one_line

ICL = ["sim", "icl-markov", "--preset", "ci", "--quiet", "--steps", "12", "--eval_every=2",
       "--record.every=4"]


def _summary(study) -> dict:
    s = json.loads((study / "summary.json").read_text())
    for p in s["priors"].values():               # wall times differ
        p.pop("seconds")
        for r in p["per_seed"].values():
            r.pop("seconds")
    return s


def _whole(factory, argv: list[str]):
    """The study that is never stopped, in a folder of its own."""
    out = factory.mktemp("whole")
    assert main(argv + ["--out", str(out), "--name", "whole"]) == 0
    return out / "whole"


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return _whole(tmp_path_factory, ICL)


def _same_run(resumed, whole_run, since: int) -> None:
    assert _rows(resumed)[0]["step"] == since
    assert _rows(resumed) == _rows(whole_run, since=since)
    assert _same_params(resumed, whole_run)
    got, want = _arrays_from(resumed, since), _arrays_from(whole_run, since)
    assert got.keys() == want.keys() and len(got) > 5
    assert all(np.array_equal(got[k], want[k], equal_nan=True) for k in got)


def test_icl_markov_stopped_at_a_step_resumes_bitwise(whole, tmp_path, capsys):
    assert main(ICL + ["--out", str(tmp_path), "--name", "cut", "--stop_at_step=5"]) == 0
    study = tmp_path / "cut"
    hint = f"stopped at step 5; continue with: dyntool sim icl-markov --resume {study}"
    assert hint in capsys.readouterr().out
    assert json.loads((study / "study.json").read_text())["next_step"] == hint
    assert not (study / "summary.json").exists()
    assert [p.name for p in study.iterdir() if p.is_dir()] == ["seed0-dirichlet"]     # the rest not begun
    cut = dyntool.open_run(study / "seed0-dirichlet")
    assert cut.meta["final"]["stopped_early"] and max(cut.metrics.step) == 4          # step 5 not taken
    assert main(["sim", "icl-markov", "--quiet", "--resume", str(study)]) == 0
    _same_run(study / "seed0-dirichlet-resume5", whole / "seed0-dirichlet", 5)
    _same_run(study / "seed0-doubly_stochastic", whole / "seed0-doubly_stochastic", 0)
    assert _summary(study) == _summary(whole)
    assert json.loads((study / "study.json").read_text())["next_step"] is None
    # the summary read back from the folder (dyntool info, figures) joins the chain's rows too
    from dyntool.sims.icl_markov_study import resummarise
    again, once = resummarise([study]), resummarise([whole])
    assert again["skipped"] == {} and again["priors"].keys() == once["priors"].keys()
    for p in once["priors"]:
        a, b = (x["priors"][p]["per_seed"]["0"] for x in (again, once))
        assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}


def test_icl_markov_sigint_in_the_second_run_resumes_it_and_skips_the_first(whole, tmp_path, monkeypatch, capsys):
    real, calls = icl_markov.train_step, []

    def step(*a, **k):
        calls.append(1)
        if len(calls) == 12 + 7:               # the second run's step 6 (held until it ends)
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)
    monkeypatch.setattr(icl_markov, "train_step", step)
    assert main(ICL + ["--out", str(tmp_path), "--name", "ctrl-c"]) == 130
    study = tmp_path / "ctrl-c"
    hint = f"stopped at step 7; continue with: dyntool sim icl-markov --resume {study}"
    assert hint in capsys.readouterr().err
    assert dyntool.open_run(study / "seed0-doubly_stochastic").meta["next_step"] == hint
    assert json.loads((study / "study.json").read_text())["next_step"] == hint
    first = (study / "seed0-dirichlet" / "meta.json").read_bytes()
    monkeypatch.setattr(icl_markov, "train_step", real)
    # a run of the study names it too
    assert main(["sim", "icl-markov", "--quiet", "--resume", str(study / "seed0-doubly_stochastic")]) == 0
    assert sorted(p.name for p in study.iterdir() if p.is_dir()) == [
        "seed0-dirichlet", "seed0-doubly_stochastic", "seed0-doubly_stochastic-resume7"]
    assert (study / "seed0-dirichlet" / "meta.json").read_bytes() == first               # skipped, untouched
    _same_run(study / "seed0-doubly_stochastic-resume7", whole / "seed0-doubly_stochastic", 7)
    assert _summary(study) == _summary(whole)
    # finished: resuming again trains nothing and makes nothing
    assert main(["sim", "icl-markov", "--quiet", "--resume", str(study)]) == 0
    assert len([p for p in study.iterdir() if p.is_dir()]) == 3


def test_icl_markov_resume_refusals_are_one_line(tmp_path, capsys):
    assert main(["sim", "toy", "--quiet", "--steps", "3", "--out", str(tmp_path), "--name", "toy"]) == 0
    (tmp_path / "sticky").mkdir()
    (tmp_path / "sticky" / "study.json").write_text('{"kind": "sticky-markov-study", "config": {}}')
    cases = [(["sim", "icl-markov", "--resume", str(tmp_path / "toy")], "not an icl-markov study folder"),
             (["sim", "icl-markov", "--resume", str(tmp_path / "nowhere")], "not an icl-markov study folder"),
             (["sim", "icl-markov", "--resume", str(tmp_path / "sticky")], "it is a sticky-markov study, not icl-markov"),
             (["sim", "icl-markov", "--resume", str(tmp_path / "sticky"), "--preset", "ci"], "drop --config")]
    refused_in_one_line(cases, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sticky", "toy"]


# ------------------------------------------------------------------------- sticky-markov (one batch)
STICKY = ["sim", "sticky-markov", "--quiet", "--seeds", "42,2024", "--steps", "20", "--T", "60", "--crop", "20",
          "--record.every=5", "--record.pool=10", "--heldout_every=3"]
STICKY_RUNS = ["seed2024-em", "seed2024-sgd", "seed42-em", "seed42-sgd"]


@pytest.fixture(scope="module")
def whole_sticky(tmp_path_factory):
    return _whole(tmp_path_factory, STICKY)


def _same_study(resumed, whole_study, since: int) -> None:
    """Every run's rows and record arrays from ``since``, the final weights and summary.json."""
    for r in STICKY_RUNS:
        assert _rows(resumed / r)[0]["step"] == since
        assert _rows(resumed / r) == _rows(whole_study / r, since=since), r
    got, want = _arrays_from(resumed / "seed42-em", since), _arrays_from(whole_study / "seed42-em", since)
    assert got.keys() == want.keys() and len(got) > 5
    assert all(np.array_equal(got[k], want[k], equal_nan=True) for k in got)
    assert _same_params(resumed, whole_study)                # the study's checkpoint: the batched weights
    assert json.loads((resumed / "summary.json").read_text()) == json.loads((whole_study / "summary.json").read_text())


def test_sticky_markov_stopped_at_a_step_resumes_bitwise(whole_sticky, tmp_path, capsys):
    assert main(STICKY + ["--out", str(tmp_path), "--name", "cut", "--stop_at_step=7"]) == 0
    study = tmp_path / "cut"
    hint = f"stopped at step 7; continue with: dyntool sim sticky-markov --resume {study}"
    assert hint in capsys.readouterr().out
    assert json.loads((study / "study.json").read_text())["next_step"] == hint and not (study / "summary.json").exists()
    assert all(dyntool.open_run(study / r).meta["final"]["next_step"] == hint for r in STICKY_RUNS)
    assert max(dyntool.open_run(study / "seed42-sgd").metrics.step) == 6
    capsys.readouterr()
    assert main(["info", str(study)]) == 0                   # `dyntool info` of the study says it too
    assert f"continue dyntool sim sticky-markov --resume {study}" in capsys.readouterr().out
    assert main(["sim", "sticky-markov", "--quiet", "--resume", str(study)]) == 0
    resumed = tmp_path / "cut-resume7"                       # beside the study it resumes
    _same_study(resumed, whole_sticky, 7)
    assert dyntool.open_run(resumed / "seed42-em").meta["resumed_from"] == {"run": str(study / "seed42-em"), "step": 7}
    # at its steps: nothing to do, no study made
    capsys.readouterr()
    assert main(["sim", "sticky-markov", "--resume", str(resumed)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut", "cut-resume7"]


def test_sticky_markov_interrupted_by_sigint_resumes_bitwise(whole_sticky, tmp_path, monkeypatch, capsys):
    """SIGINT inside step 11 (held until the step ends): the study checkpoints at 12 steps taken."""
    from dyntool.sims import sticky
    real = sticky._Logging.on_metrics

    def on_metrics(self, step, m):
        if step == 11:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, step, m)
    monkeypatch.setattr(sticky._Logging, "on_metrics", on_metrics)
    assert main(STICKY + ["--out", str(tmp_path), "--name", "ctrl-c"]) == 130
    study = tmp_path / "ctrl-c"
    hint = f"stopped at step 12; continue with: dyntool sim sticky-markov --resume {study}"
    assert hint in capsys.readouterr().err
    assert dyntool.open_run(study / "seed42-sgd").status == "interrupted"
    assert json.loads((study / "study.json").read_text())["next_step"] == hint
    monkeypatch.setattr(sticky._Logging, "on_metrics", real)
    assert main(["sim", "sticky-markov", "--quiet", "--resume", str(study)]) == 0
    _same_study(tmp_path / "ctrl-c-resume12", whole_sticky, 12)


def test_sticky_markov_resume_refusals_are_one_line(whole_sticky, tmp_path, capsys):
    (tmp_path / "icl").mkdir()
    (tmp_path / "icl" / "study.json").write_text('{"kind": "icl-markov-study", "config": {}}')
    cases = [(["sim", "sticky-markov", "--resume", str(tmp_path / "nowhere")], "not a sticky-markov study folder"),
             (["sim", "sticky-markov", "--resume", str(tmp_path / "icl")], "it is a icl-markov study, not sticky-markov"),
             (["sim", "sticky-markov", "--resume", str(whole_sticky / "seed42-em")], "not a sticky-markov study"),
             (["sim", "sticky-markov", "--resume", str(whole_sticky), "--controls"], "drop --config"),
             (["sim", "sticky-markov", "--resume", str(whole_sticky), "--steps", "30", "--seeds", "1"],
              "keeps its seeds, arms and sizes")]
    refused_in_one_line(cases, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["icl"]
    assert sorted(p.name for p in whole_sticky.parent.iterdir()) == ["whole"]


def test_a_time_limit_already_past_still_takes_a_step_per_call(tmp_path, capsys):
    """--time_limit_min stops before a step begun past it, but a call's first step is always taken:
    a study longer than a call gets further in each one (sticky: a new study; icl-markov: its folder)."""
    sticky = ["sim", "sticky-markov", "--quiet", "--seeds", "42", "--steps", "3", "--T", "30", "--crop", "8"]
    assert main(sticky + ["--out", str(tmp_path), "--name", "s", "--time_limit_min=1e-9"]) == 0
    assert main(["sim", "sticky-markov", "--quiet", "--resume", str(tmp_path / "s")]) == 0
    assert "stopped at step 2; continue with" in capsys.readouterr().out.splitlines()[-1]
    assert [r["step"] for r in _rows(tmp_path / "s-resume1" / "seed42-em")] == [1]
    icl = ICL[:5] + ["--steps", "2", "--eval_every=1", "--control=false"]
    assert main(icl + ["--out", str(tmp_path), "--name", "i", "--time_limit_min=1e-9"]) == 0
    assert main(["sim", "icl-markov", "--quiet", "--resume", str(tmp_path / "i")]) == 0
    assert [r["step"] for r in _rows(tmp_path / "i" / "seed0-dirichlet-resume1")] == [1]
    assert (tmp_path / "i" / "summary.json").exists()
