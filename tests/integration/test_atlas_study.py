"""`dyntool study atlas --preset ci`: every head's atlas scores on their schedules, the summary has the
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
               "--name", "a", "--quiet", "--atlas.probe_seqs=2", "--atlas.rep_seqs=2", "--atlas.grad_every=4"])
    assert rc == 0
    return tmp_path


def test_ci_atlas_study_records_every_head_on_its_schedule(study, capsys):
    """The forward scores and the cheap tier every step, the gradient side on steps 0 and 4
    (``--atlas.grad_every=4``), every head."""
    tmp_path = study
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["atlas"]["probe_seqs"] == 2 and s["atlas"]["grad_every"] == 4 and list(s["runs"]) == ["qknorm-s0"]
    r = s["runs"]["qknorm-s0"]
    assert r["steps"] == 6 and set(r["events"]) >= {"sink", "prev_token", "induction", "loss_bump", "repeat_phase"}
    assert (r["events"]["rows"], r["events"]["grad_rows"]) == (6, 2)
    df = open_run(tmp_path / "a" / "qknorm-s0").metrics
    rows = df[df["step"] < 6].set_index("step")
    forward = ("atlas_first_mass", "atlas_prev_token", "atlas_induction", mn.LOGIT_MAX, mn.ATTN_ENTROPY)
    for base in HEAD_BASES + forward[3:]:
        cols = list(mn.per_head(df.columns, base).values())
        assert len(cols) == 4, base                                # 2 layers × 2 heads
        measured = rows[cols].notna().all(axis=1)
        assert measured.tolist() == ([True] * 6 if base in forward else [s % 4 == 0 for s in range(6)]), base
    assert rows["atlas_sink_gu"].notna().all() and rows["atlas_rep_gap"].notna().tolist() == [s % 4 == 0 for s in range(6)]


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
    probed = df[df["atlas_sink_gu"].notna()].sort_values("step")          # every step
    assert gu["sink_gu"].tolist() == pytest.approx(probed["atlas_sink_gu"].tolist())
    fm = probed[list(mn.per_head(df.columns, "atlas_first_mass").values())].max(axis=1)
    assert gu["max_first_mass"].tolist() == pytest.approx(fm.tolist())
    assert f"{fm.iloc[-1]:.3f}" in (tmp_path / "atlas_gu.txt").read_text()


@pytest.mark.parametrize("argv, msg", [
    (["--atlas.bogus=1"], "atlas.bogus: not a setting of the atlas probe"),
    (["--atlas.every=0"], "atlas.every: must be >= 1"),
    (["--preset", "gpu2048"], "atlas presets: ci, cpu (small), cpu_small, cpu_long, gpu"),
    (["--arms", "ls"], "ls is not an arm of this study")])
def test_bad_atlas_input_is_one_line(argv, msg, tmp_path, capsys):
    rc = main(["study", "atlas", "--preset", "ci", "--out", str(tmp_path), *argv] if "--preset" not in argv
              else ["study", "atlas", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert rc != 0 and msg in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())                              # nothing made


def test_every_atlas_preset_resolves_to_what_the_docs_say():
    """Each preset name of ``study atlas`` loads from atlas.toml; the 2-core presets are the shapes
    and schedules docs/results.md reports runs of (a changed preset would no longer reproduce them)."""
    from dyntool.train.atlas import CONFIG, PRESETS
    from dyntool.train.runner import load_config
    got = {name: load_config(CONFIG, name, ["--device=cpu"]) for name in set(PRESETS.values())}   # gpu: only read
    assert set(got) == {"ci", "cpu", "cpu_small", "cpu_long", "gpu"}
    shape = {n: (c.model.n_layer, c.model.n_head, c.model.n_embd, c.data.block_size, c.data.batch_size,
                 c.optim.lr, c.train.max_steps) for n, c in got.items()}
    assert shape["cpu"] == (2, 4, 64, 64, 16, 2e-3, 500)
    assert shape["cpu_small"] == (2, 4, 64, 64, 8, 8e-3, 2400) and got["cpu_small"].train.stop_at == 1400
    assert shape["cpu_long"] == (2, 4, 64, 128, 8, 4e-3, 8000)
    assert shape["gpu"] == (4, 8, 256, 256, 32, 1e-3, 10000)
