"""Publication figures from recorded runs: ``dyntool figures`` and the app's download buttons.

    from dyntool.figures import FIGURES, export, export_all, render_bytes
    rep = export_all(runs, "out/", formats="pdf,png")      # every figure the runs support
    png = render_bytes(FIGURES["f3_em_vs_sgd"], runs, "png")

Each figure is a :class:`~dyntool.figures.registry.FigureSpec` (``FIGURES[name]``) drawn in one
shared style (:mod:`dyntool.figures.style`) and written with its data (CSV/JSON) and a caption.
"""
from __future__ import annotations

from .writer import Report, data_bytes, export, export_all, render, render_bytes
from .catalog import load, plan
from .registry import FIGURES, FigureError, FigureSkip, FigureSpec

load()

__all__ = ["FIGURES", "FigureSpec", "FigureError", "FigureSkip", "Report", "data_bytes", "export",
           "export_all", "load", "plan", "render", "render_bytes"]
