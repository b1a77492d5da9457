"""The one shared figure style: two-column paper sizes, Okabe–Ito colours, embedded fonts.

Everything that draws a figure does so inside :func:`context` (``rcParams`` are read when artists
are created *and* when files are written), and every figure is a plain
:class:`matplotlib.figure.Figure` (no pyplot, no global state).  File writing goes through
:func:`save`, which fixes the metadata so the same inputs give the same bytes.
"""
from __future__ import annotations

import io
import threading
from contextlib import contextmanager

import matplotlib as mpl
from matplotlib.figure import Figure   # no pyplot: no backend, no global figure list

# -- sizes (inches) ---------------------------------------------------------------------------
SINGLE = 3.4          # one column of a two-column paper
DOUBLE = 7.0          # full text width
DPI = 300             # default raster resolution (the gallery uses less)

# -- Okabe & Ito (2008), colour-blind safe ----------------------------------------------------
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7",
}
CYCLE = [OKABE_ITO[k] for k in ("blue", "vermillion", "green", "orange", "purple", "sky", "black",
                                 "yellow")]
# sequential maps are perceptually uniform and CVD-safe; RdBu is ColorBrewer's CVD-safe diverging map
SEQ_CMAP = "viridis"
DIV_CMAP = "RdBu_r"
H_MIN_COLOR = OKABE_ITO["black"]       # green is an arm colour (em_closed_form)
REF_COLOR = "#555555"

# fixed colour per arm / attention type so every figure agrees
ARM_COLORS = {"sgd": OKABE_ITO["vermillion"], "em": OKABE_ITO["blue"], "em_like": OKABE_ITO["blue"],
              "em_closed_form": OKABE_ITO["green"],
              # the learning-rate controls: the same colour in F3, F4 and the controls figure
              "readout": OKABE_ITO["purple"], "routing": OKABE_ITO["sky"], "all": OKABE_ITO["orange"],
              "sgd_tuned": OKABE_ITO["yellow"]}
ARM_LABELS = {"sgd": "SGD", "em": "EM-like", "em_like": "EM-like",
              "em_closed_form": "EM closed form (ext.)"}
ATTN_COLORS = {"mhsa": OKABE_ITO["vermillion"], "ls": OKABE_ITO["blue"], "qknorm": OKABE_ITO["green"],
               "span": OKABE_ITO["purple"]}
ATTN_LABELS = {"mhsa": "MHSA", "ls": "LS", "qknorm": "QK-norm", "span": "span-recon"}
CLASS_COLORS = [OKABE_ITO[k] for k in ("blue", "orange", "green", "purple", "vermillion", "sky",
                                        "yellow", "black")]

# -- axis labels (units in brackets) ----------------------------------------------------------
STEP = "training step"
LOSS = "cross-entropy loss [nats]"
ENTROPY = "entropy [nats]"

RC = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],        # ships with matplotlib: same glyphs everywhere
    "mathtext.fontset": "dejavusans",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "figure.titlesize": 9,
    "axes.prop_cycle": mpl.cycler(color=CYCLE),
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.2,
    "lines.markersize": 3.5,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
    "image.cmap": SEQ_CMAP,
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    "savefig.bbox": "standard",                # fixed canvas: the same size whatever the data
    "pdf.fonttype": 42,                        # TrueType, embedded (journals reject Type 3)
    "ps.fonttype": 42,
    "svg.fonttype": "none",                    # text stays text (editable)
    "svg.hashsalt": "dyntool",                 # deterministic SVG ids
    "pdf.compression": 6,
    "path.simplify": True,
}

# metadata that would change between runs is dropped: byte-stable files
METADATA = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None},
    "svg": {"Creator": None, "Date": None, "Format": None, "Type": None},
}
FORMATS = ("pdf", "png", "svg")


_LOCK = threading.RLock()       # rcParams are process-global: one figure at a time (Streamlit threads)


@contextmanager
def context():
    """The shared rcParams, for both drawing and saving (serialised across threads)."""
    with _LOCK, mpl.rc_context(RC):
        yield


def figure(width: float = SINGLE, height: float | None = None, **kw) -> Figure:
    """A new figure of the given width in inches (default height: width × 0.7)."""
    return Figure(figsize=(width, height if height is not None else width * 0.7),
                  layout=kw.pop("layout", "constrained"), **kw)


def freeze(fig: Figure) -> Figure:
    """Run the layout engine once (at the figure's own dpi) and keep its result.

    Every format then shares one layout, whatever order they are written in (byte-stable files),
    and later saves skip the (slow) constrained-layout solve.
    """
    eng = fig.get_layout_engine()
    if eng is not None and type(eng).__name__ != "PlaceHolderLayoutEngine":
        with context():
            fig.draw_without_rendering()
        fig.set_layout_engine("none")
    return fig


def save(fig: Figure, target, fmt: str, dpi: int | None = None) -> None:
    """Write ``fig`` to a path or binary file object with fixed metadata."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown figure format {fmt!r} (one of {', '.join(FORMATS)})")
    freeze(fig)
    with context():
        fig.savefig(target, format=fmt, dpi=dpi or DPI, metadata=METADATA[fmt])


def to_bytes(fig: Figure, fmt: str, dpi: int | None = None) -> bytes:
    buf = io.BytesIO()
    save(fig, buf, fmt, dpi)
    return buf.getvalue()


# -- small drawing helpers ---------------------------------------------------------------------

def band(ax, x, mean, std, color, label=None, lw=None, alpha=0.2, ls="-"):
    """A mean line with a ±1 std band."""
    ax.plot(x, mean, color=color, label=label, lw=lw, ls=ls)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=alpha, lw=0)


def hline(ax, y, label, color=REF_COLOR, ls="--"):
    ax.axhline(y, color=color, ls=ls, lw=0.9, label=label)


def panel_label(ax, letter: str) -> None:
    """Prefix the axes title with a bold (a), (b), ... and move it to the left (call after set_title)."""
    t = ax.get_title()
    ax.set_title("")
    lab = rf"$\mathbf{{({letter})}}$"
    ax.set_title(f"{lab} {t}" if t else lab, loc="left")


def plain_log(ax, axis: str = "y") -> None:
    """Log-scale axis with plain tick labels (2, 5, 10, 20) instead of 2×10^0."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def arm_color(arm: str, i: int = 0) -> str:
    return ARM_COLORS.get(arm, CYCLE[(i + 2) % len(CYCLE)])


def arm_label(arm: str, short: bool = False) -> str:
    lab = ARM_LABELS.get(arm, arm)
    return lab.replace(" (ext.)", "") if short else lab


def attn_color(att: str, i: int = 0) -> str:
    return ATTN_COLORS.get(att, CYCLE[(i + 4) % len(CYCLE)])


def attn_label(att: str) -> str:
    return ATTN_LABELS.get(att, att)
