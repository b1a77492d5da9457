"""Widgets and guards shared by the pages: the sidebar, run pickers, problem banners, live refresh.

Selection: the Runs page stores the chosen runs (paths relative to RUNS_DIR) in
``st.session_state["dt_selected"]``; every other page offers those runs, or all runs while none
are selected.  Every page body runs inside :func:`guard`, so bad input is a message, not a
traceback.
"""
from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Callable

import streamlit as st

from . import data
from .data import AppInputError, esc
from ..errors import DyntoolError, RunError

LIVE_EVERY_S = 5.0
FORMATS = ("png", "pdf", "svg")


def root() -> Path:
    return data.runs_root()


def subdir() -> str:
    return st.session_state.get("dt_subdir", "") or ""


def sidebar() -> None:
    r = root()
    with st.sidebar:
        st.caption(f"RUNS_DIR: `{r}`")
        sub = st.text_input("Folder inside RUNS_DIR", value=subdir(), key="dt_subdir_box",
                            placeholder="e.g. sticky/ (empty: everything)",
                            help="Only folders inside RUNS_DIR can be opened.")
        try:
            data.resolve_inside(r, sub)
            st.session_state["dt_subdir"] = sub
        except AppInputError as e:
            st.error(esc(e))
            st.session_state["dt_subdir"] = ""
        # filled after the page body (main.py): the Runs page changes the selection in this very
        # rerun, and a caption written now would show the previous one
        st.session_state["_dt_sel_slot"] = st.empty()
        st.selectbox("Figure download format", FORMATS, key="dt_fig_fmt")
        if st.button("Reload runs from disk", help="Clear cached listings and slices"):
            data.clear_caches()


# What a half-written or damaged run can still raise below the reader's own checks: dyntool's errors
# (a figure that can't be drawn from it), a file gone since it was listed (OSError), a missing key or
# index (LookupError), a value that doesn't parse or fit (ValueError: JSON, numpy shapes).  zarr's own
# errors are all of these kinds.  Anything else is a bug in the app: streamlit shows its traceback, on
# this page only.
DATA_ERRORS = (DyntoolError, OSError, LookupError, ValueError)


def selection_caption() -> str:
    sel = selected()
    return f"{len(sel)} run(s) selected on the Runs page" if sel else "No runs selected: pages offer every run."


def say_selection() -> None:
    """The sidebar's selection line, written after the page ran (main.py)."""
    slot = st.session_state.get("_dt_sel_slot")
    if slot is not None:
        slot.caption(selection_caption())


def guard(body: Callable[[], None]) -> None:
    """Run a page body; problems of the input or the data become one-line messages, not tracebacks."""
    try:
        body()
    except (AppInputError, RunError) as e:          # bad input, a corrupt chunk: the reader's message
        st.error(esc(e))
    except DATA_ERRORS as e:
        st.error(f"This view could not be drawn: {type(e).__name__}: {esc(e)}. The run may be incomplete "
                 "or corrupted; the other pages still work.")
        if os.environ.get("DYNTOOL_DEBUG"):
            st.code(traceback.format_exc())


def all_runs() -> list[str]:
    """Paths (relative to RUNS_DIR) of every run under the chosen folder."""
    return data.discover(str(root()), subdir())


def abspath(relpath: str) -> str:
    return str(data.resolve_inside(root(), relpath))


def selected() -> list[str]:
    return list(st.session_state.get("dt_selected", []))


def candidates() -> list[str]:
    """The runs the analysis pages offer: the selection, or every run when nothing is selected."""
    runs = all_runs()
    if not runs:
        raise AppInputError(f"No runs found under {root() / subdir()}. Record one with "
                            f"`dyntool sim toy --out {root()}`, or open another RUNS_DIR: `dyntool app DIR`.")
    sel = [r for r in selected() if r in runs]
    return sel or newest_first(runs)


def newest_first(runs: list[str]) -> list[str]:
    """Most recently created first; runs with problems (unreadable meta) last."""
    def key(r: str):
        p = abspath(r)
        try:
            s = data.summary(p, data.signature(p))
        except AppInputError:
            return (True, "")
        return (s["status"] in ("corrupt", "unknown"), _neg(s.get("created", "")))
    return sorted(runs, key=key)


def _neg(s: str) -> str:
    """Sort key that orders ISO timestamps descending."""
    return "".join(chr(0x10FFFF - ord(ch)) for ch in s)


def pick_run(label: str = "Run", key: str = "run", options: list[str] | None = None, index: int = 0,
             container=None) -> str:
    """A run selectbox; returns the absolute path (checked to be inside RUNS_DIR)."""
    opts = options if options is not None else candidates()
    c = container or st
    if st.session_state.get(key) not in opts:
        st.session_state.pop(key, None)
        wanted = st.query_params.get("run")          # ?run=<path inside RUNS_DIR> preselects a run
        if wanted in opts:
            st.session_state[key] = wanted
    choice = c.selectbox(label, opts, index=min(index, len(opts) - 1), key=key)
    return abspath(choice)


def pick_index(label: str, n: int, key: str, container=None, fmt: Callable[[int], str] = str) -> int:
    """Layer/head/seq picker: a selectbox when there is a choice, else 0."""
    if n <= 1:
        return 0
    c = container or st
    if st.session_state.get(key, 0) >= n:
        st.session_state[key] = 0
    return int(c.selectbox(label, list(range(n)), key=key, format_func=fmt))


def run_banner(path: str) -> None:
    """Status line + any problems of one run."""
    run = data.get_run(path)
    mark = data.marker(path)
    rid = esc(run.id)                                # every string from the run's files: plain text
    if data.is_live(run):
        st.info(f"{rid} is still being written: showing its {mark} committed recorded step(s); "
                f"this view refreshes every {LIVE_EVERY_S:.0f} s.", icon=":material/hourglass_top:")
    elif run.status in ("failed", "interrupted"):
        st.warning(f"{rid} ended as **{run.status}**"
                   + (f": {esc(run.meta.get('error'))}" if run.meta.get("error") else "")
                   + ". Everything committed before that is shown.")
    for p in run.problems:
        st.warning(f"{rid}: {esc(p)}")
    for n in run.notes:
        st.info(f"{rid}: {esc(n)}")


def live(fn: Callable[[], None], is_live: bool, key: str) -> None:
    """Draw ``fn`` once, or as a fragment that re-runs itself every few seconds for a live run
    (it re-reads the commit marker, so new steps appear without touching the rest of the page)."""
    if is_live:
        st.fragment(fn, run_every=LIVE_EVERY_S)()
    else:
        fn()


def need(info: dict, *names: str) -> None:
    missing = [n for n in names if n not in info["arrays"]]
    if missing:
        have = ", ".join(sorted(info["arrays"])) or "nothing"
        raise AppInputError(f"This run did not record {', '.join(f'`{m}`' for m in missing)} "
                            f"(recorded: {have}). Add it to `record.arrays` in the run config.")
