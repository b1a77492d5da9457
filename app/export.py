"""Download every plot as a publication figure.

If the figures package (``dyntool.figures.registry.FIGURES``) has a figure for the view, the
download is exactly what ``dyntool figures`` writes (``spec.draw(runs, **opts)``).  Otherwise —
or if drawing it fails — the plotly figure on screen is redrawn in matplotlib from the same data
(:func:`to_matplotlib`), using ``dyntool.figures.style`` when it exists.  The UI says which.
The file is produced only when the button is clicked (deferred ``download_button`` data), so
exports cost nothing on a re-render.
"""
from __future__ import annotations

import io
import re
from typing import Iterable

import numpy as np
import streamlit as st

FORMATS = ("png", "pdf", "svg")
MIME = {"png": "image/png", "pdf": "application/pdf", "svg": "image/svg+xml"}


def registry() -> dict | None:
    """``FIGURES`` of the figures package, or None while it doesn't exist (imported lazily)."""
    try:
        from dyntool.figures.registry import FIGURES      # noqa: PLC0415
        return dict(FIGURES)
    except Exception:
        return None


_SUPPORT: dict = {}


def pick(names: Iterable[str], run_paths: tuple[str, ...] = ()) -> str | None:
    """The first registry figure among ``names`` whose run kinds match these runs (cheap: the full
    ``supports`` check, which may read arrays, happens at download time, with a fallback)."""
    reg = registry()
    if not reg:
        return None
    from . import data
    for n in names:
        if n not in reg:
            continue
        key = (n, run_paths, tuple(data.signature(p) for p in run_paths))
        if key not in _SUPPORT:
            try:
                spec = reg[n]
                ok = len(spec.select([data.get_run(p) for p in run_paths])) >= spec.min_runs
            except Exception:
                ok = False
            _SUPPORT[key] = ok
        if _SUPPORT[key]:
            return n
    return None


def _style():
    try:
        from dyntool.figures import style                 # noqa: PLC0415
    except Exception:
        return None
    for attr in ("apply", "use", "setup"):
        if callable(getattr(style, attr, None)):
            return getattr(style, attr)
    return None


# ---------------------------------------------------------------------------------------
# plotly -> matplotlib
# ---------------------------------------------------------------------------------------

def _color(c, alpha: float | None = None):
    if c is None:
        return None
    if isinstance(c, str):
        m = re.match(r"rgba?\(([^)]*)\)", c.replace(" ", ""))
        if m:
            parts = [float(p) for p in m.group(1).split(",")]
            rgb = tuple(p / 255 for p in parts[:3])
            a = parts[3] if len(parts) > 3 else 1.0
            return (*rgb, a if alpha is None else alpha)
    return c


def _cmap(scale):
    from matplotlib.colors import LinearSegmentedColormap
    if isinstance(scale, str):
        import matplotlib
        return scale if scale in matplotlib.colormaps else scale.lower()
    stops = [(float(f), _color(c)) for f, c in scale]
    stops = [(f, c[:3] if isinstance(c, tuple) else c) for f, c in stops]
    return LinearSegmentedColormap.from_list("plotly", stops)


def _edges(v: np.ndarray) -> tuple[float, float]:
    v = np.asarray(v, dtype=float)
    d = (v[1] - v[0]) if len(v) > 1 else 1.0
    return v[0] - d / 2, v[-1] + d / 2


def to_matplotlib(pfig):
    """Redraw one of our single-panel plotly figures (heatmap, lines, bands, scatter, 3-D) in matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    three = any(t.type == "scatter3d" for t in pfig.data)
    fig = plt.figure(figsize=(6.4, 4.8) if not any(t.type == "heatmap" for t in pfig.data) else (6, 5))
    ax = fig.add_subplot(projection="3d") if three else fig.add_subplot()
    prev_y = None
    lay = pfig.layout
    for t in pfig.data:
        label = t.name if (t.showlegend is not False and t.name) else None
        if t.type == "heatmap":
            z = np.asarray(t.z, dtype=float)
            x = np.asarray(t.x) if t.x is not None else np.arange(z.shape[1])
            y = np.asarray(t.y) if t.y is not None else np.arange(z.shape[0])
            x0, x1 = _edges(x)
            y0, y1 = _edges(y)
            rev = lay.yaxis.autorange == "reversed"
            vmin, vmax = t.zmin, t.zmax
            im = ax.imshow(z if rev else z[::-1], cmap=_cmap(t.colorscale), vmin=vmin, vmax=vmax,
                           extent=(x0, x1, y1, y0) if rev else (x0, x1, y0, y1), aspect="auto",
                           interpolation="nearest")
            cb = fig.colorbar(im, ax=ax)
            if t.colorbar and t.colorbar.title and t.colorbar.title.text:
                cb.set_label(t.colorbar.title.text)
        elif t.type in ("scatter", "scatter3d"):
            xs, ys = np.asarray(t.x, dtype=float), np.asarray(t.y, dtype=float)
            zs = np.asarray(t.z, dtype=float) if three else None
            mode = t.mode or "lines"
            lc = _color(t.line.color) if t.line and t.line.color else None
            if getattr(t, "fill", None) == "tonexty" and prev_y is not None:
                ax.fill_between(xs, prev_y, ys, color=_color(t.fillcolor), linewidth=0)
            elif "lines" in mode and (not t.line or t.line.width != 0):
                args = (xs, ys, zs) if three else (xs, ys)
                ax.plot(*args, color=lc, lw=(t.line.width or 1.5) if t.line else 1.5, label=label)
            if "markers" in mode:
                mc = t.marker.color if t.marker else None
                kw = {}
                if mc is not None and not isinstance(mc, str) and np.asarray(mc).dtype.kind in "fiu":
                    kw = dict(c=np.asarray(mc, dtype=float), cmap=_cmap(t.marker.colorscale or "Viridis"))
                elif mc is not None:
                    kw = dict(c=[_color(c) for c in mc] if not isinstance(mc, str) else _color(mc))
                args = (xs, ys, zs) if three else (xs, ys)
                sc = ax.scatter(*args, s=12, label=label, edgecolors="none", **kw)
                if "cmap" in kw and t.marker.colorbar and t.marker.colorbar.title:
                    fig.colorbar(sc, ax=ax).set_label(t.marker.colorbar.title.text or "")
            prev_y = ys
    for sh in lay.shapes or ():
        if sh.type == "rect":
            ax.add_patch(Rectangle((sh.x0, sh.y0), sh.x1 - sh.x0, sh.y1 - sh.y0, fill=False,
                                   edgecolor=_color(sh.line.color) or "orange", lw=1.5))
        elif sh.type == "line" and sh.y0 == sh.y1 and not three:
            ax.axhline(sh.y0, ls="--", color="#555", lw=1)
    title = lay.title.text if lay.title else None
    if title:
        ax.set_title(re.sub(r"<[^>]+>", "", title.replace("<br>", "\n")), fontsize=10)
    if three:
        sc = lay.scene
        ax.set_xlabel(sc.xaxis.title.text or "")
        ax.set_ylabel(sc.yaxis.title.text or "")
        ax.set_zlabel(sc.zaxis.title.text or "")
    else:
        ax.set_xlabel(lay.xaxis.title.text or "")
        ax.set_ylabel(lay.yaxis.title.text or "")
        if lay.yaxis.type == "log":
            ax.set_yscale("log")
        if lay.yaxis.ticktext:
            ax.set_yticks(list(lay.yaxis.tickvals), list(lay.yaxis.ticktext), fontsize=6)
        if lay.xaxis.ticktext:
            ax.set_xticks(list(lay.xaxis.tickvals), list(lay.xaxis.ticktext), fontsize=6, rotation=60)
        if lay.yaxis.scaleanchor == "x" and not any(t.type == "heatmap" for t in pfig.data):
            ax.set_aspect("equal", adjustable="datalim")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _save(mfig, fmt: str) -> bytes:
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    mfig.savefig(buf, format=fmt, dpi=200, bbox_inches="tight")
    plt.close(mfig)
    return buf.getvalue()


def render(pfig, fmt: str, figure: str | None = None, run_paths: tuple[str, ...] = (), opts: dict | None = None) -> bytes:
    """Bytes of the publication figure (registry) or of the matplotlib redraw of ``pfig``."""
    import matplotlib
    matplotlib.use("Agg")
    style = _style()
    if style is not None:
        try:
            style()
        except Exception:
            pass
    if figure:
        try:                                         # exactly what `dyntool figures` writes
            from dyntool.figures import FIGURES, render_bytes
            from dyntool.run import open_run
            return render_bytes(FIGURES[figure], [open_run(p) for p in run_paths], fmt)
        except Exception:
            pass                                     # fall back to the same data as on screen
    return _save(to_matplotlib(pfig), fmt)


def download(pfig, key: str, stem: str, figures: Iterable[str] = (), run_paths: Iterable[str] = (),
             opts: dict | None = None, container=None) -> None:
    """A download button under a plot + a caption saying what the file will be."""
    c = container or st
    fmt = st.session_state.get("dt_fig_fmt", "png")
    paths = tuple(run_paths)
    name = pick(figures, paths)
    label = f"{fmt.upper()} · publication figure `{name}`" if name else f"{fmt.upper()} · matplotlib redraw"
    c.download_button(label, icon=":material/download:", data=lambda: render(pfig, fmt, name, paths, opts),
                      file_name=f"{stem}.{fmt}", mime=MIME[fmt], key=f"dl-{key}", on_click="ignore",
                      type="tertiary",
                      help=(f"The same figure `dyntool figures {name}` writes." if name else
                            "A plain matplotlib redraw of the data in this plot: dyntool.figures has no "
                            "matching figure (yet)."))
