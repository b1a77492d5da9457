"""``dyntool info`` / ``ls`` details and ``dyntool app`` bad input: the config is never cut
mid-word, a study is summarised, sizes are real disk usage, a bad port or address is one line."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys

import pytest

from dyntool import cli
from dyntool.run import open_run
from tests.app import fixtures


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return fixtures.make_sticky_study(root, name="study", seeds=(0,), steps=3)


def test_info_prints_every_config_value_whole(study, capsys):
    run = study / "seed0-em"
    cfg = json.loads((run / "config.json").read_text())
    cfg["note"] = "a long sentence-like value " * 20          # longer than a line
    (run / "config.json").write_text(json.dumps(cfg))
    assert cli.main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    config = " ".join(l.removeprefix("config").strip() for l in out.splitlines()
                      if l.startswith(("config", "         ")))
    for key, value in (("seed", 0), ("arm", '"em"'), ("record.pool", 8), ("note", json.dumps(cfg["note"]))):
        assert f"{key}={value}" in config or f"{key}={json.dumps(value)}" in config, key


def test_info_summarises_a_study(study, capsys):
    assert cli.main(["info", str(study)]) == 0
    out = capsys.readouterr().out
    assert "2 runs" in out and "sticky-markov ×2" in out and "h_min=1.829" in out
    assert "seed0-em" in out and "seed0-sgd" in out


def test_sizes_are_allocated_blocks_like_du(study):
    du = shutil.which("du")
    if du is None:
        pytest.skip("no du")
    run = open_run(study / "seed0-em")
    blocks = int(subprocess.run([du, "-s", "-B1", str(run.path)], capture_output=True, text=True).stdout.split()[0])
    apparent = sum(p.stat().st_size for p in run.path.rglob("*") if p.is_file())
    # du counts the run folder itself too; ours counts what is below it
    assert abs(run.size_bytes() - blocks) <= 8192 and run.size_bytes() > apparent


@pytest.mark.parametrize("args, words", [
    (["--port", "70000"], "not a TCP port"),
    (["--port", "-1"], "not a TCP port"),
    (["--address", "no.such.host.invalid"], "does not resolve"),
    (["--address", "192.0.2.1"], "can't listen"),          # TEST-NET: not an address of this machine
])
def test_app_bad_port_or_address_is_one_line(tmp_path, args, words):
    r = subprocess.run([sys.executable, "-m", "dyntool", "app", str(tmp_path), "--headless", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_app_port_in_use_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "dyntool", "app", str(tmp_path), "--port", str(port)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "can't listen" in r.stderr and "--port" in r.stderr, r.stderr


def test_steps_mean_optimizer_steps_taken(tmp_path, capsys, monkeypatch):
    """`ls`, `info` and the app count optimizer steps taken: a 4-step sticky study (rows 0..4, the
    initial state recorded) and a 5-step training run (rows 0..4) both show their own count."""
    from dyntool.app import data as app_data
    from tests.integration.test_train import TINY_ARGS
    assert cli.main(["sim", "sticky-markov", "--steps", "4", "--T", "40", "--seeds", "0", "--arms", "sgd",
                     "--out", str(tmp_path), "--name", "st", "--quiet"]) == 0
    assert cli.main(["train", "--config", "wikitext_mhsa", "--preset", "small", "--out", str(tmp_path),
                     "--name", "tr", "--quiet", "--max-steps", "5", *TINY_ARGS,
                     "--train.final_eval=false"]) == 0
    capsys.readouterr()
    assert cli.main(["ls", str(tmp_path)]) == 0
    table = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert table["st/seed0-sgd"][3] == "4" and table["tr"][3] == "5"
    assert cli.main(["info", str(tmp_path / "st" / "seed0-sgd")]) == 0
    out = capsys.readouterr().out
    assert "4 optimizer steps taken" in out and "step 0 = the initial state" in out
    assert cli.main(["info", str(tmp_path / "tr")]) == 0
    out = capsys.readouterr().out
    assert "5 optimizer steps taken" in out and "initial state" not in out
    labels = [line[:9] for line in out.splitlines() if line[:1].strip()]
    assert all(lab.endswith(" ") for lab in labels)              # every value starts in column 10
    monkeypatch.setenv(app_data.ENV_ROOT, str(tmp_path))
    for run, n in (("st/seed0-sgd", 4), ("tr", 5)):
        p = str(tmp_path / run)
        assert app_data.summary.__wrapped__(p, ())["steps"] == n


@pytest.mark.parametrize("cmd", [["ls"], ["info"], ["check"], ["figures", "--out", "figs"],
                                 ["export", "--to", "out", "--format", "csv"], ["app", "--headless"]])
def test_a_file_given_as_a_folder_is_called_a_file(tmp_path, capsys, monkeypatch, cmd):
    """Was: 'runs directory … does not exist' (ls, figures, app) or 'no run or folder at' (check)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("not a run")
    assert cli.main([cmd[0], "notes.txt", *cmd[1:]]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "dyntool: error: notes.txt is a file, not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
