"""Every page of the app under ``streamlit.testing.v1.AppTest`` on fixture runs: widgets are set
(sliders, heads, layers, runs, modes) and each page must draw its elements without an exception;
bad input (empty dir, corrupted/partial run, missing arrays, paths outside RUNS_DIR) must give a
message, never a traceback."""
from __future__ import annotations

import io

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from . import fixtures

MAIN = str(fixtures.APP_DIR / "main.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    fixtures.make_toy(root, "toy-a", steps=25)
    fixtures.make_multihead(root, "train-a", seed=0)
    fixtures.make_multihead(root, "train-ls", seed=1, attention="ls")
    fixtures.make_sticky_study(root, name="sticky")
    fixtures.make_corrupted(root)
    fixtures.make_partial(root)
    fixtures.make_missing_arrays(root)
    return root


def app(root, monkeypatch, page: str | None = None, run: str | None = None) -> AppTest:
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(root))
    at = AppTest.from_file(MAIN, default_timeout=30).run()
    if page:
        if run:
            at.query_params["run"] = run
        at.switch_page(f"views/{page}.py").run()
    return at


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not [e for e in at.error if "could not be drawn" in e.value], [e.value for e in at.error]
    return at


def arr(v) -> np.ndarray:
    """A plotly JSON array (a list, or a base64 typed array ``{"dtype", "bdata", "shape"}``)."""
    if isinstance(v, dict) and "bdata" in v:
        import base64
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
        return a.reshape([int(x) for x in str(v["shape"]).split(",")]) if "shape" in v else a
    return np.asarray(v, dtype=float)


def charts(at: AppTest) -> list:
    return at.get("plotly_chart")


def titles(at: AppTest) -> str:
    import json
    return " | ".join(json.loads(c.proto.spec)["layout"]["title"]["text"] for c in charts(at))


# -- Runs ------------------------------------------------------------------------------------

def test_runs_table_filters_and_selection(runs, monkeypatch):
    at = ok(app(runs, monkeypatch))
    df = at.dataframe[0].value
    assert {"toy-a", "train-a", "sticky/seed0-em", "bad-corrupt", "live-partial"} <= set(df["run"])
    assert {"kind", "status", "tags", "steps", "recorded", "size_mb", "final loss"} <= set(df.columns)
    assert df.set_index("run").loc["toy-a", "recorded"] == 25
    ok(at.multiselect(key="flt_kind").set_value(["sticky-markov"]).run())
    assert set(at.dataframe[0].value["run"]) == {f"sticky/seed{s}-{a}" for s in (0, 1) for a in ("sgd", "em")}
    ok(at.multiselect(key="runs_select").set_value(["sticky/seed0-em", "sticky/seed1-em"]).run())
    assert at.session_state["dt_selected"] == ["sticky/seed0-em", "sticky/seed1-em"]
    at.switch_page("views/matrices.py").run()                         # the other pages use it
    assert at.selectbox(key="mx_run").options == ["sticky/seed0-em", "sticky/seed1-em"]


def test_empty_directory_gives_a_message_on_every_page(tmp_path, monkeypatch):
    at = ok(app(tmp_path, monkeypatch))
    assert any("No runs found" in i.value for i in at.info)
    for page in ("overview", "matrices", "trajectories", "compare"):
        at.switch_page(f"views/{page}.py").run()
        ok(at)
        assert any("No runs found" in e.value for e in at.error), page


def test_folder_box_cannot_escape_runs_dir(runs, monkeypatch):
    at = ok(app(runs / "sticky", monkeypatch))
    ok(at.text_input(key="dt_subdir_box").set_value("../").run())
    assert any("outside the runs directory" in e.value for e in at.sidebar.error)
    # the listing still shows only what is inside RUNS_DIR
    assert set(at.dataframe[0].value["run"]) == {f"seed{s}-{a}" for s in (0, 1) for a in ("sgd", "em")}
    data = fixtures.load_app_package().data
    with pytest.raises(data.AppInputError):
        data.resolve_inside(runs / "sticky", "/etc")


# -- Overview --------------------------------------------------------------------------------

@pytest.mark.parametrize("run", ["toy-a", "train-a", "sticky/seed0-sgd", "bad-corrupt", "live-partial", "attn-only"])
def test_overview_every_kind_of_run(runs, monkeypatch, run):
    at = ok(app(runs, monkeypatch, "overview", run))
    assert at.selectbox(key="ov_run").value == run
    if run == "bad-corrupt":
        assert any("corrupted" in w.value or "can't be read" in w.value for w in at.warning)
        return
    assert len(charts(at)) >= 2
    if run == "train-a":                           # 3 layers × 4 heads: layer × step heatmaps
        t = titles(at)
        assert "max |logit| per layer and head (max over heads)" in t and "Perplexity" in t
        ok(at.selectbox(key="agg-lmax").set_value("head 2").run())
        assert "(head 2)" in titles(at)
    if run == "live-partial":
        assert any("still being written" in i.value for i in at.info)


# -- Matrices --------------------------------------------------------------------------------

def test_matrices_step_layer_head_and_modes(runs, monkeypatch):
    at = ok(app(runs, monkeypatch, "matrices", "train-a"))
    assert len(charts(at)) == 4                              # α, B, A, ∂L/∂S
    at.selectbox(key="mx_layer").set_value(2)
    at.selectbox(key="mx_head").set_value(3)
    ok(at.select_slider(key="mx_step").set_value(50).run())
    t = titles(at)
    assert "step 50" in t and "L2 H3" in t and "α (attention)" in t and "A (advantage)" in t
    # probe tokens on the axes
    import json
    spec = json.loads(charts(at)[0].proto.spec)
    assert "the·0" in spec["layout"]["yaxis"]["ticktext"]
    # α on [0, 1]; signed matrices centred at 0
    heat = {json.loads(c.proto.spec)["layout"]["title"]["text"].split("</b>")[0]: json.loads(c.proto.spec)["data"][0]
            for c in charts(at)}
    assert (heat["<b>α (attention)"]["zmin"], heat["<b>α (attention)"]["zmax"]) == (0.0, 1.0)
    adv = heat["<b>A (advantage)"]
    assert adv["zmid"] == 0 and adv["zmin"] == -adv["zmax"]
    ok(at.pills(key="mx_kinds").set_value(["advantage"]).run())
    assert len(charts(at)) == 1
    ok(at.radio(key="mx_mode").set_value("two steps side by side").run())
    ok(at.select_slider(key="mx_step2").set_value(0).run())
    t = titles(at)
    assert "step 50" in t and "step 0" in t and len(charts(at)) == 2
    ok(at.radio(key="mx_mode").set_value("two runs side by side").run())
    ok(at.selectbox(key="mx_other").set_value("train-ls").run())
    assert "train-ls" in titles(at) and "train-a" in titles(at)
    ok(at.button(key="mx_play_btn").click().run())            # play: a fragment advances the step
    assert at.session_state["mx_play"] is True
    ok(at.button(key="mx_play_btn").click().run())
    assert at.session_state["mx_play"] is False


def test_matrices_cropped_and_pooled(runs, monkeypatch):
    at = ok(app(runs, monkeypatch, "matrices", "sticky/seed0-em"))
    assert len(charts(at)) == 8                              # overview + zoom for 4 quantities
    t = titles(at)
    assert "full T = 96, pooled 8×8" in t and "zoom (real entries)" in t
    assert any("Recorded crop: queries 64–95" in c.value for c in at.caption)
    ok(at.select_slider(key="mx_step").set_value(0).run())
    ok(at.selectbox(key="mx-zoom-size").set_value(32).run())
    ok(at.slider(key="mx-zoom-k").set_value(10).run())
    import json
    zoom = json.loads(charts(at)[1].proto.spec)["data"][0]
    assert arr(zoom["x"])[0] == 10 and len(arr(zoom["x"])) == 32 and arr(zoom["y"])[0] == 64


def test_matrices_missing_and_bad_runs(runs, monkeypatch):
    at = ok(app(runs, monkeypatch, "matrices", "attn-only"))
    assert len(charts(at)) == 1
    assert any("Not recorded in this run" in c.value for c in at.caption)
    ok(at.selectbox(key="mx_run").set_value("bad-corrupt").run())
    assert any("can't be read" in e.value or "no attention matrices" in e.value for e in at.error)
    ok(at.selectbox(key="mx_run").set_value("live-partial").run())
    assert at.select_slider(key="mx_step").options == ["0", "10", "20", "30"]   # only committed steps
    for c in charts(at):
        assert np.isfinite(arr(__import__("json").loads(c.proto.spec)["data"][0]["z"])).any()


# -- Trajectories ----------------------------------------------------------------------------

def test_trajectories_toy_raw_and_pca(runs, monkeypatch):
    at = ok(app(runs, monkeypatch, "trajectories", "toy-a"))
    assert at.radio(key="tr_proj").value == "raw 2-D"
    assert "value vectors v_j over training" in titles(at)
    ok(at.radio(key="tr_proj").set_value("PCA 3-D").run())
    assert any("PCA basis" in m.value for m in at.markdown)
    ok(at.radio(key="tr_col").set_value("step").run())
    ok(at.radio(key="tr_show").set_value("one step").run())
    ok(at.select_slider(key="tr_step").set_value(3).run())
    assert "at step 3" in titles(at)


def test_trajectories_basis_is_fitted_once(runs, monkeypatch):
    """Changing the drawn step must not refit: the projection of the final step is unchanged."""
    pkg = fixtures.load_app_package()
    x = np.random.default_rng(0).standard_normal((50, 6))
    b = pkg.analysis.fit_basis(x, 3)
    assert np.allclose(b.project(x[:5]), b.project(x)[:5])
    at = ok(app(runs, monkeypatch, "trajectories", "sticky/seed0-em"))
    ok(at.radio(key="tr_col").set_value("posterior entropy").run())
    assert any("posterior entropy" in m.label for m in at.metric)
    ok(at.selectbox(key="tr_vec").set_value("head_outputs").run())
    assert "head outputs" in titles(at)


# -- Compare ---------------------------------------------------------------------------------

def test_compare_groups_seeds_by_arm(runs, monkeypatch):
    at = app(runs, monkeypatch)
    at.multiselect(key="flt_kind").set_value(["sticky-markov"]).run()
    at.button(key="sel_all").click().run()
    at.switch_page("views/compare.py").run()
    ok(at)
    assert at.selectbox(key="cmp_group").value == "arm"
    table = at.dataframe[0].value
    assert list(table["group"]) == ["arm=em", "arm=sgd"] and list(table["runs"]) == [2, 2]
    assert table.set_index("group").loc["arm=em", "final (mean)"] < table.set_index("group").loc["arm=sgd", "final (mean)"]
    import json
    names = [d.get("name") for d in json.loads(charts(at)[0].proto.spec)["data"]]
    assert "arm=em (n=2)" in names and "arm=em −std" in names
    ok(at.selectbox(key="cmp_metric").set_value("max |logit| (recorded, max over layers and heads)").run())
    ok(at.toggle(key="cmp_each").set_value(True).run())


def test_compare_mhsa_vs_ls(runs, monkeypatch):
    at = app(runs, monkeypatch)
    at.multiselect(key="runs_select").set_value(["train-a", "train-ls"]).run()
    at.switch_page("views/compare.py").run()
    ok(at)
    assert at.selectbox(key="cmp_group").value == "model.attention"
    ok(at.selectbox(key="cmp_metric").set_value("logit_max/L2").run())
    assert set(at.dataframe[0].value["group"]) == {"model.attention=mhsa", "model.attention=ls"}


# -- downloads -------------------------------------------------------------------------------

def test_plots_without_a_figure_download_their_data_as_csv():
    pkg = fixtures.load_app_package()
    import pandas as pd
    m = np.arange(6.0).reshape(2, 3)
    csv = pd.read_csv(io.BytesIO(pkg.downloads.plot_data(pkg.plots.heatmap(m, "advantage", "A", row0=4, col0=1))))
    assert len(csv) == 6 and csv.set_index(["y", "x"]).loc[(5, 3), "z"] == m[1, 2]
    band = pkg.plots.bands({"em": pd.DataFrame({"mean": [1.0, 0.5], "std": [0.1, 0.1], "n": [2, 2]}, index=[0, 7])},
                           "loss", "loss")
    csv = pd.read_csv(io.BytesIO(pkg.downloads.plot_data(band)))
    assert list(csv[csv["trace"] == "em (n=2)"]["y"]) == [1.0, 0.5]
    assert not hasattr(pkg.downloads, "to_matplotlib")            # no second drawing pipeline


# -- CLI -------------------------------------------------------------------------------------

def test_cli_app_command(tmp_path, monkeypatch, capsys):
    from dyntool import cli
    from dyntool.cli import app as app_cli
    args = cli.build_parser().parse_args(["app", str(tmp_path), "--port", "8123", "--headless"])
    assert args.fn is app_cli.cmd_app
    argv = app_cli.streamlit_argv(tmp_path, 8123, "localhost")
    assert "--server.address=localhost" in argv and "--server.port=8123" in argv
    assert "--server.headless=true" in argv              # never Streamlit's first-run prompt
    assert argv[-2:] == ["--", str(tmp_path)] and argv[4].endswith("app/main.py")
    assert cli.main(["app", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_download_is_the_figures_pipeline_with_the_on_screen_selection(runs):
    """The download is byte for byte what dyntool.figures renders, and the view's selection
    (here the recorded step index f1 reads) reaches the figure."""
    from dyntool.figures import FIGURES, render_bytes
    from dyntool.run import open_run
    pkg = fixtures.load_app_package()
    toy = str(runs / "toy-a")
    assert pkg.downloads.pick(["no_such_figure", "f2_toy"], (toy,)) == "f2_toy"
    assert pkg.downloads.pick(["f6_value_pca"], (toy,)) is None          # a sticky figure: not for a toy run
    got = pkg.downloads.render("f1_feedback_loop", (toy,), "data", {"step_index": 3, "layer": 0})
    assert got == render_bytes(FIGURES["f1_feedback_loop"], [open_run(toy)], "data", step_index=3)
    assert got != pkg.downloads.render("f1_feedback_loop", (toy,), "data", {"step_index": 9})
    assert pkg.downloads.render("f2_toy", (toy,), "png")[:4] == b"\x89PNG"


def test_alpha_colour_range_fixed_or_fitted():
    plots = fixtures.load_app_package().plots
    m = np.full((4, 4), 0.002)
    assert plots.heatmap(m, "attn", "t").data[0].zmax == 1.0            # α on [0, 1] by default
    assert plots.heatmap(m, "attn", "t", zrange="auto").data[0].zmax == pytest.approx(0.002)
    signed = plots.heatmap(np.array([[-3.0, 1.0]]), "compat", "t").data[0]
    assert (signed.zmin, signed.zmid, signed.zmax) == (-3.0, 0.0, 3.0)


def test_alpha_log_scale_by_default_for_large_T():
    """At T = 96, α ≈ 1/T: drawn on a log scale that spans the data, stated on the colour bar;
    the hover still shows α itself; small T stays on [0, 1]."""
    plots = fixtures.load_app_package().plots
    assert plots.alpha_scale("auto", 96) == "log" and plots.alpha_scale("auto", 5) == "[0, 1]"
    assert plots.alpha_scale("fitted", 96) == "fitted"
    T = 96
    m = np.tril(np.full((T, T), 1.0))
    m[:, 0] = 20.0                                          # a sink: the structure to show
    m /= m.sum(1, keepdims=True)
    h = plots.heatmap(m, "attn", "t", alpha=plots.alpha_scale("auto", T)).data[0]
    assert "log scale" in h.colorbar.title.text
    z = np.asarray(h.z, dtype=float)
    assert np.allclose(z[np.tril_indices(T)], np.log10(np.clip(m, 10 ** h.zmin, None))[np.tril_indices(T)])
    assert np.isnan(z[np.triu_indices(T, 1)]).all()                # masked: blank, not the darkest colour
    assert h.zmax == pytest.approx(np.log10(m.max())) and h.zmin < np.log10(np.median(m[m > 0]))
    assert np.array_equal(np.asarray(h.customdata, dtype=float), m)
    # the spread of the non-sink entries (the structure) spans < 2% of the colours on [0, 1],
    # over ten times more on the log scale
    rest = m[1:, 1:][np.tril_indices(T - 1)]
    lo, hi = np.percentile(rest, [5, 95])
    on_log = (np.log10(hi) - np.log10(lo)) / (h.zmax - h.zmin)
    assert hi - lo < 0.02 and on_log > 0.15 and on_log > 10 * (hi - lo)


def test_word_ticks_thinned_for_T_64():
    plots = fixtures.load_app_package().plots
    toks = [f"w{i}" for i in range(64)]
    lay = plots.heatmap(np.full((64, 64), 1 / 64), "attn", "t", tokens=toks).layout
    assert len(lay.xaxis.ticktext) <= plots.MAX_TICKS["x"] and len(lay.yaxis.ticktext) <= plots.MAX_TICKS["y"]
    assert lay.xaxis.ticktext[0] == "w0·0" and lay.xaxis.tickvals[1] - lay.xaxis.tickvals[0] == 4


def test_matrices_sticky_alpha_shows_structure_by_default(runs, monkeypatch):
    import json
    at = ok(app(runs, monkeypatch, "matrices", "sticky/seed0-em"))
    specs = [json.loads(c.proto.spec) for c in charts(at)]
    alpha = [s["data"][0] for s in specs if "α (attention)" in s["layout"]["title"]["text"]]
    assert alpha and all("log scale" in a["colorbar"]["title"]["text"] for a in alpha)
    ok(at.selectbox(key="mx_alpha_scale").set_value("[0, 1]").run())
    specs = [json.loads(c.proto.spec) for c in charts(at)]
    alpha = [s["data"][0] for s in specs if "α (attention)" in s["layout"]["title"]["text"]]
    assert all((a["zmin"], a["zmax"]) == (0.0, 1.0) for a in alpha)
