"""Matrices: α, B, advantages, score gradients (and scores) of one head at one recorded step.

Step slider + play; α on [0, 1], signed matrices on a diverging scale centred at 0; crops larger
than the screen are shown as a pooled overview plus a zoom into real entries; probe tokens on the
axes where the run has them; two steps or two runs side by side.
"""
from __future__ import annotations

import numpy as np
import streamlit as st

from dyntool.app import analysis, data, downloads, plots, ui
from dyntool.app.data import AppInputError
from dyntool.record.sites import head_label, site_label

MAX_CELLS = 128          # largest matrix drawn entry by entry (per axis)
PLAY_EVERY_S = 0.8
MODES = ("one step", "two steps side by side", "two runs side by side")


def geometry(info: dict, kind: str) -> dict:
    a = info["arrays"][kind]
    n, L, H, S, nq, nk = a["shape"]
    at = a["attrs"]
    return {"n": n, "L": L, "H": H, "S": S, "nq": nq, "nk": nk, "q0": int(at.get("query_offset", 0)),
            "k0": int(at.get("key_offset", 0)), "T": int(at.get("T", max(nq, nk)))}


def zoom_controls(g: dict, key: str) -> tuple[int, int, int]:
    """The part of the recorded crop to draw entry by entry when the crop is too big: (query start, key start,
    size) in array coordinates.  Default: the last queries against the keys around them."""
    sizes = [s for s in (32, 64, 96, 128) if s <= max(g["nq"], g["nk"])] or [MAX_CELLS]
    c1, c2, c3 = st.columns(3)
    size = c1.selectbox("Zoom size", sizes, index=len(sizes) - 1, key=f"{key}-size")
    sq, sk = min(size, g["nq"]), min(size, g["nk"])
    q_hi, k_hi = g["nq"] - sq, g["nk"] - sk
    q_default = q_hi
    k_default = int(np.clip(g["q0"] + g["nq"] - sk - g["k0"], 0, k_hi))
    qs = c2.slider("Zoom: first query", g["q0"], g["q0"] + q_hi, g["q0"] + q_default, key=f"{key}-q") - g["q0"] if q_hi else 0
    ks = c3.slider("Zoom: first key", g["k0"], g["k0"] + k_hi, g["k0"] + k_default, key=f"{key}-k") - g["k0"] if k_hi else 0
    return qs, ks, size


def figures_for(path: str, kind: str, idx: int, step: int, layer: int, head: int, seq: int,
                zoom: tuple[int, int, int] | None, label: str, zrange: float | None = None) -> list:
    """[overview, zoom] for big crops, else [full] — plotly figures of one head at one step."""
    mark = data.marker(path)
    info = data.array_info(path, mark)
    if kind not in info["arrays"]:
        raise AppInputError(f"`{label}` did not record `{kind}`.")
    g = geometry(info, kind)
    if not (layer < g["L"] and head < g["H"] and seq < g["S"]):
        raise AppInputError(f"`{label}` has no layer {layer} / head {head} (it has {g['L']} × {g['H']}).")
    name = plots.MATRIX_KINDS[kind][0]
    alpha = plots.alpha_scale(st.session_state.get("mx_alpha_scale", "auto"), g["T"])
    toks = data.probe_tokens(info, seq)
    # stored indices named by the model's layer/head (a head selection stores some of them only)
    where = f"{site_label(info['attrs'], layer)} {head_label(info['attrs'], layer, head)}" + \
        (f" seq {seq}" if g["S"] > 1 else "")
    if zoom is None:
        m = data.matrix(path, mark, kind, idx, layer, head, seq)
        return [plots.heatmap(m, kind, f"<b>{name}</b><br><span style='font-size:12px'>{label} · step {step} · {where}</span>", g["q0"], g["k0"],
                              tokens=toks, zrange=zrange, alpha=alpha)]
    qs, ks, size = zoom
    rows, cols = (qs, min(qs + size, g["nq"])), (ks, min(ks + size, g["nk"]))
    rect = (g["q0"] + rows[0], g["q0"] + rows[1], g["k0"] + cols[0], g["k0"] + cols[1])
    pooled_name = f"{kind}_pooled"
    if pooled_name in info["arrays"]:
        block = int(info["arrays"][pooled_name]["attrs"].get("block", 1))
        ov = data.matrix(path, mark, pooled_name, idx, layer, head, seq)
        ov_title = f"<b>{name}</b> · overview<br><span style='font-size:12px'>{label} · step {step} · full T = {g['T']}, pooled {block}×{block}</span>"
        ov_q0 = ov_k0 = 0
    else:
        block = analysis.display_block(max(g["nq"], g["nk"]), MAX_CELLS)
        ov = data.pooled(path, mark, kind, idx, layer, head, seq, block)
        ov_title = f"<b>{name}</b> · overview<br><span style='font-size:12px'>{label} · step {step} · recorded crop, {block}×{block} block means</span>"
        ov_q0, ov_k0 = g["q0"], g["k0"]
    zm = data.matrix(path, mark, kind, idx, layer, head, seq, rows, cols)
    return [plots.heatmap(ov, kind, ov_title, ov_q0, ov_k0, block=block, rect=rect, zrange=zrange, alpha=alpha),
            plots.heatmap(zm, kind, f"<b>{name}</b> · zoom (real entries)<br><span style='font-size:12px'>{label} · step {step} · {where}</span>",
                          rect[0], rect[2],
                          tokens=toks, zrange=zrange, alpha=alpha)]


def _step_index(steps: np.ndarray, step: int) -> int:
    return int(np.clip(np.searchsorted(steps, step), 0, len(steps) - 1))


def _draw(fig, key: str, path: str, stem: str, opts: dict, kind: str) -> None:
    st.plotly_chart(fig, key=key, config=plots.CONFIG)
    downloads.download(fig, key, stem, ["f2_toy", "f1_feedback_loop", "f5_attention"], [path], opts)


def pick_step(opts: list[int]) -> int:
    """The step slider; while playing, each rerun advances it by one recorded step."""
    if st.session_state.get("mx_step") not in opts:
        st.session_state["mx_step"] = opts[-1]
    if st.session_state.get("mx_play"):
        st.session_state["mx_step"] = opts[(opts.index(st.session_state["mx_step"]) + 1) % len(opts)]
    return st.select_slider(f"Step ({len(opts)} recorded, {opts[0]}–{opts[-1]})", opts, key="mx_step")


def pick_zoom(info: dict, kinds: list[str]) -> tuple[bool, tuple[int, int, int] | None]:
    """(big, zoom): crops too big to draw entry by entry get zoom controls and a caption."""
    g = geometry(info, kinds[0])
    big = g["nq"] > MAX_CELLS or g["nk"] > MAX_CELLS or any(f"{k}_pooled" in info["arrays"] for k in kinds)
    zoom = zoom_controls(g, "mx-zoom") if big else None
    if big:
        st.caption(f"Recorded crop: queries {g['q0']}–{g['q0'] + g['nq'] - 1}, keys {g['k0']}–"
                   f"{g['k0'] + g['nk'] - 1} of T = {g['T']}. Left: overview (block means; the orange box is "
                   "the zoom). Right: the real entries inside the box.")
    return big, zoom


def one_step_grid(path: str, kinds: list[str], idx: int, step: int, site: tuple[int, int, int], label: str,
                  fig_opts: dict) -> None:
    """Small matrices at one step: a grid, two per row."""
    for r in range(0, len(kinds), 2):
        cols = st.columns(2)
        for c, kind in zip(cols, kinds[r:r + 2]):
            with c:
                fig = figures_for(path, kind, idx, step, *site, None, label)[0]
                _draw(fig, f"mx-{kind}", path, f"{kind}-step{step}", {**fig_opts, "kind": kind}, kind)
                st.caption(plots.MATRIX_KINDS[kind][2])


def one_step_zoomed(path: str, kinds: list[str], idx: int, step: int, site: tuple[int, int, int],
                    zoom: tuple[int, int, int], label: str, fig_opts: dict) -> None:
    """Big matrices at one step: overview + zoom per quantity."""
    for kind in kinds:
        figs = figures_for(path, kind, idx, step, *site, zoom, label)
        cols = st.columns(len(figs))
        for i, (c, f) in enumerate(zip(cols, figs)):
            with c:
                _draw(f, f"mx-{kind}-{i}", path, f"{kind}-step{step}-{'overview' if i == 0 else 'zoom'}",
                      {**fig_opts, "kind": kind}, kind)
        st.caption(plots.MATRIX_KINDS[kind][2])


def second_step_targets(path: str, opts: list[int], step: int, label: str) -> list[tuple]:
    """The "Second step" slider; [(path, index, step, label)] of both panels."""
    default = opts[0] if step != opts[0] else opts[-1]
    if st.session_state.get("mx_step2") not in opts:
        st.session_state["mx_step2"] = default
    step2 = st.select_slider("Second step", opts, key="mx_step2")
    return [(path, opts.index(step), step, label), (path, opts.index(step2), step2, label)]


def second_run_targets(path: str, other: str | None, idx: int, step: int, label: str) -> list[tuple] | None:
    """Both panels: this run at the step, the second run at its nearest recorded step (None: no second run)."""
    if other is None:
        st.info("Select a second run above.")
        return None
    o_steps = data.steps(other, data.marker(other))
    if not len(o_steps):
        raise AppInputError("The second run has no committed recorded steps.")
    j = _step_index(o_steps, step)
    return [(path, idx, step, label), (other, j, int(o_steps[j]), data.label(data.get_run(other).id))]


def side_by_side(targets: list[tuple], kinds: list[str], site: tuple[int, int, int],
                 zoom: tuple[int, int, int] | None, fig_opts: dict) -> None:
    """Two panels per quantity; signed quantities on one shared colour range."""
    for kind in kinds:
        figs = [figures_for(p, kind, i, s, *site, zoom, lb)[-1] for p, i, s, lb in targets]
        if plots.MATRIX_KINDS[kind][1] == "signed":        # one colour range, so colours compare
            finite = [np.abs(f.data[0].z)[np.isfinite(f.data[0].z)] for f in figs]
            r = max((float(x.max()) for x in finite if x.size), default=1.0)
            figs = [figures_for(p, kind, i, s, *site, zoom, lb, zrange=r)[-1] for p, i, s, lb in targets]
        cols = st.columns(2)
        for n, (c, (p, i, s, lb), f) in enumerate(zip(cols, targets, figs)):
            with c:
                _draw(f, f"mx-cmp-{kind}-{n}", p, f"{kind}-{lb}-step{s}", {**fig_opts, "kind": kind, "step": s, "step_index": i}, kind)
        st.caption(plots.MATRIX_KINDS[kind][2] + (" Both panels share one colour range."
                                                  if plots.MATRIX_KINDS[kind][1] == "signed" else ""))


def panel(path: str, kinds: list[str], layer: int, head: int, seq: int, mode: str, other: str | None) -> None:
    mark = data.marker(path)
    info = data.array_info(path, mark)
    steps = data.steps(path, mark)
    if not len(steps):
        st.info("No recorded step is committed yet; this view will fill in as the run writes.")
        return
    if not kinds:
        st.info("Pick at least one quantity above.")
        return
    opts = list(map(int, steps))
    step = pick_step(opts)
    idx = opts.index(step)
    big, zoom = pick_zoom(info, kinds)
    label = data.label(data.get_run(path).id)
    fig_opts = {"layer": layer, "head": head, "seq": seq, "step": step, "step_index": idx}
    site = (layer, head, seq)
    if mode == MODES[0]:
        if big:
            one_step_zoomed(path, kinds, idx, step, site, zoom, label, fig_opts)
        else:
            one_step_grid(path, kinds, idx, step, site, label, fig_opts)
        return
    if mode == MODES[1]:
        targets = second_step_targets(path, opts, step, label)
    else:
        targets = second_run_targets(path, other, idx, step, label)
    if targets is not None:
        side_by_side(targets, kinds, site, zoom, fig_opts)


def body() -> None:
    st.title("Matrices")
    top = st.columns([3, 1, 1, 1])
    path = ui.pick_run("Run", key="mx_run", container=top[0])
    info = data.array_info(path, data.marker(path))
    avail = [k for k in plots.MATRIX_KINDS if k in info["arrays"]]
    if not avail:
        raise AppInputError("This run recorded no attention matrices (`attn`, `compat`, `advantage`, "
                            "`score_grad`, `scores`); add them to `record.arrays`.")
    g = geometry(info, avail[0])
    at = info["attrs"]                                 # pickers name the model's layer/head (a selection stores some)
    layer = ui.pick_index("Layer", g["L"], "mx_layer", top[1], fmt=lambda l: site_label(at, l))
    head = ui.pick_index("Head", g["H"], "mx_head", top[2], fmt=lambda h: head_label(at, layer, h))
    seq = ui.pick_index("Sequence", g["S"], "mx_seq", top[3])

    default = [k for k in ("attn", "compat", "advantage", "score_grad") if k in avail] or avail[:1]
    if st.session_state.get("mx_kinds") is None or not set(st.session_state["mx_kinds"]) <= set(avail):
        st.session_state["mx_kinds"] = default
    kinds = st.pills("Quantities", avail, selection_mode="multi", key="mx_kinds",
                     format_func=lambda k: plots.MATRIX_KINDS[k][0])
    kinds = [k for k in avail if k in (kinds or [])]
    missing = [plots.MATRIX_KINDS[k][0] for k in ("attn", "compat", "advantage", "score_grad") if k not in avail]
    if missing:
        st.caption("Not recorded in this run: " + ", ".join(missing) + ".")
    c2, c3, c4 = st.columns([1, 4, 3])
    playing = bool(st.session_state.get("mx_play"))
    if c2.button("Pause" if playing else "Play", key="mx_play_btn",
                 icon=":material/pause:" if playing else ":material/play_arrow:",
                 help="Step through the recorded steps automatically"):
        st.session_state["mx_play"] = not playing
        playing = not playing
    mode = c3.radio("Show", MODES, key="mx_mode", horizontal=True, label_visibility="collapsed")
    c4.selectbox("α colour scale", plots.ALPHA_SCALES, key="mx_alpha_scale",
                 format_func=lambda s: {"auto": f"auto (log from T = {plots.LOG_FROM_T})"}.get(s, s),
                 help="At large T most α entries are ≈ 1/T, uniformly dark on [0, 1]: the default draws "
                      "them on a log scale from T = 32 on; 'fitted' spans 0 to the largest entry. "
                      "The colour bar says which scale is shown.")
    other = None
    if mode == MODES[2]:
        opts = [r for r in ui.candidates() if ui.abspath(r) != path] or ui.candidates()
        other = ui.pick_run("Second run", key="mx_other", options=opts, container=c4)
    every = PLAY_EVERY_S if playing else (ui.LIVE_EVERY_S if data.is_live(data.get_run(path)) else None)
    # the banner lives in the fragment too, so "still being written" goes away when the run finishes
    st.fragment(lambda: ui.guard(lambda: (ui.run_banner(path), panel(path, kinds, layer, head, seq, mode, other))),
                run_every=every)()


ui.guard(body)
