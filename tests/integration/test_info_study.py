"""``dyntool info STUDY``: characters as characters (not ``\\u00b1`` escapes), and a screenful:
long summaries and long run tables end in a line that says where the rest is."""
from __future__ import annotations

import json
import shutil

import pytest

from dyntool import cli
from dyntool.cli import runs as runs_cli
from tests.app import fixtures


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return fixtures.make_sticky_study(tmp_path_factory.mktemp("runs"), name="study", seeds=(0,), steps=3)


def test_info_on_a_long_study_prints_characters_and_summarises(base, tmp_path, capsys, monkeypatch):
    study = tmp_path / "study"
    shutil.copytree(base, study)
    summary = json.loads((study / "summary.json").read_text())
    summary = {"table": {f"arm{i}": {"loss": f"{i}.0 ± 0.{i}", "steps": i} for i in range(200)}, **summary}
    (study / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(runs_cli, "STUDY_RUNS", 1)             # two runs: one shown, one summarised
    assert cli.main(["info", str(study)]) == 0
    out = capsys.readouterr().out
    assert "\\u00b1" not in out and "table.arm0.loss=\"0.0 ± 0.0\"" in out
    lines = out.splitlines()
    assert len(lines) < 40, len(lines)
    assert any(ln.strip().startswith("…") and "more lines of values: see" in ln and "summary.json" in ln
               for ln in lines)
    assert lines[-1] == f"… 1 more runs: `dyntool ls {study}` lists them all"


def test_a_short_study_is_shown_whole(base, capsys):
    assert cli.main(["info", str(base)]) == 0
    out = capsys.readouterr().out
    assert "more runs" not in out and "more lines" not in out
    assert "seed0-em" in out and "seed0-sgd" in out


def test_a_corrupt_summary_is_said_by_info_and_fails_check(base, tmp_path, capsys):
    """Was: ignored silently (info said nothing, check: '2 of 2 run(s) ok', exit 0)."""
    study = tmp_path / "study"
    shutil.copytree(base, study)
    assert cli.main(["check", str(study)]) == 0
    capsys.readouterr()
    (study / "summary.json").write_text('{"arms": {"sgd"')                    # cut mid-write
    assert cli.main(["info", str(study)]) == 0
    out = capsys.readouterr().out
    assert "problem  summary.json is corrupted" in out and "see " not in out
    assert cli.main(["check", str(study)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{study}: summary.json is corrupted") and out[-1] == "2 of 2 run(s) ok"


def test_a_plain_folder_of_runs_points_at_no_summary(base, tmp_path, capsys):
    """Was: 'see FOLDER/summary.json' for a folder that has none."""
    folder = tmp_path / "runs"
    shutil.copytree(base, folder)
    (folder / "summary.json").unlink()
    assert cli.main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "summary.json" not in out and "problem" not in out
    assert cli.main(["check", str(folder)]) == 0
