"""`dyntool study atlas --preset ci`: every step has every head's atlas scores, the summary has the
events of the fixed rules, and bad input is one line with a non-zero exit."""
import json

import pytest

from dyntool.cli import main
from dyntool.record import metric_names as mn
from dyntool.run import open_run
from dyntool.train.atlas_probe import HEAD_BASES


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("atlas")
    rc = main(["study", "atlas", "--preset", "ci", "--seeds", "0", "--arms", "qknorm", "--out", str(tmp_path),
               "--name", "a", "--quiet", "--atlas.probe_seqs=2", "--atlas.rep_seqs=2"])
    assert rc == 0
    return tmp_path


def test_ci_atlas_study_records_every_head_every_step(study, capsys):
    tmp_path = study
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["atlas"]["probe_seqs"] == 2 and list(s["runs"]) == ["qknorm-s0"]
    r = s["runs"]["qknorm-s0"]
    assert r["steps"] == 6 and set(r["events"]) >= {"sink", "prev_token", "induction", "loss_bump", "repeat_phase"}
    df = open_run(tmp_path / "a" / "qknorm-s0").metrics
    rows = df[df["step"] < 6]
    for base in HEAD_BASES + (mn.LOGIT_MAX, mn.ATTN_ENTROPY):
        cols = mn.per_head(df.columns, base)
        assert len(cols) == 4, base                                # 2 layers × 2 heads
        assert rows[list(cols.values())].notna().all().all(), base  # every step
    assert rows["atlas_rep_gap"].notna().all()


def test_atlas_figures_draw_what_the_run_logged(study, tmp_path):
    import pandas as pd
    names = ["atlas_grid", "atlas_olsson", "atlas_gu", "atlas_drivers", "atlas_logits"]
    rc = main(["figures", str(study / "a"), "--out", str(tmp_path), "--only", ",".join(names), "--format", "png",
               "--dpi", "40"])
    assert rc == 0
    for n in names:
        assert (tmp_path / f"{n}.png").stat().st_size > 1000 and (tmp_path / f"{n}.txt").read_text()
    df = open_run(study / "a" / "qknorm-s0").metrics
    gu = pd.read_csv(tmp_path / "atlas_gu.csv")
    probed = df[df["atlas_probe_loss"].notna()].sort_values("step")
    assert gu["sink_gu"].tolist() == pytest.approx(probed["atlas_sink_gu"].tolist())
    fm = probed[list(mn.per_head(df.columns, "atlas_first_mass").values())].max(axis=1)
    assert gu["max_first_mass"].tolist() == pytest.approx(fm.tolist())
    assert f"{fm.iloc[-1]:.3f}" in (tmp_path / "atlas_gu.txt").read_text()


@pytest.mark.parametrize("argv, msg", [
    (["--atlas.bogus=1"], "atlas.bogus: not a setting of the atlas probe"),
    (["--atlas.every=0"], "atlas.every: must be >= 1"),
    (["--preset", "gpu2048"], "atlas presets: ci, cpu (small), gpu"),
    (["--arms", "ls"], "ls is not an arm of this study")])
def test_bad_atlas_input_is_one_line(argv, msg, tmp_path, capsys):
    rc = main(["study", "atlas", "--preset", "ci", "--out", str(tmp_path), *argv] if "--preset" not in argv
              else ["study", "atlas", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert rc != 0 and msg in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())                              # nothing made
