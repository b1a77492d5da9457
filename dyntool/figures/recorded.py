"""Figures of what any recorded run holds: a user's own model (``RunRecorder``,
``HFRecorderCallback``, ``LightningRecorder``) as much as ``dyntool train``.

- ``recorded_attn`` / ``recorded_compat`` / ``recorded_advantage`` / ``recorded_score_grad``: the
  (query × key) matrix of every recorded layer (site) × head, first sequence, at the first and the
  last recorded step side by side;
- ``recorded_head_stats``: per-head attention entropy (mean over queries) and max |logit| at every
  recorded step.

Layers are named by :func:`dyntool.record.sites.site_label` (``L2 · decoder cross`` for an
encoder–decoder).  Nothing here assumes a task: the figures read the recorded arrays only.
"""
from __future__ import annotations

import numpy as np

from ..record.sites import head_label, site_label
from . import style
from .common import array, need
from .registry import figure

KINDS = ("loop", "hf-callback", "lightning", "capture", "train")
MATRICES = {  # name -> (title, signed)
    "attn": ("attention α", False),
    "compat": ("compatibility B = U Vᵀ", True),
    "advantage": ("advantage A = E_α[b] − B", True),
    "score_grad": ("score gradient ∂L/∂S", True),
}
MAX_LAYERS, MAX_HEADS = 6, 8          # a readable grid; the caption says when more exist


def _with(runs: list, name: str) -> list:
    """Runs with a non-empty recorded ``name``; the user-recorded kinds first."""
    have = [r for r in runs if r.store is not None and name in r.store.names() and r.steps_written > 0]
    return sorted(have, key=lambda r: KINDS.index(r.kind) if r.kind in KINDS else len(KINDS))[:1]


def _check(name: str):
    def check(runs):
        return (True, "") if runs else (False, f"needs a run that recorded '{name}'")
    return check


def _matrix_figure(name: str):
    title, signed = MATRICES[name]

    def draw(runs, **opts):
        run = runs[0]
        a = array(run, name)
        need(a is not None, f"{run.path.name} has no readable '{name}'")
        steps = run.steps
        first, last = 0, len(a) - 1
        L, H = min(a.shape[1], MAX_LAYERS), min(a.shape[2], MAX_HEADS)
        attrs = run.store.attrs
        mats = {i: np.asarray(a[i, :L, :H, 0], dtype=np.float64) for i in sorted({first, last})}   # (L, H, T, Tk)
        scores = array(run, "scores")
        if scores is not None:                 # masked entries (NaN scores) shown blank, not as 0
            for i in mats:
                vis = np.isfinite(np.asarray(scores[i, :L, :H, 0], dtype=np.float64))
                mats[i] = np.where(vis, mats[i], np.nan)
        vals = np.concatenate([m[np.isfinite(m)] for m in mats.values()])
        need(vals.size > 0, f"{run.path.name}: '{name}' holds no finite entry")
        lim = float(np.quantile(np.abs(vals), 0.99)) or float(np.abs(vals).max()) or 1.0
        cols = [(i, h) for i in mats for h in range(H)]
        fig = style.figure(style.DOUBLE, 0.9 + 1.0 * L)
        axes = fig.subplots(L, len(cols), squeeze=False)
        for l in range(L):
            for c, (i, h) in enumerate(cols):
                ax = axes[l, c]
                im = ax.imshow(mats[i][l, h], cmap=style.DIV_CMAP if signed else style.SEQ_CMAP,
                               vmin=-lim if signed else 0, vmax=lim, interpolation="nearest")
                ax.set_xticks([])
                ax.set_yticks([])
                if l == 0:
                    ax.set_title(f"{head_label(attrs, l, h)}, step {int(steps[i])}", fontsize=6)
                if c == 0:
                    ax.set_ylabel(site_label(attrs, l), fontsize=6)
        fig.colorbar(im, ax=axes, shrink=0.6, label=title)
        data = {"run": run.path.name, "array": name, "steps": [int(steps[i]) for i in mats], "seq": 0,
                "color_limit": lim, "layers_shown": L, "heads_shown": H,
                "values": {int(steps[i]): mats[i].tolist() for i in mats}}
        more = (f" Showing {L} of {a.shape[1]} layers and {H} of {a.shape[2]} heads."
                if (a.shape[1] > L or a.shape[2] > H) else "")
        cap = (f"{title.capitalize()} of {run.path.name} ({run.kind} run), sequence 0, every recorded layer × head "
               f"at the first and last recorded steps ({', '.join(str(int(steps[i])) for i in mats)}); colour range "
               f"{'±' if signed else '0–'}{lim:.3g} (99th percentile of |value|), masked entries blank.{more}")
        return fig, data, cap
    return draw


for _name, (_title, _) in MATRICES.items():
    figure(f"recorded_{_name}", f"Recorded {_title} per layer × head (any run)", KINDS,
           needs=f"a run that recorded '{_name}' (a user's model, an HF/Lightning callback, dyntool train)",
           group="recorded", check=_check(_name), pick=lambda runs, n=_name: _with(runs, n))(_matrix_figure(_name))


@figure("recorded_head_stats", "Per-head attention entropy and max |logit| over recorded steps (any run)", KINDS,
        needs="a run that recorded 'attn_entropy' and 'logit_max'", group="recorded",
        check=_check("attn_entropy and logit_max"), pick=lambda runs: [r for r in _with(runs, "attn_entropy")
                                                                       if "logit_max" in r.store.names()])
def recorded_head_stats(runs, **opts):
    run = runs[0]
    ent, lmax = array(run, "attn_entropy"), array(run, "logit_max")
    need(ent is not None and lmax is not None, f"{run.path.name} lacks attn_entropy or logit_max")
    n = min(len(ent), len(lmax))
    steps = run.steps[:n]
    e = np.nanmean(np.asarray(ent[:n], dtype=np.float64), axis=(3, 4))       # (n, L, H)
    m = np.asarray(lmax[:n], dtype=np.float64)                               # (n, L, H)
    attrs = run.store.attrs
    fig = style.figure(style.DOUBLE, 2.6)
    ax1, ax2 = fig.subplots(1, 2)
    L, H = e.shape[1:]
    rows = []
    for l in range(L):
        color = style.CYCLE[l % len(style.CYCLE)]
        for h in range(H):
            lab = site_label(attrs, l) if h == 0 else None
            ax1.plot(steps, e[:, l, h], color=color, lw=0.8, alpha=0.8, label=lab, marker="o", ms=2)
            ax2.plot(steps, m[:, l, h], color=color, lw=0.8, alpha=0.8, marker="o", ms=2)
            rows += [{"step": int(s), "layer": l, "head": h, "attn_entropy": float(a), "logit_max": float(b)}
                     for s, a, b in zip(steps, e[:, l, h], m[:, l, h])]
    ax1.set_xlabel(style.STEP)
    ax1.set_ylabel("attention entropy [nats], mean over queries")
    ax2.set_xlabel(style.STEP)
    ax2.set_ylabel("max |τ q·k| per head")
    ax1.legend(fontsize=6, frameon=False)
    style.panel_label(ax1, "a")
    style.panel_label(ax2, "b")
    import pandas as pd
    df = pd.DataFrame(rows)
    cap = (f"Per-head statistics of {run.path.name} ({run.kind} run) at its {n} recorded steps "
           f"({int(steps[0])}–{int(steps[-1])}), one line per head, coloured by layer: (a) attention entropy "
           f"averaged over query positions and recorded sequences, {np.nanmin(e):.3g}–{np.nanmax(e):.3g} nats; "
           f"(b) the largest pre-softmax logit, {np.nanmin(m):.3g}–{np.nanmax(m):.3g}.")
    return fig, df, cap
