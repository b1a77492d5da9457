"""Plotly figure builders.  One figure = one panel, so :mod:`export` can redraw it in matplotlib.

Colour conventions: α on a sequential scale — [0, 1] for small T, a log scale by default from
T = 32 on (where α ≈ 1/T would be uniformly dark on [0, 1]), or a range fitted to the data; the
colour bar's title says which.  Signed matrices (B, A, ∂L/∂S) on a diverging scale centred at 0
and symmetric in ±max|x|.  Hover always shows the exact value.
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

SEQ_SCALE = "Viridis"
DIV_SCALE = "RdBu_r"
CONFIG = {"displaylogo": False, "displayModeBar": "hover"}     # st.plotly_chart(config=...)
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")

# how each recorded matrix is drawn: (label, colour mode, one-line meaning)
MATRIX_KINDS = {
    "attn": ("α (attention)", "prob", "α_ij = softmax_j(s_ij): how much query i reads key j; each row sums to 1."),
    "compat": ("B = U Vᵀ (compatibility)", "signed",
               "b_ij = u_i·v_j = ∂L/∂α_ij: negative (blue) = moving more weight to key j lowers the loss."),
    "advantage": ("A (advantage)", "signed",
                  "A_ij = E_α[b]_i − b_ij: positive (red) = value j is better than query i's current mix, "
                  "so gradient descent raises s_ij."),
    "score_grad": ("∂L/∂S (score gradient)", "signed",
                   "∂L/∂s_ij = α_ij (b_ij − E_α[b]_i) = −α_ij A_ij: the routing law; each row sums to 0."),
    "scores": ("S (scores)", "plain", "s_ij = q_i·k_j/√d_k; masked entries are blank."),
}


ALPHA_SCALES = ("auto", "log", "fitted", "[0, 1]")
LOG_FROM_T = 32          # "auto": a log colour scale for α from this T on
MAX_TICKS = {"x": 20, "y": 32}     # word labels per axis beyond which every k-th one is shown


def alpha_scale(choice: str, T: int) -> str:
    """The α colour scale to draw: ``choice``, with "auto" = log for T ≥ 32, else [0, 1]."""
    if choice != "auto":
        return choice
    return "log" if T >= LOG_FROM_T else "[0, 1]"


def _alpha_colour(m: np.ndarray, scale: str) -> tuple[np.ndarray, dict]:
    """(values to colour, Heatmap keywords) for an α matrix on ``scale``."""
    finite = m[np.isfinite(m)]
    if scale == "log":
        pos = finite[finite > 0]
        lo = max(float(np.percentile(pos, 1)) if pos.size else 1e-6, 1e-8)
        hi = max(float(pos.max()) if pos.size else 1.0, lo * 10)
        # α = 0 only where masked: blank, like any masked entry (log 0 has no colour)
        z = np.where(m > 0, np.log10(np.clip(m, lo, None)), np.nan)
        t = log_ticks([lo, hi])
        return z, dict(colorscale=SEQ_SCALE, zmin=np.log10(lo), zmax=np.log10(hi),
                       colorbar=dict(thickness=12, title=dict(text="α, log scale", side="right"),
                                     tickvals=[float(np.log10(v)) for v in t.get("tickvals", [])],
                                     ticktext=t.get("ticktext", [])))
    if scale == "fitted":
        top = float(finite.max()) if finite.size else 1.0
        return m, dict(colorscale=SEQ_SCALE, zmin=0.0, zmax=top or 1.0,
                       colorbar=dict(thickness=12, title=dict(text=f"α, range fitted: 0–{top:.2g}", side="right")))
    return m, dict(colorscale=SEQ_SCALE, zmin=0.0, zmax=1.0,
                   colorbar=dict(thickness=12, title=dict(text="α on [0, 1]", side="right")))


MAX_LEGEND_BELOW = 6      # more legend entries than this: a scrolling column on the right


def _layout(fig: go.Figure, title: str, height: int = 380, **kw) -> go.Figure:
    """Shared layout: title on the left with the toolbar stacked vertically on the right edge (so
    it never covers a title); a short legend below the plot, a long one in a scrolling column."""
    n_legend = sum(1 for t in fig.data if t.showlegend is not False and t.name)
    legend = (dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0) if n_legend <= MAX_LEGEND_BELOW
              else dict(orientation="v", yanchor="top", y=1, xanchor="left", x=1.02, font=dict(size=10)))
    # room on the right for the toolbar, beyond a colour bar (plotly widens the margin to fit the
    # bar itself, so without the extra room the toolbar covers its tick labels)
    bar = any(t.type == "heatmap" or getattr(getattr(t, "marker", None), "colorbar", None) is not None
              and t.marker.colorscale is not None for t in fig.data)
    fig.update_layout(title=dict(text=title, x=0, xanchor="left", font=dict(size=15)), height=height,
                      margin=dict(l=10, r=100 if bar else 40, t=70 if "<br>" in title else 45, b=10 if height < 300 else 30),
                      template="plotly_white", legend=legend, modebar=dict(orientation="v"), **kw)
    return fig


def log_ticks(values) -> dict:
    """Tick values and text for a log axis: 1, 2, 5 × 10^k inside the data's range, written plainly
    (plotly's own log ticks mix digits and SI suffixes, e.g. "3, 2, 10k")."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return {}
    lo, hi = np.log10(v.min()), np.log10(v.max())
    ticks = [m * 10.0 ** e for e in range(int(np.floor(lo)), int(np.ceil(hi)) + 1) for m in (1, 2, 5)]
    inside = [t for t in ticks if v.min() / 1.05 <= t <= v.max() * 1.05]
    if len(inside) < 2:                      # a narrow range: the data's ends
        inside = sorted({float(f"{v.min():.2g}"), float(f"{v.max():.2g}")})
    if len(inside) > 8:                      # a wide range: decades only
        inside = [t for t in inside if f"{t:g}".lstrip("0.").startswith("1")] or inside
    return dict(tickvals=inside, ticktext=[f"{t:g}" for t in inside])


def _axis_labels(n: int, start: int, step: int, tokens: list[str] | None, most: int = 32):
    """(positions, tick positions, tick text): word ticks when the run has tokens and n ≤ 64, every
    k-th one so that at most ``most`` are drawn (they stay readable; hover names every cell)."""
    pos = start + step * np.arange(n)
    if tokens is None or step != 1 or n > 64:
        return pos, None, None
    k = max(1, -(-n // most))
    shown = pos[::k]
    return pos, shown, [f"{tokens[p]}·{p}" if 0 <= p < len(tokens) else str(p) for p in shown]


def heatmap(m: np.ndarray, kind: str, title: str, row0: int = 0, col0: int = 0, block: int = 1,
            tokens: list[str] | None = None, zrange: float | str | None = None, rect: tuple | None = None,
            height: int = 460, alpha: str = "[0, 1]") -> go.Figure:
    """A (query × key) heatmap.  ``row0``/``col0``: position of the first row/column; ``block``: a
    pooled view whose cells cover ``block`` positions; ``rect``: (q0, q1, k0, k1) to outline;
    ``alpha``: the colour scale of α ("[0, 1]", "fitted", "log"; see :func:`alpha_scale`);
    ``zrange``: the ± range of a signed matrix (so side-by-side panels share colours)."""
    mode = MATRIX_KINDS.get(kind, ("", "plain", ""))[1]
    rows, rticks, rtext = _axis_labels(m.shape[0], row0, block, tokens, MAX_TICKS["y"])
    cols, cticks, ctext = _axis_labels(m.shape[1], col0, block, tokens, MAX_TICKS["x"])
    what = "block mean" if block > 1 else "value"
    where = (f"queries %{{y}}…+{block - 1}<br>keys %{{x}}…+{block - 1}" if block > 1 else
             "query i = %{y}<br>key j = %{x}")
    z, kw = m, {}
    if mode == "prob":
        z, kw = _alpha_colour(m, "fitted" if zrange == "auto" else alpha)
        kw["customdata"] = m                 # hover shows α itself, whatever the colour scale
        hover = f"{where}<br>{what} = %{{customdata:.6g}}<extra></extra>"
    else:
        hover = f"{where}<br>{what} = %{{z:.6g}}<extra></extra>"
        if mode == "signed":
            r = zrange if isinstance(zrange, (int, float)) else float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 1.0
            kw = dict(colorscale=DIV_SCALE, zmid=0.0, zmin=-(r or 1e-12), zmax=r or 1e-12)
        else:
            kw = dict(colorscale=SEQ_SCALE)
        kw["colorbar"] = dict(thickness=12)
    fig = go.Figure(go.Heatmap(z=z, x=cols, y=rows, hovertemplate=hover, **kw))
    if rect is not None:
        q0, q1, k0, k1 = rect
        fig.add_shape(type="rect", x0=k0 - 0.5, x1=k1 - 0.5, y0=q0 - 0.5, y1=q1 - 0.5,
                      line=dict(color="#ff7f0e", width=2))
    fig.update_yaxes(autorange="reversed", title="query i", scaleanchor="x", constrain="domain")
    fig.update_xaxes(title="key j", constrain="domain")
    if rtext is not None:
        fig.update_yaxes(tickvals=rticks, ticktext=rtext, tickfont=dict(size=10))
    if ctext is not None:
        fig.update_xaxes(tickvals=cticks, ticktext=ctext, tickangle=-60, tickfont=dict(size=10))
    return _layout(fig, title, height=height)


def curves(df: pd.DataFrame, ys: list[str], title: str, x: str = "step", log_y: bool = False,
           names: dict[str, str] | None = None, y_title: str = "", height: int = 320) -> go.Figure:
    """Line curves of metric columns against ``x`` (NaN rows of each column dropped)."""
    fig = go.Figure()
    for i, col in enumerate(ys):
        s = df[[x, col]].dropna()
        name = html.escape(str((names or {}).get(col, col)), quote=False)    # column names come from the run
        fig.add_trace(go.Scatter(x=s[x], y=s[col], mode="lines" if len(s) > 1 else "markers",
                                 name=name, line=dict(color=PALETTE[i % len(PALETTE)]),
                                 hovertemplate=f"{name}<br>step %{{x}}<br>%{{y:.6g}}<extra></extra>"))
    fig.update_xaxes(title=x)
    fig.update_yaxes(title=y_title, type="log" if log_y else "linear")
    if log_y:
        fig.update_yaxes(**log_ticks(np.concatenate([df[c].to_numpy(dtype=float) for c in ys])))
    return _layout(fig, title, height=height, hovermode="x unified")


def layer_step_heatmap(values: np.ndarray, steps: np.ndarray, title: str, z_title: str,
                       row_name: str = "layer", height: int = 320) -> go.Figure:
    """(steps, rows) as a rows × step heatmap (many layers or heads at once)."""
    fig = go.Figure(go.Heatmap(z=values.T, x=steps, y=np.arange(values.shape[1]), colorscale=SEQ_SCALE,
                               colorbar=dict(title=z_title, thickness=12),
                               hovertemplate=f"{row_name} %{{y}}<br>step %{{x}}<br>{z_title} = %{{z:.6g}}<extra></extra>"))
    fig.update_xaxes(title="step")
    fig.update_yaxes(title=row_name, dtick=1)
    return _layout(fig, title, height=height)


def bands(groups: dict[str, pd.DataFrame], title: str, y_title: str, log_y: bool = False,
          height: int = 420, hline: tuple[float, str] | None = None) -> go.Figure:
    """Mean ± std bands (frames with ``mean``, ``std``, ``n`` indexed by step), one per group."""
    fig = go.Figure()
    for i, (label, b) in enumerate(groups.items()):
        c = PALETTE[i % len(PALETTE)]
        x = b.index.to_numpy()
        n = int(b["n"].max()) if len(b) else 0
        if n > 1:
            rgba = "rgba({},{},{},0.18)".format(*(int(c[k:k + 2], 16) for k in (1, 3, 5)))
            fig.add_trace(go.Scatter(x=x, y=b["mean"] + b["std"], mode="lines", line=dict(width=0),
                                     showlegend=False, hoverinfo="skip", name=f"{label} +std"))
            fig.add_trace(go.Scatter(x=x, y=b["mean"] - b["std"], mode="lines", line=dict(width=0),
                                     fill="tonexty", fillcolor=rgba, showlegend=False, hoverinfo="skip",
                                     name=f"{label} −std"))
        fig.add_trace(go.Scatter(x=x, y=b["mean"], mode="lines", line=dict(color=c, width=2),
                                 name=f"{label} (n={n})", customdata=np.stack([b["std"], b["n"]], axis=-1),
                                 hovertemplate=f"{label}<br>step %{{x}}<br>mean %{{y:.6g}} ± %{{customdata[0]:.3g}}"
                                               f" (n=%{{customdata[1]}})<extra></extra>"))
    if hline is not None:
        fig.add_hline(y=hline[0], line_dash="dash", line_color="#555", annotation_text=hline[1])
    fig.update_xaxes(title="step")
    fig.update_yaxes(title=y_title, type="log" if log_y else "linear")
    if log_y and groups:
        fig.update_yaxes(**log_ticks(np.concatenate([(b["mean"] + s * b["std"]).to_numpy(dtype=float)
                                                     for b in groups.values() for s in (-1, 1)])))
    return _layout(fig, title, height=height, hovermode="x unified")


def _xyz(a: np.ndarray, three: bool) -> dict:
    """Scatter coordinates from the last axis of ``a`` (x, y and, in 3-D, z)."""
    return dict(x=a[..., 0], y=a[..., 1], **({"z": a[..., 2]} if three else {}))


def _class_colour(cls: int) -> str:
    return PALETTE[cls % len(PALETTE)] if cls >= 0 else "#999"


def _path_traces(fig: go.Figure, xyz: np.ndarray, steps: np.ndarray, positions: np.ndarray, color: str,
                 color_values: np.ndarray | None, hover: str) -> None:
    """One line per position over the steps: one colour per class, else light grey."""
    three = xyz.shape[-1] >= 3
    S = go.Scatter3d if three else go.Scatter
    classes = {}
    for pi, pos in enumerate(positions):
        path = xyz[:, pi]
        cd = np.stack([np.full(len(steps), pos), steps], axis=1)
        if color == "class" and color_values is not None:
            cls = int(color_values[pi])
            c = _class_colour(cls)
            first = cls not in classes
            classes[cls] = True
            fig.add_trace(S(**_xyz(path, three), mode="lines", line=dict(color=c, width=2), customdata=cd,
                            hovertemplate=hover, name=f"class {cls}" if cls >= 0 else "no class",
                            legendgroup=str(cls), showlegend=first))
        else:
            fig.add_trace(S(**_xyz(path, three), mode="lines", line=dict(color="rgba(120,120,120,0.35)", width=1),
                            customdata=cd, hovertemplate=hover, showlegend=False))


def _step_markers(fig: go.Figure, xyz: np.ndarray, steps: np.ndarray, positions: np.ndarray, hover: str) -> None:
    """Every drawn point, coloured by its step."""
    three = xyz.shape[-1] >= 3
    S = go.Scatter3d if three else go.Scatter
    flat = xyz.reshape(-1, xyz.shape[-1])
    st = np.repeat(steps[:, None], len(positions), axis=1).reshape(-1)
    ps = np.repeat(positions[None], len(steps), axis=0).reshape(-1)
    fig.add_trace(S(**_xyz(flat, three), mode="markers", name="step",
                    marker=dict(color=st, colorscale=SEQ_SCALE, size=3 if three else 5,
                                colorbar=dict(title="step", thickness=12)),
                    customdata=np.stack([ps, st], 1), hovertemplate=hover, showlegend=False))


def _end_marker_style(three: bool, color: str, color_values: np.ndarray | None, color_title: str) -> dict:
    """Markers of the final recorded step: by class, by a continuous value, or black."""
    mk: dict = dict(size=6 if three else 10, symbol="diamond" if three else "star", line=dict(width=1, color="black"))
    if color == "class" and color_values is not None:
        mk["color"] = [PALETTE[int(c) % len(PALETTE)] if c >= 0 else "#999" for c in color_values]
    elif color_values is not None and color not in ("step", "class"):
        mk.update(color=color_values, colorscale="Plasma", colorbar=dict(title=color_title, thickness=12))
    else:
        mk["color"] = "black"
    return mk


def _start_and_end(fig: go.Figure, xyz: np.ndarray, steps: np.ndarray, positions: np.ndarray, marker: dict,
                   pos_name: str, hover: str) -> None:
    """White dots at the first drawn step, ``marker`` (labelled when few) at the final one."""
    three = xyz.shape[-1] >= 3
    S = go.Scatter3d if three else go.Scatter
    fig.add_trace(S(**_xyz(xyz[0], three), mode="markers", name=f"start (step {steps[0]})",
                    marker=dict(size=3 if three else 6, color="white", line=dict(width=1, color="#444")),
                    customdata=np.stack([positions, np.full(len(positions), steps[0])], axis=1),
                    hovertemplate=hover))
    labels = len(positions) <= 12            # more labels than this pile up: hover names each one
    fig.add_trace(S(**_xyz(xyz[-1], three), mode="markers+text" if labels else "markers", marker=marker,
                    text=[f"{pos_name}={p}" for p in positions] if labels else None,
                    textposition="top center", textfont=dict(size=10),
                    name=f"final (step {steps[-1]})",
                    customdata=np.stack([positions, np.full(len(positions), steps[-1])], axis=1),
                    hovertemplate=hover))


def trajectories(xyz: np.ndarray, steps: np.ndarray, positions: np.ndarray, color: str,
                 color_values: np.ndarray | None, title: str, axis_names: list[str],
                 pos_name: str = "j", height: int = 560, color_title: str = "") -> go.Figure:
    """Paths of vectors over training: ``xyz`` (n_steps, n_pos, 2|3) in a fixed basis.

    ``color``: "step" (markers coloured by step), "class" (one colour per class, given per
    position in ``color_values``) or a continuous per-position value ("entropy")."""
    three = xyz.shape[-1] >= 3
    fig = go.Figure()
    hover = (f"{pos_name} = %{{customdata[0]}}<br>step %{{customdata[1]}}<br>"
             + "<br>".join(f"{n} = %{{{c}:.4g}}" for n, c in zip(axis_names, "xyz")) + "<extra></extra>")
    _path_traces(fig, xyz, steps, positions, color, color_values, hover)
    if color == "step":
        _step_markers(fig, xyz, steps, positions, hover)
    _start_and_end(fig, xyz, steps, positions, _end_marker_style(three, color, color_values, color_title),
                   pos_name, hover)
    if three:
        fig.update_layout(scene=dict(xaxis_title=axis_names[0], yaxis_title=axis_names[1],
                                     zaxis_title=axis_names[2]))
    else:
        fig.update_xaxes(title=axis_names[0])
        fig.update_yaxes(title=axis_names[1], scaleanchor="x")
    return _layout(fig, title, height=height)


def snapshot(xyz: np.ndarray, positions: np.ndarray, color_values: np.ndarray | None, color: str,
             title: str, axis_names: list[str], pos_name: str, color_title: str, height: int = 560) -> go.Figure:
    """All positions at one step in the fixed basis (n_pos, 2|3)."""
    three = xyz.shape[-1] >= 3
    S = go.Scatter3d if three else go.Scatter
    coords = dict(x=xyz[:, 0], y=xyz[:, 1], **({"z": xyz[:, 2]} if three else {}))
    mk: dict = dict(size=3 if three else 6)
    if color_values is not None and color == "class":
        mk["color"] = [PALETTE[int(c) % len(PALETTE)] if c >= 0 else "#999" for c in color_values]
    elif color_values is not None:
        mk.update(color=color_values, colorscale="Plasma", colorbar=dict(title=color_title, thickness=12))
    cd = positions if color_values is None else np.stack([positions, color_values], 1)
    hv = f"{pos_name} = %{{customdata{'[0]' if color_values is not None else ''}}}"
    if color_values is not None:
        hv += f"<br>{color_title} = %{{customdata[1]:.4g}}"
    fig = go.Figure(S(**coords, mode="markers", marker=mk, customdata=cd, hovertemplate=hv + "<extra></extra>"))
    if three:
        fig.update_layout(scene=dict(xaxis_title=axis_names[0], yaxis_title=axis_names[1], zaxis_title=axis_names[2]))
    else:
        fig.update_xaxes(title=axis_names[0])
        fig.update_yaxes(title=axis_names[1])
    return _layout(fig, title, height=height)


def explained_bar(ratios: np.ndarray, height: int = 200) -> go.Figure:
    fig = go.Figure(go.Bar(x=[f"PC{i + 1}" for i in range(len(ratios))], y=ratios * 100,
                           text=[f"{r * 100:.1f}%" for r in ratios], textposition="auto",
                           marker_color=PALETTE[0], hovertemplate="%{x}: %{y:.2f}%<extra></extra>"))
    fig.update_yaxes(title="% variance", range=[0, 100])
    return _layout(fig, "explained variance", height=height)
