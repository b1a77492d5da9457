"""Figures of what any recorded run holds: a user's own model (``RunRecorder``,
``HFRecorderCallback``, ``LightningRecorder``) as much as ``dyntool train``.

- ``recorded_attn`` / ``recorded_compat`` / ``recorded_advantage`` / ``recorded_score_grad``: the
  (query × key) matrix of every recorded layer (site) × head, first sequence, at the first and the
  last recorded step side by side;
- ``recorded_head_stats``: per-head attention entropy (mean over queries) and max |logit| at every
  recorded step.

Layers are named by :func:`dyntool.record.sites.site_label` (``L2 · decoder cross`` for an
encoder–decoder).  Nothing here assumes a task: the figures read the recorded arrays only.
Each is split as data (``_*_data``) → drawing (``_*_draw``) → caption (``_*_caption``).
"""
from __future__ import annotations

import warnings

import numpy as np

from ..record.sites import head_label, site_label
from . import style
from .common import array, need, where
from .registry import figure

KINDS = ("loop", "hf-callback", "lightning", "capture", "train")
MATRICES = {  # name -> (title, signed)
    "attn": ("attention α", False),
    "compat": ("compatibility B = U Vᵀ", True),
    "advantage": ("advantage A = E_α[b] − B", True),
    "score_grad": ("score gradient ∂L/∂S", True),
}
MAX_LAYERS, MAX_HEADS = 6, 8          # a readable grid; the caption says when more exist


def _eligible(runs: list, name: str) -> list:
    """Runs with a non-empty recorded ``name``; the user-recorded kinds first."""
    have = [r for r in runs if r.store is not None and name in r.store.names() and r.steps_written > 0]
    return sorted(have, key=lambda r: KINDS.index(r.kind) if r.kind in KINDS else len(KINDS))


def _with(runs: list, name: str) -> list:
    """The one run these figures draw (each figure is one run's grid)."""
    return _eligible(runs, name)[:1]


def not_drawn(runs: list, written) -> dict[tuple, list[str]]:
    """For the figures of this module that were written: ``(drawn run, runs not drawn) -> figure
    names``, where other given runs could have been drawn too (so the command can name them)."""
    out: dict[tuple, list[str]] = {}
    for fig in written:
        if not fig.startswith("recorded_"):
            continue
        arr = "attn_entropy" if fig == "recorded_head_stats" else fig.removeprefix("recorded_")
        have = _eligible(runs, arr)
        if fig == "recorded_head_stats":
            have = [r for r in have if "logit_max" in r.store.names()]
        if len(have) > 1:
            key = (str(have[0].path), tuple(str(r.path) for r in have[1:]))
            out.setdefault(key, []).append(fig)
    return out


def _check(name: str):
    def check(runs):
        return (True, "") if runs else (False, f"needs a run that recorded '{name}'")
    return check


def _matrix_figure(name: str):
    def draw(runs, **opts):
        data, extras = _matrix_data(runs[0], name)
        return _matrix_draw(data, extras), data, _matrix_caption(data, extras)
    return draw


def _matrix_data(run, name: str) -> tuple[dict, dict]:
    """-> (the shown (layer, head, query, key) matrices of sequence 0 at the first and last recorded
    step, masked entries NaN, and their colour limit; what the drawing and caption also need: the
    same matrices by record index, the recorded steps, the store's site attributes, the full shape)."""
    a = array(run, name)
    need(a is not None, f"{where(run).name} has no readable '{name}'")
    steps = run.steps
    first, last = 0, len(a) - 1
    L, H = min(a.shape[1], MAX_LAYERS), min(a.shape[2], MAX_HEADS)
    mats = {i: np.asarray(a[i, :L, :H, 0], dtype=np.float64) for i in sorted({first, last})}   # (L, H, T, Tk)
    scores = array(run, "scores")
    if scores is not None:                 # masked entries (NaN scores) shown blank, not as 0
        for i in mats:
            vis = np.isfinite(np.asarray(scores[i, :L, :H, 0], dtype=np.float64))
            mats[i] = np.where(vis, mats[i], np.nan)
    vals = np.concatenate([m[np.isfinite(m)] for m in mats.values()])
    need(vals.size > 0, f"{where(run).name}: '{name}' holds no finite entry")
    lim = float(np.quantile(np.abs(vals), 0.99)) or float(np.abs(vals).max()) or 1.0
    data = {"run": where(run).name, "array": name, "steps": [int(steps[i]) for i in mats], "seq": 0,
            "color_limit": lim, "layers_shown": L, "heads_shown": H,
            "values": {int(steps[i]): mats[i].tolist() for i in mats}}
    return data, {"mats": mats, "steps": steps, "attrs": run.store.attrs, "kind": run.kind, "shape": a.shape}


def _matrix_draw(data: dict, extras: dict):
    title, signed = MATRICES[data["array"]]
    mats, steps, attrs = extras["mats"], extras["steps"], extras["attrs"]
    L, H, lim = data["layers_shown"], data["heads_shown"], data["color_limit"]
    cols = [(i, h) for i in mats for h in range(H)]
    # a head selection (record.heads) can put different model heads in the same slot of each layer:
    # then every panel names its own head, not only the top row
    per_layer = any(head_label(attrs, l, h) != head_label(attrs, 0, h) for l in range(L) for h in range(H))
    fig = style.figure(style.DOUBLE, 0.9 + (1.15 if per_layer else 1.0) * L)
    axes = fig.subplots(L, len(cols), squeeze=False)
    im = None
    for l in range(L):
        for c, (i, h) in enumerate(cols):
            ax = axes[l, c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(site_label(attrs, l), fontsize=6)
            label = head_label(attrs, l, h)
            if label.startswith("(empty"):       # a slot this layer's selection leaves unused: blank
                ax.axis("off")
                continue
            im = ax.imshow(mats[i][l, h], cmap=style.DIV_CMAP if signed else style.SEQ_CMAP,
                           vmin=-lim if signed else 0, vmax=lim, interpolation="nearest")
            if per_layer or l == 0:
                ax.set_title(f"{label}, step {int(steps[i])}", fontsize=6 if not per_layer else 5)
    need(im is not None, f"{data['run']}: every shown slot of '{data['array']}' is empty")
    fig.colorbar(im, ax=axes, shrink=0.6, label=title)
    return fig


def _matrix_caption(data: dict, extras: dict) -> str:
    title, signed = MATRICES[data["array"]]
    L, H, shape = data["layers_shown"], data["heads_shown"], extras["shape"]
    more = (f" Showing {L} of {shape[1]} layers and {H} of {shape[2]} heads."
            if (shape[1] > L or shape[2] > H) else "")
    return (f"{title.capitalize()} of {data['run']} ({extras['kind']} run), sequence 0, every recorded layer × head "
            f"at the first and last recorded steps ({', '.join(str(s) for s in data['steps'])}); colour range "
            f"{'±' if signed else '0–'}{data['color_limit']:.3g} (99th percentile of |value|), masked entries "
            f"blank.{more}")


for _name, (_title, _) in MATRICES.items():
    figure(f"recorded_{_name}", f"Recorded {_title} per layer × head (any run)", KINDS,
           needs=f"a run that recorded '{_name}' (a user's model, an HF/Lightning callback, dyntool train)",
           group="recorded", check=_check(_name), pick=lambda runs, n=_name: _with(runs, n))(_matrix_figure(_name))


@figure("recorded_head_stats", "Per-head attention entropy and max |logit| over recorded steps (any run)", KINDS,
        needs="a run that recorded 'attn_entropy' and 'logit_max'", group="recorded",
        check=_check("attn_entropy and logit_max"), pick=lambda runs: [r for r in _with(runs, "attn_entropy")
                                                                       if "logit_max" in r.store.names()])
def recorded_head_stats(runs, **opts):
    data, extras = _head_stats_data(runs[0])
    return _head_stats_draw(extras), data, _head_stats_caption(extras)


def _head_stats_data(run):
    """-> (one row per recorded step, layer and head: attention entropy (mean over queries and
    sequences) and max |logit|; the same as (step, layer, head) arrays with the run's name, kind
    and site attributes)."""
    ent, lmax = array(run, "attn_entropy"), array(run, "logit_max")
    need(ent is not None and lmax is not None, f"{where(run).name} lacks attn_entropy or logit_max")
    n = min(len(ent), len(lmax))
    steps = run.steps[:n]
    with np.errstate(all="ignore"), warnings.catch_warnings():   # empty slots of a head selection: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        e = np.nanmean(np.asarray(ent[:n], dtype=np.float64), axis=(3, 4))   # (n, L, H)
    m = np.asarray(lmax[:n], dtype=np.float64)                               # (n, L, H)
    L, H = e.shape[1:]
    rows = [{"step": int(s), "layer": l, "head": h, "attn_entropy": float(a), "logit_max": float(b)}
            for l in range(L) for h in range(H) for s, a, b in zip(steps, e[:, l, h], m[:, l, h])]
    import pandas as pd
    return pd.DataFrame(rows), {"steps": steps, "entropy": e, "logit_max": m, "attrs": run.store.attrs,
                                "run": where(run).name, "kind": run.kind}


def _head_stats_draw(extras: dict):
    steps, e, m, attrs = extras["steps"], extras["entropy"], extras["logit_max"], extras["attrs"]
    fig = style.figure(style.DOUBLE, 2.6)
    ax1, ax2 = fig.subplots(1, 2)
    L, H = e.shape[1:]
    for l in range(L):
        color = style.CYCLE[l % len(style.CYCLE)]
        for h in range(H):
            lab = site_label(attrs, l) if h == 0 else None
            ax1.plot(steps, e[:, l, h], color=color, lw=0.8, alpha=0.8, label=lab, marker="o", ms=2)
            ax2.plot(steps, m[:, l, h], color=color, lw=0.8, alpha=0.8, marker="o", ms=2)
    ax1.set_xlabel(style.STEP)
    ax1.set_ylabel("attention entropy [nats], mean over queries")
    ax2.set_xlabel(style.STEP)
    ax2.set_ylabel("max |τ q·k| per head")
    ax1.legend(fontsize=6, frameon=False)
    style.panel_label(ax1, "a")
    style.panel_label(ax2, "b")
    return fig


def _head_stats_caption(extras: dict) -> str:
    steps, e, m = extras["steps"], extras["entropy"], extras["logit_max"]
    return (f"Per-head statistics of {extras['run']} ({extras['kind']} run) at its {len(steps)} recorded steps "
            f"({int(steps[0])}–{int(steps[-1])}), one line per head, coloured by layer: (a) attention entropy "
            f"averaged over query positions and recorded sequences, {np.nanmin(e):.3g}–{np.nanmax(e):.3g} nats; "
            f"(b) the largest pre-softmax logit, {np.nanmin(m):.3g}–{np.nanmax(m):.3g}.")
