"""Entry point: ``dyntool app [RUNS_DIR]`` runs ``streamlit run app/main.py -- RUNS_DIR``.

Registers ``app/`` as the package ``dyntool_app`` and navigates between the five pages.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dyntool.cli.app import load_app_package

APP_DIR = Path(__file__).resolve().parent

load_app_package(APP_DIR)
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
