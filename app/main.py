"""Entry point: ``dyntool app [RUNS_DIR]`` runs ``streamlit run app/main.py -- RUNS_DIR``.

Registers ``app/`` as the package ``dyntool_app`` and navigates between the five pages.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import streamlit as st

APP_DIR = Path(__file__).resolve().parent


def _package():
    if "dyntool_app" not in sys.modules:
        spec = importlib.util.spec_from_file_location("dyntool_app", APP_DIR / "__init__.py",
                                                      submodule_search_locations=[str(APP_DIR)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["dyntool_app"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["dyntool_app"]


_package()
from dyntool_app import ui  # noqa: E402

st.set_page_config(page_title="dyntool", page_icon=":material/insights:", layout="wide")

PAGES = [
    st.Page(str(APP_DIR / "views" / "runs.py"), title="Runs", icon=":material/table_view:", default=True),
    st.Page(str(APP_DIR / "views" / "overview.py"), title="Overview", icon=":material/monitoring:"),
    st.Page(str(APP_DIR / "views" / "matrices.py"), title="Matrices", icon=":material/grid_on:"),
    st.Page(str(APP_DIR / "views" / "trajectories.py"), title="Trajectories", icon=":material/scatter_plot:"),
    st.Page(str(APP_DIR / "views" / "compare.py"), title="Compare", icon=":material/compare_arrows:"),
]

page = st.navigation(PAGES)
ui.sidebar()
page.run()
