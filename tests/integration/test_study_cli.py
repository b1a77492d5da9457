"""``dyntool study`` plumbing on the tiny corpus: seeds as a list, --max-steps reaches every run,
each run's config loaded once from the packaged presets, user overrides beat the study defaults."""
import json
from pathlib import Path

import pytest

from dyntool.cli import main
from dyntool.run import open_run

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny_wikitext"
TINY_ARGS = [f"--data.path={TINY}", "--data.batch_size=2", "--data.block_size=8", "--data.eval_batch_size=4",
             "--data.eval_max_batches=1", "--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16",
             "--optim.warmup_steps=1", "--train.eval_every=2", "--record.every=2",
             "--train.final_eval=false", "--train.checkpoint=false", "--train.logit_stat=off"]


def test_span_study_runs_the_listed_seeds(tmp_path, monkeypatch):
    from dyntool.train import runner
    calls = []
    real = runner.load_config
    monkeypatch.setattr(runner, "load_config", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert main(["study", "span", "--seeds", "7", "--max-steps", "2", "--out", str(tmp_path),
                 "--name", "s", "--quiet", "--tag", "mine", *TINY_ARGS]) == 0
    assert len(calls) == 2                          # one load per run, none for the summary
    s = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert [r["seed"] for r in s["seeds"]] == [7] and s["max_steps"] == 2
    for arm, attention in (("baseline", "mhsa"), ("span", "span")):
        run = open_run(tmp_path / "s" / f"{arm}-s7")
        assert run.config["seed"] == 7 and run.config["train"]["max_steps"] == 2
        assert run.config["model"]["attention"] == attention and run.config["model"]["n_embd"] == 16
        assert run.meta["tags"] == ["study-span", "mine"] and int(run.metrics["step"].max()) == 2   # row 2: the last state



def test_a_span_study_without_validation_says_so(tmp_path, capsys):
    """Was: 'relative validation-loss change: +nan ± nan %'."""
    assert main(["study", "span", "--seeds", "0", "--max-steps", "1", "--out", str(tmp_path), "--name", "s",
                 "--quiet", *TINY_ARGS, "--train.eval_every=0"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "relative validation-loss change: - (no run evaluated on the validation split" in out


def test_ls_logits_user_overrides_beat_study_defaults(tmp_path):
    from dyntool.train.ls_logits import configs
    from dyntool.train.studies import StudyConfig
    cfgs = configs(StudyConfig(seeds=[0, 3], max_steps=5), "cpu", ["--optim.lr=3e-3"])
    assert set(cfgs) == {("cpu", s, a) for s in (0, 3) for a in ("mhsa", "ls", "qknorm")}
    c = cfgs["cpu", 3, "ls"]
    assert (c.seed, c.train.max_steps, c.optim.lr, c.data.block_size) == (3, 5, 3e-3, 512)
    assert c.model.attention == "ls" and cfgs["cpu", 0, "mhsa"].model.attention == "mhsa"


def test_arms_picks_ls_logits_arms_and_is_refused_in_one_line_elsewhere(tmp_path, capsys):
    """--arms keeps a subset of ls-logits' arms in the study's order (a GPU session runs one T and two
    arms per process); an unknown or repeated arm, or --arms on the span study (its Δ needs both),
    is one line and exit 2, before any folder is made."""
    from dyntool.train.ls_logits import configs
    from dyntool.train.studies import StudyConfig
    cfgs = configs(StudyConfig(seeds=[0], arms=["ls", "mhsa"]), "gpu2048", ["--device=cpu"])
    assert list(cfgs) == [("gpu2048", 0, "mhsa"), ("gpu2048", 0, "ls")]
    assert cfgs["gpu2048", 0, "ls"].model.attention == "ls" and cfgs["gpu2048", 0, "ls"].data.block_size == 2048
    for argv, msg in ((["ls-logits", "--arms", "mhsa,flash"], "arms: flash is not an arm of this study "
                                                              "(its arms: mhsa, ls, qknorm)"),
                      (["ls-logits", "--arms", "ls,ls"], "arms: needs distinct arms, got ['ls', 'ls']"),
                      (["span", "--arms", "span"], "arms: the span study's Δ needs both of its arms")):
        assert main(["study", *argv, "--out", str(tmp_path / "o"), *TINY_ARGS]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err
    assert not (tmp_path / "o").exists()


def test_ls_logits_arms_reach_the_continue_command(tmp_path, monkeypatch, capsys):
    from dyntool.train import runner

    def stop(cfg, *a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(runner, "run_training", stop)
    rc = main(["study", "ls-logits", "--seeds", "0", "--arms", "qknorm", "--max-steps", "2", "--out", str(tmp_path),
               "--name", "l", "--quiet", *TINY_ARGS])
    assert rc == 130
    err = capsys.readouterr().err
    assert "continue the remaining seeds with: dyntool study ls-logits --seeds 0 --max-steps 2 --arms qknorm " in err


def test_ctrl_c_in_a_study_names_the_command_that_continues_it(tmp_path, monkeypatch, capsys):
    from dyntool.train import runner
    real, seen = runner.run_training, []

    def stop_at_seed_1(cfg, *a, **k):
        seen.append(cfg.seed)
        if cfg.seed == 1:
            raise KeyboardInterrupt
        return real(cfg, *a, **k)
    monkeypatch.setattr(runner, "run_training", stop_at_seed_1)
    rc = main(["study", "span", "--seeds", "0,1,2", "--max-steps", "2", "--out", str(tmp_path),
               "--name", "s", "--quiet", *TINY_ARGS])
    assert rc == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dyntool: interrupted")
    assert f"study {tmp_path / 's'} stopped in seed 1 (1 of 3 seeds finished, kept there)" in err[0]
    assert f"continue the remaining seeds with: dyntool study span --seeds 1,2 --max-steps 2 --preset small " \
           f"--out {tmp_path}" in err[0]
    assert TINY_ARGS[0] in err[0]
    assert open_run(tmp_path / "s" / "span-s0").status == "finished"


def test_ctrl_c_message_starts_its_own_line_on_a_terminal(monkeypatch, capsys):
    import io
    import sys

    from dyntool import cli

    class Tty(io.StringIO):
        def isatty(self):
            return True
    err = Tty()
    err.write("train:  40%|####      | 8/20")          # a progress bar's open line
    monkeypatch.setattr(sys, "stderr", err)

    def interrupted(*a, **k):
        e = KeyboardInterrupt()
        e.next_step = "stopped at step 8; continue with: dyntool train --resume runs/wikitext/r"
        raise e
    monkeypatch.setattr(cli, "_run", interrupted)
    assert cli.main(["ls"]) == 130
    lines = err.getvalue().splitlines()
    assert lines[0] == "train:  40%|####      | 8/20"
    assert lines[1].startswith("dyntool: interrupted;") and lines[1].endswith("--resume runs/wikitext/r")


def test_a_short_span_study_says_its_final_evaluation_was_bounded(tmp_path, capsys):
    assert main(["study", "span", "--seeds", "0", "--max-steps", "1", "--out", str(tmp_path), "--name", "b",
                 *TINY_ARGS, "--train.final_eval=auto"]) == 0
    out = capsys.readouterr()
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    for arm in ("baseline", "span"):
        assert s["seeds"][0][arm]["final_eval"] == "bounded"
        assert s["seeds"][0][arm]["final_eval_tokens"] == {"valid": 8, "test": 8}     # half of 2×8 tokens
    assert "final = bounded final evaluation (first 8 validation tokens" in out.out
    assert "final evaluation: valid (8 tokens) + test (8 tokens)" in out.err and "about " in out.err


@pytest.mark.parametrize("argv, target", [
    (["sim", "toy"], "dyntool.sims.toy.run_toy"),
    (["sim", "sticky-markov"], "dyntool.sims.sticky.run_study"),
    (["sim", "bijection"], "dyntool.sims.bijection.run_bijection"),
    (["sim", "icl-markov"], "dyntool.sims.icl_markov_study.run_study")])
def test_an_interrupted_simulation_says_how_to_go_on(argv, target, tmp_path, monkeypatch, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(target, interrupted)
    assert main([*argv, "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dyntool: interrupted; the run was flushed and marked 'interrupted'; see it with: dyntool ls "
                   f"{tmp_path}; a simulation keeps no checkpoint, so the same command starts it again, into a new folder"]
