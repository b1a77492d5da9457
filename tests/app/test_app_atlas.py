"""The Atlas page under ``streamlit.testing.v1.AppTest`` on a real ``dyntool study atlas --preset ci``
study: the grid is the logged values at the chosen step (read back independently from
metrics.jsonl), the slider scrubs it, a quantity on the sparser gradient schedule snaps the step
to one it measured, the events are the fixed rules', and a run without the probe is one message."""
from __future__ import annotations

import json

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from dyntool.cli import main
from dyntool.train import atlas_events as E

from . import fixtures

MAIN = str(fixtures.APP_DIR / "main.py")
RUN = "atlas/mhsa-s0"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    rc = main(["study", "atlas", "--preset", "ci", "--seeds", "0", "--arms", "mhsa", "--out", str(root), "--name", "atlas",
               "--quiet", "--atlas.probe_seqs=2", "--atlas.rep_seqs=2", "--atlas.grad_every=2"])
    assert rc == 0
    fixtures.make_toy(root, "toy-a", steps=5)
    return root


def app(root, monkeypatch, run: str) -> AppTest:
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(root))
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    at.query_params["run"] = run
    at.switch_page("views/atlas.py").run()
    return at


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    assert not [e for e in at.error if "could not be drawn" in e.value], [e.value for e in at.error]
    return at


def grid(at: AppTest) -> np.ndarray:
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert spec["data"][0]["type"] == "heatmap"
    z = spec["data"][0]["z"]
    if isinstance(z, dict):                                  # a base64 typed array
        import base64
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(
            [int(x) for x in str(z["shape"]).split(",")])
    return np.asarray(z, dtype=float)


def logged(root, base: str, step: int) -> np.ndarray:
    """The run's own ``BASE/L{l}H{h}`` at ``step``, read from metrics.jsonl (2 layers × 2 heads)."""
    rows = [json.loads(line) for line in (root / RUN / "metrics.jsonl").read_text().splitlines() if line.strip()]
    row = next(r for r in rows if r.get("step") == step and f"{base}/L0H0" in r)
    return np.array([[row[f"{base}/L{l}H{h}"] for h in range(2)] for l in range(2)])


def test_grid_is_the_logged_values_and_the_slider_scrubs_it(runs, monkeypatch):
    at = ok(app(runs, monkeypatch, RUN))
    assert at.selectbox(key="at_run").value == RUN
    assert at.select_slider(key="at_step").value == 5                    # the last step by default
    np.testing.assert_allclose(grid(at), logged(runs, "atlas_first_mass", 5), rtol=1e-12)
    ok(at.select_slider(key="at_step").set_value(1).run())
    np.testing.assert_allclose(grid(at), logged(runs, "atlas_first_mass", 1), rtol=1e-12)
    assert "step 1" in json.loads(at.get("plotly_chart")[0].proto.spec)["layout"]["title"]["text"]
    # the gradient side is measured on steps 0, 2, 4 only: step 1 snaps to a measured one
    ok(at.selectbox(key="at_base").set_value("atlas_prev_adv").run())
    assert at.select_slider(key="at_step").options == ["0", "2", "4"]
    step = int(at.select_slider(key="at_step").value)
    assert step in (0, 2)
    np.testing.assert_allclose(grid(at), logged(runs, "atlas_prev_adv", step), rtol=1e-12)


def test_events_are_the_fixed_rules_on_the_run(runs, monkeypatch):
    at = ok(app(runs, monkeypatch, RUN))
    table = at.dataframe[0].value
    from dyntool.run import open_run
    df = open_run(runs / RUN).metrics
    ev = E.run_events(df, E.chance_levels(16), [(0, 0), (0, 1), (1, 0), (1, 1)])
    assert len(table) == 3 * 4                                           # 3 phenomena × 4 heads
    got = table.set_index(["phenomenon", "head"])["threshold θ"]
    for name in E.PHENOMENA:
        for head, e in ev[name]["heads"].items():
            assert got[(name, head)] == pytest.approx(e["threshold"])
    assert any("Loss bump" in c.value for c in at.caption)


def test_a_run_without_the_probe_is_one_message(runs, monkeypatch):
    at = ok(app(runs, monkeypatch, "toy-a"))
    assert any("has no atlas scores" in e.value for e in at.error)
    assert at.selectbox(key="at_run").options[0] == RUN                  # atlas runs are offered first


def test_empty_directory_is_a_message(tmp_path, monkeypatch):
    at = ok(app(tmp_path, monkeypatch, "x"))
    assert any("No runs found" in e.value for e in at.error)
