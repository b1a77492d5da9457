"""bench/gpu_session.sh checked on the CPU (issue 46): ``DRY_RUN=1`` lists every command its parts would
run, and each one's arguments parse (a dyntool command up to the point where it would start training,
a bench script through its argparse), so a lent GPU session does not spend device minutes on a typo;
bench/gpu_parts.py's call plan fits a session and its wind-tunnel chain picks the furthest checkpoint."""
from __future__ import annotations

import argparse
import json
import os
import runpy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
import gpu_parts  # noqa: E402

ALL = ["profile", "timing", "wind-tunnel", "span", "ls-logits", "presets", "tests"]


class Parsed(BaseException):
    """Raised where a checked command would start its work (BaseException: the CLI's handlers let it by)."""


def dry_run(tmp_path, *parts, **env) -> list[tuple[str, list[str]]]:
    # the data folder the commands name exists (train refuses a missing one while checking its config)
    if not (tmp_path / "wikitext-2").exists():
        shutil.copytree(ROOT / "tests" / "data" / "tiny_wikitext", tmp_path / "wikitext-2")
    e = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path / "out"), "WT_DIR": str(tmp_path / "wt"),
         "WIKITEXT": str(tmp_path / "wikitext-2"), **env}
    r = subprocess.run(["bash", str(BENCH / "gpu_session.sh"), *parts], cwd=ROOT, env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln.split(": ", 2) for ln in r.stdout.splitlines() if ln.startswith("dry-run: ")]
    return [(name, shlex.split(cmd)) for _, name, cmd in lines]


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    return dry_run(tmp_path_factory.mktemp("dry"), *ALL)


def test_dry_run_lists_every_part_and_runs_nothing(commands, tmp_path):
    names = [n for n, _ in commands]
    for want in ("recorder_profile", "fused_attention", "recorder_cost", "gpu_check_throughput", "wt_paper_s42",
                 "wt_authors_s42", "study_span", "study_ls_logits_gpu", "preset_ls", "preset_qknorm", "pytest_gpu"):
        assert want in names
    assert names.index("recorder_profile") < names.index("fused_attention") < names.index("wt_paper_s42")
    span = dict(commands)["study_span"]
    assert span[span.index("--arms") + 1] == "baseline,span,c1a-a0.5,ab2,c1b-a2"
    # every command is a line of parts.jsonl; nothing else was made
    rows = dry_run(tmp_path, "profile")
    assert rows and not (tmp_path / "wt").exists() and not (tmp_path / "out" / "results.tgz").exists()
    line = json.loads((tmp_path / "out" / "parts.jsonl").read_text().splitlines()[0])
    assert line["part"] == "profile" and line["rc"] is None and "gpu_recorder_cost.py" in line["command"]


def _dyntool(argv: list[str], monkeypatch) -> None:
    """Run ``dyntool argv`` until it would train: every flag, preset and override is checked on the way."""
    from dyntool.cli import main
    from dyntool.sims import bijection
    from dyntool.train import runner

    def stop(*a, **k):
        raise Parsed
    monkeypatch.setattr(bijection, "run_bijection", stop)
    monkeypatch.setattr(runner, "run_training", stop)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)    # the gpu presets are refused without one
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(Parsed):
        rc = main(argv)
        pytest.fail(f"dyntool {' '.join(argv)} returned {rc} before it would train")


def _bench(script: str, args: list[str], monkeypatch) -> None:
    """Parse a bench script's arguments with its own parser, then stop."""
    real = argparse.ArgumentParser.parse_args

    def parse(self, a=None, ns=None):
        real(self, a, ns)
        raise Parsed
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse)
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(Parsed):
        runpy.run_path(str(ROOT / script), run_name="__main__")


def test_every_command_parses_its_arguments(commands, monkeypatch, tmp_path):
    checked = 0
    for name, cmd in commands:
        assert cmd[0] == "python3", name
        if cmd[1:3] == ["-m", "dyntool"]:
            argv = [a.replace(str(Path(cmd[cmd.index("--out") + 1])), str(tmp_path / name)) for a in cmd[3:]]
            _dyntool(argv, monkeypatch)
        elif cmd[1:3] == ["-m", "pytest"]:
            assert all((ROOT / p).exists() for p in cmd[3:]), name
        else:
            _bench(cmd[1], cmd[2:], monkeypatch)
        checked += 1
    assert checked == len(commands) >= 11


def test_a_broken_argument_is_caught(monkeypatch, tmp_path):
    """The check can fail: a misspelt override, an unknown flag of a bench script."""
    with pytest.raises(BaseException) as e:
        _dyntool(["sim", "bijection", "--preset", "paper", "--no_such_key=1", "--out", str(tmp_path)], monkeypatch)
    assert not isinstance(e.value, Parsed)
    with pytest.raises(SystemExit):
        _bench("bench/gpu_fused_attention.py", ["--no-such-flag"], monkeypatch)


def test_the_wind_tunnel_resumes_the_furthest_checkpoint_of_its_chain(tmp_path):
    def run(name: str, step: int, steps: int = 100) -> None:
        (tmp_path / name).mkdir()
        torch.save({"step": step}, tmp_path / name / "checkpoint.pt")
        (tmp_path / name / "config.json").write_text(json.dumps({"steps": steps}))
    assert gpu_parts.resume_from(tmp_path, "wt_paper_s42") == ""
    run("wt_paper_s42", 30)
    run("wt_paper_s42-resume30", 70)
    run("wt_authors_s42", 90)
    assert gpu_parts.resume_from(tmp_path, "wt_paper_s42") == str(tmp_path / "wt_paper_s42-resume30")
    run("wt_paper_s42-resume30-resume70", 100)                      # at its steps: nothing to continue
    assert gpu_parts.resume_from(tmp_path, "wt_paper_s42") == ""


@pytest.mark.slow      # three torch imports in the script's subprocesses: 15-35 s on 2 loaded cores
def test_the_script_continues_each_chain_it_finds(tmp_path):
    def run(name: str, step: int, steps: int = 100) -> None:
        (tmp_path / name).mkdir()
        torch.save({"step": step}, tmp_path / name / "checkpoint.pt")
        (tmp_path / name / "config.json").write_text(json.dumps({"steps": steps}))
    run("wt_paper_s42", 30)
    run("wt_paper_s42-resume30", 70)
    run("wt_authors_s42", 90)
    cmds = dict(dry_run(tmp_path / "out", "wind-tunnel", WT_DIR=str(tmp_path), WT_RUNS="paper:42 authors:42 paper:7"))
    assert cmds["wt_paper_s42_from_wt_paper_s42-resume30"][5:7] == ["--resume", str(tmp_path / "wt_paper_s42-resume30")]
    assert cmds["wt_authors_s42_from_wt_authors_s42"][5:7] == ["--resume", str(tmp_path / "wt_authors_s42")]
    assert "--preset" in cmds["wt_paper_s7"] and len(cmds) == 3


def test_the_plan_fits_a_session_in_priority_order():
    calls = gpu_parts.plan(gpu_parts.owed({}))
    flat = [p for c, _ in calls for p in c]
    assert flat == ["profile", "timing", "wind-tunnel"]          # issue 46's first three, in its order
    assert all(d <= gpu_parts.CALL_S for _, d in calls)
    assert sum(min(gpu_parts.SECONDS[p], d) for c, d in calls for p in c) + gpu_parts.START_S <= gpu_parts.SESSION_S
    assert calls[-1] == (["wind-tunnel"], 210)                   # the rest of the session; it resumes next time
    # everything measured (timing since the kernel's rewrite): only the tests are owed, in one call
    done = {"a": {"date": "2026-11-28", **{k: 1.0 for k in gpu_parts.KEYS}}}
    assert gpu_parts.plan(gpu_parts.owed(done)) == [(["tests"], gpu_parts.CALL_S)]
    assert "timing" in gpu_parts.owed({"a": {**done["a"], "date": "2026-11-27"}})


def test_the_skeleton_holds_every_key_with_a_reason(tmp_path):
    (tmp_path / "hardware.txt").write_text("NVIDIA H100 80GB HBM3\n")
    rows = [{"part": "profile", "rc": 0, "command": "python3 a", "commit": "abc"},
            {"part": "timing", "rc": 124, "command": "python3 b", "commit": "abc"}]
    (tmp_path / "parts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = gpu_parts.skeleton(tmp_path)
    assert d["hardware"] == "NVIDIA H100 80GB HBM3" and d["commit"] == "abc" and d["commands"] == ["python3 a", "python3 b"]
    assert gpu_parts.problems("s.json", d) == []
    assert "ran" in d["why_null"]["profile_recorded_step_T2048"]
    assert "time limit" in d["why_null"]["fused_vs_sdpa_T2048"]
    assert "not reached" in d["why_null"]["best_val_ppl_ls"]


@pytest.mark.slow      # three calls of the script, two small runs: ~125 s on 2 loaded cores
def test_the_wind_tunnel_part_runs_and_continues_across_calls_on_the_cpu(tmp_path):
    """The part for real (WT_DEVICE=cpu, the ci preset): a first call stopped at step 5, a second one
    that continues the chain to its 12 steps with --resume, a third with nothing left to do."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WT_DIR": str(tmp_path / "wt"), "WT_RUNS": "ci:42",
           "WT_DEVICE": "cpu", "WT_MIN": "1", "COMMIT": "abc"}

    def call(**more):
        r = subprocess.run(["bash", str(BENCH / "gpu_session.sh"), "wind-tunnel"], cwd=ROOT, env={**env, **more},
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout
    call(WT_ARGS="--stop_at_step=5")
    assert sorted(p.name for p in (tmp_path / "wt").iterdir()) == ["wt_ci_s42"]
    call()
    assert sorted(p.name for p in (tmp_path / "wt").iterdir()) == ["wt_ci_s42", "wt_ci_s42-resume5"]
    final = json.loads((tmp_path / "wt" / "wt_ci_s42-resume5" / "meta.json").read_text())["final"]
    assert final["steps_done"] == 12 and not final["stopped_early"]
    assert "nothing to continue" in call()
    rows = [json.loads(x) for x in (tmp_path / "out" / "parts.jsonl").read_text().splitlines()]
    assert [r["rc"] for r in rows] == [0, 0] and all(r["commit"] == "abc" for r in rows)
    assert "--resume" in rows[1]["command"] and (tmp_path / "out" / "results.tgz").is_file()
    sk = gpu_parts.skeleton(tmp_path / "out")
    assert sk["why_null"]["wind_tunnel_100k_paper"].startswith("ran") and gpu_parts.problems("s", sk) == []
