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
    arms per process); an unknown or repeated arm, or a span study without its baseline (its Δ needs it),
    is one line and exit 2, before any folder is made."""
    from dyntool.train.ls_logits import configs
    from dyntool.train.studies import StudyConfig
    cfgs = configs(StudyConfig(seeds=[0], arms=["ls", "mhsa"]), "gpu2048", ["--device=cpu"])
    assert list(cfgs) == [("gpu2048", 0, "mhsa"), ("gpu2048", 0, "ls")]
    assert cfgs["gpu2048", 0, "ls"].model.attention == "ls" and cfgs["gpu2048", 0, "ls"].data.block_size == 2048
    for argv, msg in ((["ls-logits", "--arms", "mhsa,flash"], "arms: flash is not an arm of this study "
                                                              "(its arms: mhsa, ls, qknorm)"),
                      (["ls-logits", "--arms", "ls,ls"], "arms: needs distinct arms, got ['ls', 'ls']"),
                      (["span", "--arms", "span"], "arms: the span study's Δ needs the baseline arm"),
                      (["span", "--arms", "baseline,c1c"], "arms: c1c is not an arm of this study")):
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
    # every simulation checkpoints (tests/integration/test_sim_resume*.py), but not before it starts
    why = "it stopped before its first checkpoint"
    assert err == [f"dyntool: interrupted; the run was flushed and marked 'interrupted'; see it with: dyntool ls "
                   f"{tmp_path}; {why}, so the same command starts it again, into a new folder"]
    # with --name: that folder is kept, so the same command would be refused (issue 50, item 6)
    assert main([*argv, "--out", str(tmp_path), "--name", "n1"]) == 130
    assert "the same command with another --name (or none; n1 is kept) starts it again" in capsys.readouterr().err


def test_span_study_arms_are_the_readings_they_name(tmp_path, capsys):
    """--arms picks the span study's readings: each arm's config carries its candidate and scales,
    and the summary has every arm's Δ against the baseline, its clip factor and per-head max logit."""
    from dyntool.train.span_study import ARMS
    from dyntool.train.studies import StudyConfig, _configs
    arms = ["baseline", "span", "c1a-a0.5", "ab2", "c1b-a2"]
    cfgs = _configs({a: "wikitext_span.toml" for a in arms}, {a: ARMS[a][0] for a in arms},
                    StudyConfig(seeds=[0]), "small", [])
    sp = {a: cfgs[a, 0].span for a in arms[1:]}
    assert cfgs["baseline", 0].model.attention == "mhsa"
    assert (sp["span"].candidate, sp["span"].alpha_q, sp["span"].beta_q, sp["span"].alpha_k) == ("c1_orthogonal", 2, 1, 2)
    assert (sp["c1a-a0.5"].alpha_q, sp["c1a-a0.5"].alpha_k, sp["c1a-a0.5"].beta_k) == (0.5, 0.5, 1)
    assert (sp["ab2"].alpha_q, sp["ab2"].beta_q, sp["ab2"].alpha_k, sp["ab2"].beta_k) == (2, 2, 2, 2)
    assert (sp["c1b-a2"].candidate, sp["c1b-a2"].alpha_k, sp["c1b-a2"].beta_k) == ("c1_oblique", 2, 1)
    assert main(["study", "span", "--seeds", "0", "--max-steps", "2", "--arms", "baseline,ab2", "--out",
                 str(tmp_path), "--name", "a", "--quiet", *TINY_ARGS, "--optim.grad_clip=1e-9",
                 "--train.logit_stat=exact"]) == 0
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    row = s["seeds"][0]
    assert list(s["arms"]) == ["ab2"] and "rel_change_pct" in row["ab2"] and "span" not in row
    for arm in ("baseline", "ab2"):
        assert row[arm]["clip"]["bound_share"] == 1.0 and 0 < row[arm]["clip"]["min"] < 1e-6   # a tiny clip binds
        assert row[arm]["logit_max"] and all(v["max"] >= v["last"] > 0 for v in row[arm]["logit_max"].values())
    printed = capsys.readouterr().out
    assert "none of these readings is known to be the paper's method" in printed
    # dyntool info shows the same table, every arm's row and reading (the two-arm table needs "span")
    from dyntool.cli.study_tables import study_table
    lines = study_table(s)
    assert lines and "\n".join(lines) in printed and "  ab2: " + ARMS["ab2"][1] in lines
    assert sum(line.split()[:2] == ["0", "ab2"] for line in lines) == 1


def test_clip_factor_from_grad_norms():
    import pandas as pd
    from dyntool.train.span_study import clip_and_logits
    df = pd.DataFrame({"step": [0, 1, 2], "grad_norm": [0.5, 2.0, 4.0], "logit_max/L0H1": [1.0, 3.0, 2.0]})
    got = clip_and_logits(df, 1.0)
    assert got["clip"]["bound_share"] == 2 / 3 and abs(got["clip"]["min"] - 1 / (4 + 1e-6)) < 1e-15
    assert abs(got["clip"]["mean"] - (1 + 1 / (2 + 1e-6) + 1 / (4 + 1e-6)) / 3) < 1e-15
    assert got["logit_max"] == {"L0H1": {"last": 2.0, "max": 3.0}} and clip_and_logits(df, 0.0)["clip"] is None
