"""``dyntool figures``: every figure on fixture runs, data files, skips, byte stability, CLI."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dyntool.cli import main
from dyntool.figures import FIGURES, FigureSkip, export, export_all, render_bytes
from dyntool.figures import style
from dyntool.stats import js_rows
from dyntool.figures.geometry import pca_oriented
from dyntool.cli.figures import collect_runs
from dyntool.run import list_runs
from dyntool.run_writer import RunWriter
from tests import figures_fixtures as fx

DPI = 30          # small rasters keep the suite fast; the code path is the same


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("figruns")
    fx.make_toy(d, steps=40)
    fx.make_bijection(d)
    fx.make_icl_markov(d)
    # a --controls study first (list_runs puts the newest first, so sticky-study stays the main study)
    fx.make_sticky_study(d, name="sticky-controls", seeds=(0, 1), arms=("sgd", "em", "routing", "all"), T=40,
                         steps=20, every=10, crop=10, pool=8, sweep=False)
    fx.make_sticky_study(d, seeds=(0, 1), T=64, steps=30, every=5, crop=16, pool=8)
    fx.make_ls_study(d, seeds=(0, 1), steps=40)
    fx.make_ls_context_study(d, seeds=(0, 1), steps=20)
    fx.make_span_study(d, seeds=(0, 1), steps=40)
    fx.make_user_run(d)
    fx.make_atlas_study(d)
    return d


@pytest.fixture(scope="module")
def runs(root):
    return collect_runs([str(root)])


@pytest.fixture(scope="module")
def sticky(root):
    return collect_runs([str(root / "sticky-study")])


def _is_pdf(b: bytes) -> bool:
    return b.startswith(b"%PDF-") and b.rstrip().endswith(b"%%EOF")


def _png_pixels(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg
    return mpimg.imread(path)


@pytest.fixture(scope="module")
def exported(runs, tmp_path_factory):
    """Every figure exported once (PDF + PNG) from all fixture runs together."""
    out = tmp_path_factory.mktemp("figs")
    rep = export_all(runs, out, ["pdf", "png"], dpi=DPI)
    return out, rep


@pytest.mark.parametrize("name", list(FIGURES))
def test_every_figure_writes_valid_pdf_png_data_and_caption(name, exported):
    out, rep = exported
    assert name in rep.written, f"{name} skipped on the fixtures: {rep.skipped.get(name)}"
    paths = rep.written[name]
    pdf, png = out / f"{name}.pdf", out / f"{name}.png"
    assert pdf in paths and png in paths
    b = pdf.read_bytes()
    assert _is_pdf(b) and len(b) > 2000
    assert b"/FontType 3" not in b and b"/Subtype /Type3" not in b         # fonts embedded as TrueType
    assert b"/FontFile2" in b
    img = _png_pixels(png)
    assert img.ndim == 3 and img.shape[0] > 20 and img.shape[1] > 20 and img.std() > 0.01   # not blank
    data = [p for p in paths if p.suffix in (".csv", ".json")]
    assert len(data) == 1 and data[0].stat().st_size > 0
    if data[0].suffix == ".json":
        json.loads(data[0].read_text())
    else:
        assert len(pd.read_csv(data[0])) > 0
    cap = (out / f"{name}.txt").read_text()
    assert cap.endswith("\n") and cap.count("\n") == 1 and len(cap) > 40 and "nan" not in cap.lower()


def test_f3_csv_is_the_recorded_loss_curves(sticky, tmp_path):
    export(FIGURES["f3_em_vs_sgd"], sticky, tmp_path, ["png"], dpi=DPI)
    df = pd.read_csv(tmp_path / "f3_em_vs_sgd.csv")
    n = 0
    for r in sticky:
        seed, arm = r.config["seed"], r.config["arm"]
        m = r.metrics.sort_values("step")
        col = df.set_index("step")[f"{arm}_seed{seed}"].loc[m["step"]]
        np.testing.assert_allclose(col.to_numpy(), m["loss"].to_numpy(), rtol=1e-9, atol=0)   # %.10g
        n += 1
    assert n == 4
    sgd = df[[c for c in df.columns if c.startswith("sgd_seed")]].to_numpy()
    np.testing.assert_allclose(df["sgd_loss_mean"], sgd.mean(1), rtol=1e-9)
    np.testing.assert_allclose(df["sgd_loss_std"], sgd.std(1, ddof=1), rtol=0, atol=1e-8)   # sample std of rounded values


def test_f3_marks_the_authors_crossing_step(sticky):
    from dyntool.figures.sticky import _curves, crossing
    cr = crossing(_curves(sticky, "loss"))
    summ = json.loads((sticky[0].path.parent / "summary.json").read_text())["em_steps_to_sgd_final"]
    assert cr["mean"] == pytest.approx(summ["mean"]) and cr["std"] == pytest.approx(summ["std"])


def test_same_inputs_give_the_same_bytes(sticky, runs, exported):
    out, _ = exported
    for name in ("f3_em_vs_sgd", "f2_toy"):       # the export drew them from all fixture runs: so do we
        png = render_bytes(FIGURES[name], runs, "png", dpi=DPI)
        assert png.startswith(b"\x89PNG") and png == (out / f"{name}.png").read_bytes()
    pdf = render_bytes(FIGURES["value_lr_sweep"], sticky, "pdf")
    assert pdf == (out / "value_lr_sweep.pdf").read_bytes() and b"CreationDate" not in pdf


def test_render_bytes_serves_svg_data_and_caption(sticky):
    spec = FIGURES["value_lr_sweep"]
    assert b"<svg" in render_bytes(spec, sticky, "svg")
    assert render_bytes(spec, sticky, "csv").startswith(b"mult,")
    assert render_bytes(spec, sticky, "txt").count(b"\n") == 1


def test_missing_inputs_are_skipped_with_a_reason(tmp_path):
    # a toy-kind run that recorded only attn; a sticky study without values/statics/sweep;
    # train runs without any max-logit statistic
    run = RunWriter.create(tmp_path, "toy", {"model": {"labels": [0, 1, 2]}}, name="attn-only")
    st = run.open_store()
    for s in range(3):
        st.append(s, {"attn": np.full((1, 1, 1, 3, 3), 1 / 3, np.float32)})
        run.log(s, loss=1.0 / (s + 1))
    run.finish()
    study = tmp_path / "bare-study"
    study.mkdir()
    for arm in ("sgd", "em"):
        w = RunWriter.create(study, "sticky-markov", {"seed": 0, "arm": arm}, name=f"seed0-{arm}")
        for s in range(5):
            w.log(s, loss=2.08 - 0.01 * s * (arm == "em"))
        w.finish()
    (study / "summary.json").write_text(json.dumps({"h_min": 1.8292}))
    fx.make_train_run(tmp_path / "t", "nolog", "mhsa", steps=10, per_head=False)
    df_path = tmp_path / "t" / "nolog" / "metrics.jsonl"
    rows = [json.loads(x) for x in df_path.read_text().splitlines()]
    df_path.write_text("".join(json.dumps({k: v for k, v in r.items() if not k.startswith("logit_max")}) + "\n"
                               for r in rows))
    shutil.rmtree(tmp_path / "t" / "nolog" / "record.zarr")
    runs = list_runs(tmp_path)
    rep = export_all(runs, tmp_path / "out", ["png"], dpi=DPI)
    assert set(rep.written) == {"f3_em_vs_sgd"}
    assert "lacks recorded values" in rep.skipped["f2_toy"] or "values" in rep.skipped["f2_toy"]
    assert "upstream" in rep.skipped["f1_feedback_loop"]
    assert "entropy" in rep.skipped["f4_entropy"]
    assert "values" in rep.skipped["f6_value_pca"]
    assert "value_lr_sweep" in rep.skipped["value_lr_sweep"]
    assert "max-logit" in rep.skipped["ls_loss_logits"]
    assert "span" in rep.skipped["span_val_loss"]
    assert all(isinstance(v, str) and v for v in rep.skipped.values())
    with pytest.raises(FigureSkip):
        render_bytes(FIGURES["f2_toy"], runs, "png")



def test_a_run_of_the_right_kind_that_cannot_be_drawn_says_why(tmp_path):
    """Was: 'needs a run of kind ... or 'capture' (given: capture)': pick's drop read as a kind."""
    w = RunWriter.create(tmp_path, "capture", {}, name="c")
    st = w.open_store()
    for s in range(2):
        st.append(s, {"attn": np.full((1, 1, 1, 3, 3), 1 / 3, np.float32)})
        w.log(s, loss=1.0)
    w.finish()
    spec = FIGURES["recorded_attn"]
    assert spec.supports(list_runs(tmp_path)) == (True, "")
    (tmp_path / "c" / "record.zarr" / "attn" / "zarr.json").write_text("garbage")
    ok, why = spec.supports(list_runs(tmp_path))
    assert not ok and "of kind" not in why
    assert why.startswith("needs a run that recorded 'attn'") and "problems: c: array attn:" in why
    ok, why = FIGURES["recorded_compat"].supports(list_runs(tmp_path))     # never recorded
    assert not ok and why.startswith("needs a run that recorded 'compat'")



def test_span_figure_without_periodic_validation_says_so(tmp_path, recwarn):
    """Was: an empty panel (a), matplotlib's 'No artists with labels' warning on stderr and a caption
    describing curves that were not there (a study run with train.eval_every = 0)."""
    study = fx.make_span_study(tmp_path, seeds=(0, 1), steps=20)
    for m in study.glob("*/metrics.jsonl"):
        rows = [json.loads(x) for x in m.read_text().splitlines()]
        m.write_text("".join(json.dumps({k: v for k, v in r.items() if not k.startswith("val_")}) + "\n"
                             for r in rows))
    spec = FIGURES["span_val_loss"]
    fig, data, caption = spec.draw(spec.select(list_runs(study)))
    assert "(a) Empty: the runs evaluated only at the end" in caption
    assert "no validation curve recorded" in [t.get_text().split("\n")[0] for t in fig.axes[0].texts]
    assert len(data) == 6 and data["rel_change_pct"].notna().sum() == 4       # (b) from the final evaluations
    assert not [w for w in recwarn if "legend" in str(w.message)]


def test_one_failing_figure_does_not_stop_the_others(sticky, tmp_path, monkeypatch, capsys):
    import dataclasses

    def boom(runs, **opts):
        raise ValueError("unreadable chunk")
    monkeypatch.delenv("DYNTOOL_DEBUG", raising=False)
    monkeypatch.setitem(FIGURES, "value_lr_sweep", dataclasses.replace(FIGURES["value_lr_sweep"], draw=boom))
    rep = export_all(sticky, tmp_path, ["png"], only=["value_lr_sweep", "f3_em_vs_sgd"], dpi=DPI)
    assert list(rep.written) == ["f3_em_vs_sgd"] and "unreadable chunk" in rep.failed["value_lr_sweep"]
    rc = main(["figures", str(sticky[0].path.parent), "--out", str(tmp_path / "o"), "--format", "png",
               "--only", "value_lr_sweep", "--dpi", str(DPI)])
    assert rc == 1 and "FAILED  value_lr_sweep" in capsys.readouterr().out


def test_corrupt_runs_among_the_inputs_are_reported_not_fatal(root, tmp_path, capsys):
    bad = tmp_path / "bad-run"
    (bad / "record.zarr").mkdir(parents=True)
    (bad / "meta.json").write_text("{not json")
    (bad / "config.json").write_text("{}")
    (bad / "record.zarr" / "zarr.json").write_text("garbage")
    rc = main(["figures", str(bad), str(root / "sticky-study"), "--out", str(tmp_path / "o"), "--format", "png",
               "--only", "f3_em_vs_sgd,f5_attention", "--dpi", str(DPI)])
    cap = capsys.readouterr()
    assert rc == 0 and "meta.json is corrupted" in cap.err and "wrote   f3_em_vs_sgd" in cap.out



def test_a_corrupt_study_summary_is_warned_about(root, tmp_path, capsys):
    """Was: silent; the figures reading it skipped with reasons about missing arms."""
    study = tmp_path / "study"
    shutil.copytree(root / "sticky-study", study)
    (study / "summary.json").write_text('{"value_lr_sweep": [')
    rc = main(["figures", str(study), "--out", str(tmp_path / "o"), "--format", "png",
               "--only", "f3_em_vs_sgd,value_lr_sweep", "--dpi", str(DPI)])
    cap = capsys.readouterr()
    assert rc == 0 and "wrote   f3_em_vs_sgd" in cap.out and "skipped value_lr_sweep" in cap.out
    warned = [ln for ln in cap.err.splitlines() if "summary.json is corrupted" in ln]
    assert len(warned) == 1 and warned[0].startswith(f"warning: {study}: ")
    assert warned[0].endswith("figures that read it are skipped")


def test_cli_writes_reports_skips_and_expands_studies(root, tmp_path, capsys):
    out = tmp_path / "figs"
    rc = main(["figures", str(root / "sticky-study"), str(root / "toy"), "--out", str(out), "--format", "png",
               "--only", "f3_em_vs_sgd,value_lr_sweep,ls_loss_logits", "--dpi", str(DPI)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "5 run(s)" in text and "wrote   f3_em_vs_sgd" in text and "wrote   value_lr_sweep" in text
    assert "skipped ls_loss_logits" in text and "'train'" in text
    assert sorted(p.name for p in out.iterdir()) == ["f3_em_vs_sgd.csv", "f3_em_vs_sgd.png", "f3_em_vs_sgd.txt",
                                                     "value_lr_sweep.csv", "value_lr_sweep.png",
                                                     "value_lr_sweep.txt"]
    assert len(collect_runs([str(root / "sticky-study")])) == 4


@pytest.mark.parametrize("argv,msg", [
    (["--only", "nope"], "unknown figure"),
    (["--format", "gif"], "unknown figure format"),
    (["/does/not/exist"], "does not exist"),
])
def test_cli_errors_are_one_line_exit_2(argv, msg, root, tmp_path, capsys):
    # a real run as input: the inputs are checked first, before the figure modules load
    rc = main(["figures", str(root / "toy"), *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and err.count("\n") == 1


def test_cli_list(capsys):
    assert main(["figures", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in FIGURES)


def test_style_is_shared():
    with style.context():
        import matplotlib as mpl
        assert mpl.rcParams["pdf.fonttype"] == 42 and mpl.rcParams["svg.fonttype"] == "none"
    assert style.SINGLE == pytest.approx(3.4) and style.DOUBLE == pytest.approx(7.0)
    assert style.ARM_COLORS["sgd"] == style.OKABE_ITO["vermillion"]


def test_pca_orientation_and_js():
    rng = np.random.default_rng(0)
    h = rng.random(200)
    x = np.stack([-3 * h + 0.01 * rng.standard_normal(200), 0.1 * rng.standard_normal(200)], 1)
    z, evr, r = pca_oriented(x, h)
    assert r[0] > 0.99 and np.corrcoef(z[:, 0], h)[0, 1] > 0.99 and evr[0] > 0.9
    p = np.array([[0.5, 0.5], [1.0, 0.0]])
    assert np.allclose(js_rows(p, p), 0)
    assert js_rows(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(math.log(2))


# -- issue 10: the controls figure needs control arms; F4/F6 say training vs held-out ------------------

def test_controls_figure_is_skipped_without_control_arms(sticky, tmp_path, capsys):
    from dyntool.figures.controls import NO_CONTROLS
    ok, why = FIGURES["controls"].supports(sticky)                   # sgd and em only
    assert not ok and why == NO_CONTROLS and "--controls" in why and "\n" not in why
    rc = main(["figures", str(sticky[0].path.parent), "--out", str(tmp_path / "o"), "--format", "png",
               "--only", "controls", "--dpi", str(DPI)])
    out = capsys.readouterr().out
    assert rc == 0 and f"skipped controls             {NO_CONTROLS}" in out and "0 figure(s) written" in out


def test_controls_figure_draws_the_arms_the_study_ran(root, runs):
    spec = FIGURES["controls"]
    sel = spec.select(runs)                                           # found among both studies
    assert {p.parent.name for p in (r.path for r in sel)} == {"sticky-controls"} and spec.supports(sel)[0]
    summ = json.loads((root / "sticky-controls" / "summary.json").read_text())
    fig, df, cap = spec.draw(sel)
    assert list(df["arm"]) == list(summ["arms"]) == ["sgd", "em", "routing", "all"]
    for a in ("em", "routing", "all"):
        st = summ["arms"][a]["steps_to_target"]
        row = df[df["arm"] == a].iloc[0]
        assert row["steps_mean"] == pytest.approx(st["mean"]) and row["steps_std"] == pytest.approx(st["std"])
    assert "Control arms not in this study: readout, sgd_tuned." in cap
    assert "routing 0.1/0.1/0.01/0.01" in cap


def test_controls_listing_and_arm_names_agree_with_the_sim():
    from dyntool.cli.sim import CONTROL_ARMS
    from dyntool.figures.controls import CONTROLS
    from dyntool.sims.sticky import CONTROLS as SIM_CONTROLS
    assert CONTROLS == SIM_CONTROLS and set(CONTROL_ARMS) == {"sgd", "em", *CONTROLS}
    assert "--controls" in FIGURES["controls"].needs and all(a in FIGURES["controls"].needs for a in CONTROLS)


def _legend_texts(fig):
    return [t.get_text() for leg in fig.legends + [a.get_legend() for a in fig.axes if a.get_legend()]
            for t in leg.get_texts()]


def _r_panel(fig):
    return next(a for a in fig.axes if a.get_ylabel().startswith("r(PC1"))


def test_f4_labels_training_and_heldout(sticky):
    fig, data, cap = FIGURES["f4_entropy"].draw(sticky)
    texts = _legend_texts(fig)
    assert any("training sequence" in t for t in texts) and any("held-out sequence" in t for t in texts)
    assert {"training", "held-out"} <= set(texts)                     # panel (b) markers
    assert "dashed lines: the held-out sequence" in cap and "open diamonds: held-out sequence" in cap
    # the held-out finals are the study's own numbers (summary.json per_seed), not the training ones
    summ = json.loads((sticky[0].path.parent / "summary.json").read_text())
    for arm in ("sgd", "em"):
        want = [p[arm]["heldout_entropy"] for p in summ["per_seed"]]
        assert data["heldout_final"][arm]["mean"] == pytest.approx(np.mean(want))
        assert data["final"][arm]["mean"] == pytest.approx(np.mean([p[arm]["entropy"] for p in summ["per_seed"]]))
        assert f"{style.arm_label(arm)} {np.mean(want) - summ['h_min']:.3f} nats" in cap.split("Held-out sequence:")[1]


def test_f6_says_which_positions_it_uses(sticky):
    fig, data, cap = FIGURES["f6_value_pca"].draw(sticky)
    titles = [a.get_title(loc="left") for a in fig.axes]
    assert sum("training sequence" in t for t in titles) == 2           # one scatter per arm
    assert "TRAINING sequence" in cap and "HELD-OUT sequence" in cap
    assert all(p["sequence"] == "training" for p in data["points"].values())
    ticks = [t.get_text() for t in _r_panel(fig).get_xticklabels()]
    assert ticks == ["values\ntrain", "outputs\ntrain", "values\nheld-out", "outputs\nheld-out"]
    for p in data["runs"]:                                             # the sim's last logged held-out numbers
        rows = [json.loads(x) for x in (sticky[0].path.parent / p["run"] / "metrics.jsonl").read_text().splitlines()]
        last = [r for r in rows if "heldout_g_r_pc1" in r][-1]
        assert p["heldout_g_r_pc1"] == pytest.approx(last["heldout_g_r_pc1"])
        assert p["heldout_v_ordering_score"] == pytest.approx(last["heldout_v_ordering_score"])
        assert p["heldout_step"] == last["step"]


def test_f4_f6_without_heldout_metrics_say_so(tmp_path):
    study = fx.make_sticky_study(tmp_path, name="no-heldout", seeds=(0, 1), T=40, steps=12, every=6, crop=10,
                                 pool=8, sweep=False, heldout=False)
    rs = collect_runs([str(study)])
    fig, data, cap = FIGURES["f4_entropy"].draw(rs)
    assert "heldout_final" not in data and "held-out" not in cap and "training sequence" in cap
    assert not any("held-out" in t for t in _legend_texts(fig))
    fig, data, cap = FIGURES["f6_value_pca"].draw(rs)
    assert "logged no held-out manifold metrics" in cap
    assert [t.get_text() for t in _r_panel(fig).get_xticklabels()] == ["values\ntrain"]


def test_a_trainer_summary_row_is_not_divergence(root):
    """The HF Trainer's last row has no loss; only a recorded non-finite loss means divergence."""
    from dyntool.figures.train_common import diverged
    from dyntool.run import open_run
    run = open_run(root / "user-model")
    assert run.metrics["loss"].isna().any()              # the DataFrame shows NaN for the summary row
    assert diverged(run) is None
    with open(run.path / "metrics.jsonl", "a") as f:     # a real non-finite loss (written as null)
        f.write('{"step": 99, "loss": null}\n')
    assert diverged(open_run(root / "user-model")) == 99


def test_a_figure_whose_pick_finds_nothing_skips_without_running_its_check(tmp_path):
    """Was: value_lr_sweep's check read runs[0] of an empty pick (a study of sweep runs only whose
    summary.json lacks the sweep): IndexError, and `dyntool figures` stopped as an internal error."""
    study = tmp_path / "sweep-only"
    study.mkdir()
    w = RunWriter.create(study, "sticky-markov", {"seed": 0, "arm": "sweep", "value_lr_mult": 2.0},
                         name="seed0-sweep-v2")
    w.log(0, loss=2.0)
    w.finish()
    runs = list_runs(study)
    spec = FIGURES["value_lr_sweep"]
    assert runs and spec.select(runs) == []
    ok, why = spec.supports(runs)
    assert not ok and why == f"needs {spec.needs}"
