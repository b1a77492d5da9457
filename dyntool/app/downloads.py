"""Downloads under the plots: the publication figure ``dyntool figures`` draws, for the runs and
the selection on screen.

A plot whose view has a figure in :data:`dyntool.figures.FIGURES` that these runs support gets a
button whose file is exactly ``render_bytes(FIGURES[name], runs, fmt, **opts)`` (``opts``: the
on-screen selection, e.g. layer, head, recorded step), drawn only when clicked.  A plot without
one gets the numbers it shows as CSV; its picture is one click away in the plot's own toolbar
(camera icon).  There is no second drawing code here.
"""
from __future__ import annotations

import io
from typing import Iterable

import numpy as np
import pandas as pd
import streamlit as st

from dyntool.errors import RunError
from dyntool.figures import FIGURES, render_bytes

from . import data

FORMATS = ("png", "pdf", "svg")
MIME = {"png": "image/png", "pdf": "application/pdf", "svg": "image/svg+xml", "csv": "text/csv"}

_SUPPORT: dict = {}


def pick(names: Iterable[str], run_paths: tuple[str, ...] = ()) -> str | None:
    """The first figure among ``names`` that these runs support (the figure's own check, cached
    per run signature)."""
    for n in names:
        spec = FIGURES.get(n)
        if spec is None:
            continue
        key = (n, run_paths, tuple(data.signature(p) for p in run_paths))
        if key not in _SUPPORT:
            try:
                _SUPPORT[key] = spec.supports([data.get_run(p) for p in run_paths])[0]
            except (RunError, data.AppInputError):     # unreadable data: no figure from it
                _SUPPORT[key] = False
        if _SUPPORT[key]:
            return n
    return None


def render(name: str, run_paths: tuple[str, ...], fmt: str, opts: dict | None = None) -> bytes:
    """The bytes ``dyntool figures`` would write for figure ``name``, with the on-screen ``opts``."""
    return render_bytes(FIGURES[name], [data.get_run(p) for p in run_paths], fmt, **(opts or {}))


def plot_data(pfig) -> bytes:
    """The numbers a plotly figure shows, as CSV: one row per point (trace, x, y[, z]); a heatmap
    as one row per cell."""
    frames = []
    for i, t in enumerate(pfig.data):
        name = t.name or f"trace {i}"
        if t.type == "heatmap":
            z = np.asarray(t.customdata if t.customdata is not None else t.z, dtype=float)   # α: not its log
            y = np.asarray(t.y) if t.y is not None else np.arange(z.shape[0])
            x = np.asarray(t.x) if t.x is not None else np.arange(z.shape[1])
            yy, xx = np.meshgrid(y, x, indexing="ij")
            frames.append(pd.DataFrame({"trace": name, "x": xx.ravel(), "y": yy.ravel(), "z": z.ravel()}))
        elif getattr(t, "x", None) is not None and getattr(t, "y", None) is not None:
            cols = {"trace": name, "x": np.asarray(t.x), "y": np.asarray(t.y)}
            if getattr(t, "z", None) is not None:
                cols["z"] = np.asarray(t.z)
            frames.append(pd.DataFrame(cols))
    buf = io.StringIO()
    (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()).to_csv(buf, index=False)
    return buf.getvalue().encode()


def _describe(opts: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (opts or {}).items())


def download(pfig, key: str, stem: str, figures: Iterable[str] = (), run_paths: Iterable[str] = (),
             opts: dict | None = None, container=None) -> None:
    """A download button under a plot: the publication figure when there is one, else its data."""
    c = container or st
    fmt = st.session_state.get("dt_fig_fmt", "png")
    paths = tuple(run_paths)
    name = pick(figures, paths)
    if name:
        sel = _describe(opts)
        c.download_button(f"{fmt.upper()} · publication figure `{name}`", icon=":material/download:",
                          data=lambda: render(name, paths, fmt, opts), file_name=f"{stem}.{fmt}",
                          mime=MIME[fmt], key=f"dl-{key}", on_click="ignore", type="tertiary",
                          help=f"What `dyntool figures --only {name}` writes for these runs"
                               + (f", drawn with this view's selection ({sel})." if sel else "."))
    else:
        c.download_button("CSV · the data in this plot", icon=":material/download:",
                          data=lambda: plot_data(pfig), file_name=f"{stem}.csv", mime=MIME["csv"],
                          key=f"dl-{key}", on_click="ignore", type="tertiary",
                          help="No publication figure in dyntool.figures matches this view; the camera "
                               "icon in the plot's toolbar saves it as a PNG.")
