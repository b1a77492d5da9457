"""The Overview shows the cheap tier per head as layer × step heatmaps (a real tiny training run)."""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from dyntool.cli import main
from tests.integration.test_train import CONFIG, TINY_ARGS

from .test_app_pages import MAIN, arr, charts, ok, titles


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    argv = ["train", "--config", str(CONFIG), "--preset", "small", "--out", str(root), "--name", "cheap",
            "--quiet", *TINY_ARGS, "--model.n_layer=3", "--model.n_head=4", "--max-steps", "6",
            "--record.cheap_every=1", "--train.final_eval=false"]
    assert main(argv) == 0
    return root


def test_overview_cheap_tier_heatmaps(runs, monkeypatch):
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(runs))
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    at.query_params["run"] = "cheap"
    ok(at.switch_page("views/overview.py").run())
    assert "every step" in titles(at)                       # attention entropy from the cheap tier
    box = at.selectbox(key="ov_cheap")
    names = [o.split(":")[0] for o in box.options]
    assert {"score_grad_norm", "column_entropy", "compat_var", "value_grad_norm"} <= set(names)
    ok(box.set_value("score_grad_norm").run())
    fig = json.loads(charts(at)[-1].proto.spec)
    assert "score gradient" in fig["layout"]["title"]["text"]
    z = arr(fig["data"][0]["z"])
    assert z.shape == (3, 6) and (z > 0).all()              # layer × step, every step
    ok(at.selectbox(key="agg-cheap-score_grad_norm").set_value("head 2").run())
    other = [m for m in at.multiselect if m.key == "ov_other"]
    assert all(not o.startswith("score_grad_norm/") for m in other for o in m.options)
