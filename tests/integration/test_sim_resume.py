"""``dyntool sim toy|bijection --resume RUN`` (dyntool/sims/resume.py, issue 46): a simulation stopped
by SIGINT/SIGTERM, its step budget (``stop_at_step``) or a smaller ``steps`` continues into a new run
``RUN-resumeSTEP`` whose metric rows, record arrays and final parameters are bitwise those of the
uninterrupted run (on the CPU, where every RNG state is saved)."""
from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch

import dyntool
from dyntool.cli import main
from dyntool.sims import bijection
from tests.integration.test_s3 import BUCKET, s3  # noqa: F401  (the module's local S3 server)

BIJ = ["sim", "bijection", "--config", "bijection", "--preset", "ci", "--quiet"]
TOY = ["sim", "toy", "--quiet", "--steps"]
VOLATILE = {"elapsed_s", "time", "wall_s"}


def _rows(run, since: int = 0) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows if r["step"] >= since]


def _params(run) -> dict:
    return torch.load(run / "checkpoint.pt", weights_only=True)["model"]


def _same_params(a, b) -> bool:
    pa, pb = _params(a), _params(b)
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def _arrays_from(run, since: int) -> dict:
    r = dyntool.open_run(run)
    steps = np.asarray(r.steps)
    keep = steps >= since
    return {n: np.asarray(a[:])[keep] for n, a in r.arrays.items() if a.shape[:1] == steps.shape}


def refused_in_one_line(cases, capsys) -> None:
    """Each ``(argv, words)``: the CLI exits 2 with one line on stderr that holds ``words``."""
    for argv, says in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and says in err, (argv, err)


def test_toy_resumed_from_a_smaller_step_budget_equals_the_uninterrupted_run(tmp_path, capsys):
    assert main(TOY + ["10", "--out", str(tmp_path), "--name", "whole"]) == 0
    assert main(TOY + ["4", "--out", str(tmp_path), "--name", "part"]) == 0
    assert main(["sim", "toy", "--quiet", "--resume", str(tmp_path / "part"), "--steps", "10"]) == 0
    resumed = tmp_path / "part-resume4"                      # beside the run it resumes
    assert _rows(resumed)[0]["step"] == 4
    assert _rows(resumed) == _rows(tmp_path / "whole", since=4)
    assert _same_params(resumed, tmp_path / "whole")
    got, want = _arrays_from(resumed, 4), _arrays_from(tmp_path / "whole", 4)
    assert got.keys() == want.keys() and len(got) > 5
    assert all(np.array_equal(got[k], want[k], equal_nan=True) for k in got)
    meta = dyntool.open_run(resumed).meta
    assert meta["resumed_from"] == {"run": str(tmp_path / "part"), "step": 4}
    # at its steps already: nothing to do, one line, exit 0, no run made
    capsys.readouterr()
    assert main(["sim", "toy", "--resume", str(tmp_path / "whole")]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part", "part-resume4", "whole"]


@pytest.fixture(scope="module")
def whole_bijection(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    assert main(BIJ + ["--out", str(out), "--name", "whole"]) == 0
    return out / "whole"


def test_bijection_stopped_at_a_step_budget_resumes_bitwise(whole_bijection, tmp_path, capsys):
    assert main(BIJ + ["--out", str(tmp_path), "--name", "cut", "--stop_at_step=5"]) == 0
    out = capsys.readouterr().out
    assert f"continue with: dyntool sim bijection --resume {tmp_path / 'cut'}" in out
    cut = dyntool.open_run(tmp_path / "cut")
    assert cut.meta["final"]["stopped_early"] and "--resume" in cut.meta["final"]["next_step"]
    # the resumed run goes on to `steps` (stop_at_step is reset), beside the run it resumes
    assert main(["sim", "bijection", "--quiet", "--resume", str(tmp_path / "cut")]) == 0
    resumed = tmp_path / "cut-resume5"
    assert _rows(resumed) == _rows(whole_bijection, since=5)
    assert _same_params(resumed, whole_bijection)
    got, want = _arrays_from(resumed, 5), _arrays_from(whole_bijection, 5)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k], equal_nan=True) for k in got)
    f_res, f_whole = (dyntool.open_run(r).meta["final"] for r in (resumed, whole_bijection))
    for k in ("loss", "acc_query", "geometry", "paper_i", "steps_done"):
        assert f_res[k] == f_whole[k], k


def test_bijection_interrupted_by_sigint_says_the_resume_command_and_resumes_bitwise(
        whole_bijection, tmp_path, monkeypatch, capsys):
    """SIGINT lands inside step 6 (held until the step ends): the run checkpoints at 7 steps taken,
    is marked interrupted with the command that continues it, and the resumed run is the whole one."""
    real = bijection.Step.__call__

    def call(self, step, gen, check=True):
        if step == 6:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, step, gen, check)
    monkeypatch.setattr(bijection.Step, "__call__", call)
    assert main(BIJ + ["--out", str(tmp_path), "--name", "ctrl-c"]) == 130
    err = capsys.readouterr().err
    hint = f"stopped at step 7; continue with: dyntool sim bijection --resume {tmp_path / 'ctrl-c'}"
    assert hint in err and "the same command" not in err
    run = dyntool.open_run(tmp_path / "ctrl-c")
    assert run.status == "interrupted" and run.meta["next_step"] == hint
    monkeypatch.setattr(bijection.Step, "__call__", real)
    assert main(["sim", "bijection", "--quiet", "--resume", str(tmp_path / "ctrl-c")]) == 0
    resumed = tmp_path / "ctrl-c-resume7"
    assert _rows(resumed) == _rows(whole_bijection, since=7)
    assert _same_params(resumed, whole_bijection)


def test_resume_refusals_are_one_line_and_make_nothing(tmp_path, capsys):
    assert main(TOY + ["5", "--out", str(tmp_path), "--name", "toy"]) == 0
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text("{}")
    cases = [(["sim", "bijection", "--resume", str(tmp_path / "toy")], "it is a toy run, not bijection"),
             (["sim", "toy", "--resume", str(tmp_path / "toy"), "--preset", "causal"], "drop --config/--preset"),
             (["sim", "toy", "--resume", str(tmp_path / "bare")], "no checkpoint.pt"),
             (["sim", "toy", "--resume", str(tmp_path / "nowhere")], "no config.json"),
             (["sim", "toy", "--resume", str(tmp_path / "toy"), "--steps", "9", "--model.d_k=3"], "model size")]
    refused_in_one_line(cases, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bare", "toy"]


@pytest.mark.slow      # the local S3 server and three runs: ~20 s on 2 loaded cores
def test_a_run_in_object_storage_resumes_beside_itself(s3, capsys):   # noqa: F811
    """``--resume s3://…/RUN``: the checkpoint is one PUT, read back through the run's backend."""
    from dyntool.run import open_run
    base = f"s3://{BUCKET}/resume"
    assert main(TOY + ["6", "--out", base, "--name", "whole"]) == 0
    assert main(TOY + ["3", "--out", base, "--name", "part"]) == 0
    assert main(["sim", "toy", "--quiet", "--resume", f"{base}/part", "--steps", "6"]) == 0
    resumed, whole = open_run(f"{base}/part-resume3"), open_run(f"{base}/whole")
    assert resumed.status == "finished" and not resumed.problems
    strip = lambda rows: [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]   # noqa: E731
    assert strip(resumed.metrics.to_dict("records")) == strip(whole.metrics[whole.metrics.step >= 3].to_dict("records"))
