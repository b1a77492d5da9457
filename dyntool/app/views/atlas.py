"""Atlas: every head of an atlas run (``dyntool study atlas``, docs/atlas.md) at one step.

A layer × head grid of one quantity at the chosen step (one colour range over the whole run, so
scrubbing the step slider compares colours), the quantity's per-head curves with that step
marked, and the events the fixed rules find (atlas_events.py: sustained threshold crossings of
the sink, previous-token and induction scores, their driving advantages, the loss bump).
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dyntool.app import data, downloads, plots, ui
from dyntool.app.data import AppInputError
from dyntool.record import metric_names as mn
from dyntool.train import atlas_events as E

# base → (label, colour mode, the chance key of atlas_events.chance_levels or None, one-line meaning)
QUANTITIES = {
    "atlas_first_mass": ("first-position mass", "unit", "first_mass",
                         "(1/T) Σ_i α_i0 on the WikiText probe: a sink puts much of every row on the first token."),
    "atlas_prev_token": ("previous-token score", "unit", "prev_token", "mean_i α_{i,i−1} on the WikiText probe."),
    "atlas_induction": ("induction (prefix matching)", "unit", "induction",
                        "On repeated random sequences [r, r]: attention from the repeat to the token after the "
                        "current token's first occurrence."),
    "atlas_copying": ("copying score (OV eigenvalues)", "signed", None,
                      "Σ Re λ / Σ |λ| of the head's token → logit map: +1 copies, −1 anti-copies."),
    "atlas_first_adv": ("first column's advantage", "signed", None,
                        "mean_i A_i0 = E_α[b] − b_i0: positive means gradient descent raises attention to the first token."),
    "atlas_prev_adv": ("previous token's advantage", "signed", None, "mean_i A_{i,i−1}: positive drives a previous-token head."),
    "atlas_copy_adv": ("copy key's advantage", "signed", None, "mean A on the induction key: positive drives an induction head."),
    "atlas_first_ds_share": ("first column's share of ‖∂L/∂S‖", "plain", None, "How much of the score gradient sits on the first column."),
    "atlas_first_value_grad": ("‖∂L/∂v₀‖", "plain", None, "The first token's value gradient (its update is −η times it)."),
    "atlas_first_value_share": ("first token's share of ‖∂L/∂V‖", "plain", None, "The first value's share of the value gradient."),
    mn.LOGIT_MAX: ("max |logit| (training batch)", "plain", None, "The largest |τ q·k| of the head on the step's batch (cheap tier)."),
    mn.ATTN_ENTROPY: ("attention entropy (training batch)", "plain", None, "Mean row entropy on the step's batch, nats (cheap tier)."),
}
PHENOMENON = {"atlas_first_mass": "sink", "atlas_prev_token": "prev_token", "atlas_induction": "induction"}


def per_head(df: pd.DataFrame, base: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values (steps, layer, head)) of ``BASE/L{l}H{h}`` on the rows where it was measured."""
    cells = mn.per_head(df.columns, base)
    rows = df.dropna(subset=list(cells.values()), how="all")
    L, H = max(l for l, _ in cells) + 1, max(h for _, h in cells) + 1
    out = np.full((len(rows), L, H), np.nan)
    for (l, h), c in cells.items():
        out[:, l, h] = rows[c].to_numpy(dtype=float)
    return rows["step"].to_numpy(dtype=int), out


@st.cache_data(max_entries=16, show_spinner=False)
def events(path: str, sig: tuple) -> tuple[dict, dict]:
    """(chance levels, the fixed rules' events) of one run, computed from its metrics (a live run too)."""
    run = data.get_run(path)
    T = int(((run.config or {}).get("data") or {}).get("block_size", 0))
    if T < 2:
        raise AppInputError(f"`{run.id}` has no data.block_size in its config: the chance levels need it.")
    df = data.metrics(path, sig)
    heads = sorted(mn.per_head(df.columns, "atlas_first_mass"))
    chance = E.chance_levels(T)
    return chance, E.run_events(df, chance, heads)


def pick_step(opts: list[int]) -> int:
    """The step slider; a step the new quantity did not measure snaps to the nearest one it did."""
    want = st.session_state.get("at_step")
    if want not in opts:
        st.session_state["at_step"] = opts[-1] if want is None else opts[int(np.argmin(np.abs(np.subtract(opts, want))))]
    return st.select_slider(f"Step ({len(opts)} measured, {opts[0]}–{opts[-1]})", opts, key="at_step")


def colour_range(arr: np.ndarray, mode: str) -> dict:
    """One colour range for the whole run: [0, 1] for attention shares, ±max|x| for signed ones."""
    finite = arr[np.isfinite(arr)]
    if mode == "unit":
        return dict(zmin=0.0, zmax=1.0, colorscale=plots.SEQ_SCALE)
    if mode == "signed":
        r = float(np.abs(finite).max()) if finite.size else 1.0
        return dict(zmin=-r, zmax=r, zmid=0.0, colorscale=plots.DIV_SCALE)
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    return dict(zmin=lo, zmax=hi if hi > lo else lo + 1e-12, colorscale=plots.SEQ_SCALE)


def event_marks(ev: dict | None, base: str, step: int, L: int, H: int) -> np.ndarray:
    """Per cell: '' or the event this head has had by ``step`` (forward crossing of the fixed rule)."""
    marks = np.full((L, H), "", dtype=object)
    name = PHENOMENON.get(base)
    if ev is None or name is None:
        return marks
    for key, e in ev[name]["heads"].items():
        l, h = (int(x) for x in key[1:].split("H"))
        if e["forward_step"] is not None and e["forward_step"] <= step:
            marks[l, h] = f"★ {name} @ {e['forward_step']}"
    return marks


def grid_figure(values: np.ndarray, marks: np.ndarray, crange: dict, label: str, title: str) -> go.Figure:
    """The layer × head grid at one step, values written in the cells."""
    L, H = values.shape
    text = [[("–" if not np.isfinite(values[l, h]) else f"{values[l, h]:.3g}") + (f"<br>{marks[l, h]}" if marks[l, h] else "")
             for h in range(H)] for l in range(L)]
    fig = go.Figure(go.Heatmap(z=values, x=[f"head {h}" for h in range(H)], y=[f"layer {l}" for l in range(L)],
                               text=text, texttemplate="%{text}", textfont=dict(size=13), **crange,
                               colorbar=dict(title=dict(text=html.escape(label), side="right"), thickness=12),
                               hovertemplate="%{y} %{x}<br>" + html.escape(label) + " = %{z:.6g}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=dict(text=title, x=0, xanchor="left", font=dict(size=15)), template="plotly_white",
                      height=max(260, 110 + 90 * L), margin=dict(l=10, r=100, t=70, b=10),
                      modebar=dict(orientation="v"))      # as plots.py: the toolbar never covers the title
    return fig


def curve_figure(steps: np.ndarray, arr: np.ndarray, step: int, label: str, levels: dict[str, float]) -> go.Figure:
    """Every head's curve over steps, the chosen step as a vertical line, chance/threshold dotted."""
    df = pd.DataFrame({"step": steps})
    names = {}
    for l in range(arr.shape[1]):
        for h in range(arr.shape[2]):
            df[f"L{l}H{h}"] = arr[:, l, h]
            names[f"L{l}H{h}"] = f"L{l}H{h}"
    fig = plots.curves(df, list(names), f"{label} over steps (every head)", names=names, y_title=label)
    # short head names in rows below the plot: a legend column on the right sits under the toolbar
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.25, xanchor="left", x=0, font=dict(size=11)),
                      margin=dict(b=60))
    fig.add_vline(x=step, line=dict(color="#444", width=1, dash="dash"))
    for name, y in levels.items():
        fig.add_hline(y=y, line=dict(color="#888", width=1, dash="dot"), annotation_text=name,
                      annotation_position="top left")
    return fig


def events_table(ev: dict) -> pd.DataFrame:
    rows = []
    for name in E.PHENOMENA:
        lag = ev[name]["lag"]
        for head, e in ev[name]["heads"].items():
            rows.append({"phenomenon": name, "head": head, "threshold θ": e["threshold"], "start": e["start"],
                         "peak": e["peak"], "forward event (step)": e["forward_step"],
                         "backward event (step)": e["backward_step"],
                         "run: heads crossing": f"{lag['n_forward']}/{len(ev[name]['heads'])}"})
    return pd.DataFrame(rows)


def show_events(ev: dict) -> None:
    st.subheader("Events (rules fixed before the runs, docs/atlas.md)")
    found = {n: [f"{h} @ {e['forward_step']}" for h, e in ev[n]["heads"].items() if e["forward_step"] is not None]
             for n in E.PHENOMENA}
    st.markdown("  \n".join(f"**{n}**: " + (", ".join(found[n]) if found[n] else "no head crossed its threshold")
                            for n in E.PHENOMENA))
    b, ph = ev["loss_bump"], ev["repeat_phase"]
    fall = "–" if ph["fall"] is None else f"{ph['fall']:.3f} nats at step {ph['step']} (noise {ph['noise']:.3f})"
    st.caption(f"Loss bump: {'yes' if b['bump'] else 'none'} (largest rise {b['size']:.3f} nats at step {b['step']}, "
               f"noise {b['noise']:.3f}). Repeat-gap steepest fall: {fall}. Forward rows {ev['rows']} "
               f"(hold {ev['hold']}), gradient-side rows {ev.get('grad_rows', '–')}.")
    st.dataframe(events_table(ev), hide_index=True, width="stretch")


def panel(path: str, base: str) -> None:
    sig = data.signature(path)
    df = data.metrics(path, sig)
    if base not in {b for b in QUANTITIES if mn.per_head(df.columns, b)}:
        st.info(f"`{data.esc(data.get_run(path).id)}` has not logged {QUANTITIES[base][0]} yet.")
        return
    label, mode, ck, meaning = QUANTITIES[base]
    steps, arr = per_head(df, base)
    chance, ev = events(path, sig)
    step = pick_step(list(map(int, steps)))
    i = int(np.searchsorted(steps, step))
    marks = event_marks(ev, base, step, *arr.shape[1:])
    levels = {}
    if ck is not None:
        levels = {f"chance {chance[ck]:.3f}": chance[ck]}
        th = [e["threshold"] for e in ev[PHENOMENON[base]]["heads"].values()]
        levels[f"θ ≥ {min(th):.3f}"] = min(th)
    run_label = data.label(data.get_run(path).id)
    left, right = st.columns([2, 3])
    with left:
        fig = grid_figure(arr[i], marks, colour_range(arr, mode), label,
                          f"<b>{html.escape(label)}</b><br><span style='font-size:12px'>{run_label} · step {step}</span>")
        st.plotly_chart(fig, key="at-grid", config=plots.CONFIG)
        downloads.download(fig, "at-grid", f"atlas-{base}-step{step}", ["atlas_grid"], [path])
    with right:
        fig = curve_figure(steps, arr, step, label, levels)
        st.plotly_chart(fig, key="at-curves", config=plots.CONFIG)
        downloads.download(fig, "at-curves", f"atlas-{base}", ["atlas_grid", "atlas_drivers"], [path])
    st.caption(meaning + " One colour range for the whole run; ★ marks a head whose forward event (the fixed "
               "rule's sustained crossing of θ) happened by this step."
               + (f" Dotted: chance {chance[ck]:.3f} and the lowest head's θ." if ck else ""))
    show_events(ev)


def atlas_runs() -> list[str]:
    """The candidate runs tagged by ``dyntool study atlas`` first (any run that logged the probe works)."""
    runs = ui.candidates()
    tagged = [r for r in runs if "study-atlas" in (data.summary(ui.abspath(r), data.signature(ui.abspath(r))).get("tags") or [])]
    return tagged + [r for r in runs if r not in tagged]


def body() -> None:
    st.title("Atlas")
    top = st.columns([3, 2])
    path = ui.pick_run("Run", key="at_run", options=atlas_runs(), container=top[0])
    df = data.metrics(path, data.signature(path))
    have = [b for b in QUANTITIES if mn.per_head(df.columns, b)]
    if not mn.per_head(df.columns, "atlas_first_mass"):
        raise AppInputError(f"`{data.get_run(path).id}` has no atlas scores (`atlas_first_mass/L0H0`, ...): "
                            "record a run with `dyntool study atlas --preset ci` (docs/atlas.md).")
    base = top[1].selectbox("Quantity", have, key="at_base", format_func=lambda b: QUANTITIES[b][0])
    st.fragment(lambda: ui.guard(lambda: (ui.run_banner(path), panel(path, base))),
                run_every=ui.LIVE_EVERY_S if data.is_live(data.get_run(path)) else None)()


ui.guard(body)
