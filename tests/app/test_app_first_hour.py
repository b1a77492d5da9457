"""The app as a newcomer meets it (issue 50 item 6): the sidebar's selection line."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from . import fixtures


def test_the_sidebar_says_the_selection_made_in_this_rerun(tmp_path, monkeypatch):
    """Selecting runs on the Runs page left "No runs selected" in the sidebar until the next
    rerun (the sidebar was drawn before the page changed the selection)."""
    fixtures.make_toy(tmp_path, "toy-a", steps=3)
    fixtures.make_toy(tmp_path, "toy-b", steps=3, seed=1)
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=60).run()
    said = lambda: [c.value for c in at.sidebar.caption]          # noqa: E731
    assert "No runs selected: pages offer every run." in said(), said()
    at.multiselect(key="runs_select").set_value(["toy-a", "toy-b"]).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "2 run(s) selected on the Runs page" in said(), said()
    assert not any(c.startswith("No runs selected") for c in said()), said()


def test_the_runs_table_keeps_short_columns_whole(tmp_path, monkeypatch):
    """Item 6: the Runs table's last column (created, a full ISO time) was cut at the page edge
    behind the long problems column.  Created is shown to the minute, before tags and problems;
    problems (the long cell, all of it in the expander below) comes last."""
    fixtures.make_toy(tmp_path, "toy-a", steps=3)
    fixtures.make_corrupted(tmp_path)
    monkeypatch.setenv("DYNTOOL_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(fixtures.APP_DIR / "main.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    df = at.dataframe[0].value
    assert list(df.columns)[-1] == "problems" and list(df.columns).index("created") < list(df.columns).index("problems")
    created = df.set_index("run").loc["toy-a", "created"]
    assert len(created) == 16 and created[10] == " " and created[:4].isdigit(), created
