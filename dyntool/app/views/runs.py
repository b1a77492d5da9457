"""Runs: every run under RUNS_DIR in a table, filters, and the selection the other pages use."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from dyntool.app import data, ui
from dyntool.app.data import AppInputError


def table(paths: list[str]) -> pd.DataFrame:
    rows = []
    for rp in paths:
        ap = ui.abspath(rp)
        try:
            s = data.summary(ap, data.signature(ap))
        except AppInputError as e:                        # gone or unreadable since listed: still shown
            s = {"kind": "?", "status": "corrupt", "tags": [], "problems": [str(e)]}
        rows.append({"run": rp, **s})
    df = pd.DataFrame(rows)
    if len(df) and "created" in df:
        df = df.sort_values("created", ascending=False, na_position="last")
    return df.reset_index(drop=True)


def filtered(df: pd.DataFrame) -> pd.DataFrame:
    """The filter row (kind, status, tags, name) and the rows that pass it."""
    f1, f2, f3, f4 = st.columns([1, 1, 1, 2])
    kinds = f1.multiselect("Kind", sorted(df["kind"].astype(str).unique()), key="flt_kind")
    stats = f2.multiselect("Status", sorted(df["status"].astype(str).unique()), key="flt_status")
    all_tags = sorted({t for ts in df["tags"] for t in (ts or [])})
    tags = f3.multiselect("Tags", all_tags, key="flt_tags")
    text = f4.text_input("Name contains", key="flt_text", placeholder="e.g. seed42 or em")
    view = df
    if kinds:
        view = view[view["kind"].isin(kinds)]
    if stats:
        view = view[view["status"].isin(stats)]
    if tags:
        view = view[view["tags"].apply(lambda ts: any(t in (ts or []) for t in tags))]
    if text:
        view = view[view["run"].str.contains(text, case=False, regex=False)]
    return view


def show_table(view: pd.DataFrame) -> None:
    shown = view.copy()
    shown["tags"] = shown["tags"].apply(lambda ts: ", ".join(ts or []))
    shown["problems"] = shown["problems"].apply(lambda ps: "; ".join(ps or []))
    if "created" in shown:                  # to the minute: the full ISO time was cut at the edge
        shown["created"] = shown["created"].apply(_minute)
    # only columns with something in every (final values) or some (tags, problems) row: no "None"
    # cells, and a table that fits the page width; problems last, the one long cell (the
    # expander below holds all of it), so no short column ends up cut behind it
    final_cols = [c for c in ("final loss", "final val_loss") if c in shown and shown[c].notna().all()]
    extra = [c for c in ("tags", "problems") if shown[c].astype(bool).any()]
    cols = ["run", "kind", "status", "steps", "recorded", "size_mb", *final_cols, "created", *extra]
    st.dataframe(shown[[c for c in cols if c in shown]], hide_index=True, width="stretch",
                 column_config={
                     "run": st.column_config.TextColumn("run", pinned=True),
                     "problems": st.column_config.TextColumn(
                         "problems", width="large", help="all of each in 'run(s) with problems' below"),
                     "created": st.column_config.TextColumn("created", help="UTC, to the minute"),
                     "steps": st.column_config.NumberColumn("steps", help="optimizer steps taken (docs/FORMAT.md)"),
                     "recorded": st.column_config.NumberColumn("recorded", help="recorded (committed) steps"),
                     "size_mb": st.column_config.NumberColumn("size", format="%.1f MB"),
                     **{c: st.column_config.NumberColumn(c, format="%.4g") for c in final_cols},
                 })


def _minute(created) -> str:
    """``2026-11-28T05:07:31+00:00`` -> ``2026-11-28 05:07`` (a run's meta writes UTC)."""
    text = str(created or "")
    return text[:16].replace("T", " ") if len(text) >= 16 and text[10:11] == "T" else text


def pick_selection(view: pd.DataFrame, paths: list[str]) -> None:
    """Select all shown / Clear selection, and the selection the other pages use."""
    options = list(view["run"])
    prev = [r for r in ui.selected() if r in paths]
    if st.session_state.get("runs_select") is None or set(st.session_state.get("runs_select", [])) - set(paths):
        st.session_state["runs_select"] = prev
    b1, b2, _ = st.columns([1, 1, 4])
    if b1.button("Select all shown", key="sel_all"):
        st.session_state["runs_select"] = sorted(set(st.session_state["runs_select"]) | set(options))
    if b2.button("Clear selection", key="sel_clear"):
        st.session_state["runs_select"] = []
    keep = sorted(set(options) | set(st.session_state["runs_select"]))
    chosen = st.multiselect("Selected runs (used by the other pages)", keep, key="runs_select")
    st.session_state["dt_selected"] = list(chosen)


def show_problems(view: pd.DataFrame) -> None:
    bad = view[view["problems"].apply(bool)]
    if len(bad):
        with st.expander(f"{len(bad)} run(s) with problems", expanded=False, icon=":material/warning:"):
            for _, r in bad.iterrows():
                for p in r["problems"]:              # plain text: problems quote the run's files
                    st.markdown(f"- {data.esc(r['run'])}: {data.esc(p)}")


def body() -> None:
    st.title("Runs")
    paths = ui.all_runs()
    if not paths:
        st.info(f"No runs found under `{ui.root() / ui.subdir()}`. Record one with "
                f"`dyntool sim toy --out {ui.root()}` (then press *Reload runs from disk*), "
                "or start the app on another folder: `dyntool app DIR`.")
        return
    df = table(paths)
    st.caption(f"{len(df)} run(s) under `{ui.root() / ui.subdir()}`. Select runs below; the "
               "Overview, Matrices, Trajectories and Compare pages use the selection.")
    view = filtered(df)
    show_table(view)
    pick_selection(view, paths)
    show_problems(view)


def page() -> None:
    try:
        paths = ui.all_runs()
    except AppInputError:
        paths = []
    live_any = bool(paths) and any(s == "running" for s in table(paths)["status"])
    ui.live(lambda: ui.guard(body), live_any, "runs")


page()
