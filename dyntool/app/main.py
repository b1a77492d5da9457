"""Entry point: ``dyntool app [RUNS_DIR]`` runs ``streamlit run <this file> -- RUNS_DIR``.

Navigates between the six pages in ``views/``.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dyntool.app import ui

VIEWS = Path(__file__).resolve().parent / "views"

st.set_page_config(page_title="dyntool", page_icon=":material/insights:", layout="wide")

PAGES = [
    st.Page(str(VIEWS / "runs.py"), title="Runs", icon=":material/table_view:", default=True),
    st.Page(str(VIEWS / "overview.py"), title="Overview", icon=":material/monitoring:"),
    st.Page(str(VIEWS / "matrices.py"), title="Matrices", icon=":material/grid_on:"),
    st.Page(str(VIEWS / "trajectories.py"), title="Trajectories", icon=":material/scatter_plot:"),
    st.Page(str(VIEWS / "compare.py"), title="Compare", icon=":material/compare_arrows:"),
    st.Page(str(VIEWS / "atlas.py"), title="Atlas", icon=":material/view_module:"),
]

page = st.navigation(PAGES)
ui.sidebar()
page.run()
ui.say_selection()            # after the page: the Runs page may have changed the selection
