"""Writing figures: ``NAME.{pdf,png,svg}`` + ``NAME.csv`` or ``NAME.json`` + ``NAME.txt`` (caption).

* :func:`export` — one figure to a directory;
* :func:`export_all` — every figure the runs support (what ``dyntool figures`` calls);
* :func:`render_bytes` — one figure as bytes (the Streamlit app's download buttons).

Files are byte-stable: fixed metadata (:mod:`.style`), fixed dpi, CSV floats with 10 significant
digits, JSON with sorted keys.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import style
from ..atomic import write_bytes
from ..errors import RunError
from .catalog import load, plan
from .registry import FigureError, FigureSkip, FigureSpec


def render(spec: FigureSpec, runs: list, **opts):
    """Draw ``spec`` on ``runs`` in the shared style -> (Figure, data, caption).

    Raises :class:`FigureSkip` when the runs lack what the figure needs.
    """
    ok, why = spec.supports(runs)
    if not ok:
        raise FigureSkip(f"{spec.name}: {why}")
    with style.context():
        return spec.draw(spec.select(runs), **opts)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return float(f"{x:.10g}") if math.isfinite(x) else None     # 10 significant digits, as the CSVs
    if isinstance(x, Path):
        return str(x)
    return x


def data_bytes(data) -> tuple[str, bytes]:
    """(extension, bytes) of the data behind a figure: a DataFrame as CSV, anything else as JSON."""
    if isinstance(data, pd.DataFrame):
        return "csv", data.to_csv(index=False, float_format="%.10g", lineterminator="\n").encode()
    return "json", (json.dumps(_jsonable(data), indent=1, sort_keys=True, allow_nan=False) + "\n").encode()


def _write(path: Path, payload: bytes) -> None:
    write_bytes(path, payload)


def parse_formats(formats) -> list[str]:
    if isinstance(formats, str):
        formats = [f.strip().lower() for f in formats.split(",") if f.strip()]
    formats = list(dict.fromkeys(formats))
    bad = [f for f in formats if f not in style.FORMATS]
    if bad or not formats:
        raise FigureError(f"unknown figure format(s) {', '.join(bad) or '(none)'}; "
                          f"use a comma list of {', '.join(style.FORMATS)}")
    return formats


def export(spec: FigureSpec, runs: list, out_dir, formats=("pdf", "png"), dpi: int | None = None,
           **opts) -> list[Path]:
    """Draw one figure and write it with its data and caption; returns the written paths."""
    formats = parse_formats(formats)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, data, caption = render(spec, runs, **opts)
    written = []
    try:
        for fmt in formats:
            p = out / f"{spec.name}.{fmt}"
            _write(p, style.to_bytes(fig, fmt, dpi))
            written.append(p)
    finally:
        fig.clear()
    ext, payload = data_bytes(data)
    for other in ("csv", "json"):              # a stale file of the other type would mislead
        if other != ext and (out / f"{spec.name}.{other}").exists():
            (out / f"{spec.name}.{other}").unlink()
    _write(out / f"{spec.name}.{ext}", payload)
    _write(out / f"{spec.name}.txt", (" ".join(caption.split()) + "\n").encode())
    return written + [out / f"{spec.name}.{ext}", out / f"{spec.name}.txt"]


def render_bytes(spec: FigureSpec, runs: list, fmt: str = "png", dpi: int | None = None, **opts) -> bytes:
    """One figure as the bytes of a PDF/PNG/SVG file, or of its data (``fmt`` = "data" / "csv" /
    "json") or caption (``"txt"``)."""
    fig, data, caption = render(spec, runs, **opts)
    try:
        if fmt in ("data", "csv", "json"):
            return data_bytes(data)[1]
        if fmt == "txt":
            return (" ".join(caption.split()) + "\n").encode()
        return style.to_bytes(fig, parse_formats(fmt)[0], dpi)
    finally:
        fig.clear()


@dataclass
class Report:
    written: dict[str, list[Path]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)     # name -> what the runs lack
    failed: dict[str, str] = field(default_factory=dict)      # name -> unexpected error (a bug or bad data)
    seconds: dict[str, float] = field(default_factory=dict)


def export_all(runs: list, out_dir, formats=("pdf", "png"), only: list[str] | None = None,
               dpi: int | None = None, log=None) -> Report:
    """Every figure ``runs`` support (or those in ``only``); a figure that can't be drawn from
    these runs is skipped with its reason, never raised.  An unexpected error in one figure (e.g. an
    unreadable chunk) is recorded in ``failed`` and the others are still drawn (``DYNTOOL_DEBUG=1``
    re-raises it)."""
    formats = parse_formats(formats)
    load()
    p = plan(runs, only)
    rep = Report(skipped=dict(p.skipped))
    for name, spec in p.ready.items():
        t0 = time.perf_counter()
        try:
            rep.written[name] = export(spec, runs, out_dir, formats, dpi)
        except FigureSkip as e:
            rep.skipped[name] = str(e).removeprefix(f"{name}: ")
        except RunError as e:                  # a corrupt chunk: say which, draw the other figures
            rep.skipped[name] = f"recorded data can't be read: {e}"
        except Exception as e:
            if os.environ.get("DYNTOOL_DEBUG"):
                raise
            rep.failed[name] = f"{type(e).__name__}: {e}"
        rep.seconds[name] = time.perf_counter() - t0
        if log is not None:
            log(name, rep)
    return rep
