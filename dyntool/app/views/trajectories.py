"""Trajectories: value vectors (or head outputs, upstream gradients, queries, keys) over training,
projected on ONE PCA basis fitted per run (never refitted per step), in 2-D or 3-D, coloured by
step, class or posterior entropy; the toy's raw 2-D values as they are."""
from __future__ import annotations

import numpy as np
import streamlit as st

from dyntool.app import analysis, data, export, plots, ui
from dyntool.app.data import AppInputError
from dyntool.record.sites import head_label, site_label
from dyntool.stats import pearson

MAX_STEPS = 200          # steps drawn along each path (evenly spaced, first and last kept; stated)
VECTORS = {              # option -> (arrays, position letter, label, symbol)
    "values": ("values", "j", "value vectors v_j", "v"),
    "head_outputs": ("attn+values", "i", "head outputs g_i = Σ_j α_ij v_j", "g"),
    "upstream": ("upstream", "i", "upstream gradients u_i = ∂L/∂g_i", "u"),
    "queries": ("queries", "i", "queries q_i", "q"),
    "keys": ("keys", "j", "keys k_j", "k"),
}


def load(path: str, mark: int, vec: str, layer: int, head: int, seq: int, idx: tuple[int, ...]) -> np.ndarray:
    if vec == "head_outputs":
        return data.head_outputs(path, mark, layer, head, seq, idx)
    return data.vectors(path, mark, vec, layer, head, seq, idx)


@st.cache_data(max_entries=64, show_spinner=False)
def basis(path: str, mark: int, vec: str, layer: int, head: int, seq: int, fit_on: str, k: int,
          idx: tuple[int, ...]) -> analysis.Basis:
    """The run's PCA basis: on the final recorded step, or on every drawn step stacked."""
    x = load(path, mark, vec, layer, head, seq, idx[-1:] if fit_on == "final" else idx)
    return analysis.fit_basis(x.reshape(-1, x.shape[-1]), k=k, fitted_on=fit_on)


def colours(path: str, mark: int, info: dict, vec: str, layer: int, head: int, seq: int, last: int,
            positions: np.ndarray, offset: int) -> dict[str, tuple[np.ndarray, str]]:
    """Per-position colour values available for this run: {mode: (values, legend title)}."""
    out: dict[str, tuple[np.ndarray, str]] = {}
    st_ = data.static(path, mark)
    labels = info["attrs"].get("labels")
    labels = np.asarray(labels) if labels is not None else st_.get("targets")
    pos = positions + offset
    if labels is not None:
        labels = np.asarray(labels).astype(int)
        if VECTORS[vec][1] == "j" and "attn" in info["arrays"]:
            a = info["arrays"]["attn"]
            m = data.matrix(path, mark, "attn", last, layer, head, seq)
            users = analysis.dominant_users(m, int(a["attrs"].get("query_offset", 0)),
                                            int(a["attrs"].get("key_offset", 0)), len(labels))
            cls = np.where(users[pos] >= 0, labels[np.clip(users[pos], 0, None)], labels[pos])
            out["class"] = (cls, "class of the query that uses it most (final step)")
        else:
            out["class"] = (labels[np.clip(pos, 0, len(labels) - 1)], "class (target)")
    if "bayes_entropy" in st_:
        out["posterior entropy"] = (np.asarray(st_["bayes_entropy"], dtype=float)[pos], "posterior entropy (nats)")
    return out


def body() -> None:
    st.title("Trajectories")
    top = st.columns([3, 1, 1, 1, 2])
    path = ui.pick_run("Run", key="tr_run", container=top[0])
    ui.run_banner(path)
    mark = data.marker(path)
    info = data.array_info(path, mark)
    arrs = info["arrays"]
    avail = [v for v, (a, *_) in VECTORS.items()
             if all(x in arrs for x in a.split("+"))]
    if not avail:
        raise AppInputError("This run recorded no vectors to project (`values`, `upstream`, `queries`, "
                            "`keys`, or `attn` + `values`); add them to `record.arrays`.")
    if st.session_state.get("tr_vec") not in avail:
        st.session_state["tr_vec"] = avail[0]
    vec = top[4].selectbox("Vectors", avail, key="tr_vec", format_func=lambda v: VECTORS[v][2])
    ref = arrs["values" if vec == "head_outputs" else vec]
    n, L, H, S = ref["shape"][:4]
    at = info.get("attrs", {})                          # pickers name the model's layer/head
    layer = ui.pick_index("Layer", L, "tr_layer", top[1], fmt=lambda l: site_label(at, l))
    head = ui.pick_index("Head", H, "tr_head", top[2], fmt=lambda h: head_label(at, layer, h))
    seq = ui.pick_index("Sequence", S, "tr_seq", top[3])
    steps = data.steps(path, mark)
    if not len(steps):
        st.info("No recorded step is committed yet.")
        return
    sub = analysis.even_subset(len(steps), MAX_STEPS)
    idx = tuple(int(i) for i in sub)

    d = ref["shape"][-1]
    c = st.columns(4)
    projs = (["raw 2-D"] if d == 2 else []) + ["PCA 2-D", "PCA 3-D"]
    proj = c[0].radio("Projection", projs, key="tr_proj", horizontal=True)
    fit_on = c[1].radio("PCA basis fitted on", ["final", "all"], key="tr_fit", horizontal=True,
                        format_func=lambda f: "final recorded step" if f == "final" else "all drawn steps",
                        disabled=proj == "raw 2-D")
    show = c[2].radio("Show", ["paths over training", "one step"], key="tr_show", horizontal=True)

    x_last = load(path, mark, vec, layer, head, seq, idx[-1:])[0]
    n_pos = x_last.shape[0]
    offset = int(arrs["attn"]["attrs"].get("query_offset", 0)) if vec == "head_outputs" else 0
    max_paths = c[3].slider("Positions drawn", 1, n_pos, min(n_pos, 24), key="tr_npos",
                            help="Evenly spaced positions; the 'one step' view shows all of them.") if n_pos > 1 else 1
    positions = analysis.even_subset(n_pos, max_paths) if show.startswith("paths") else np.arange(n_pos)

    col_opts = colours(path, mark, info, vec, layer, head, seq, idx[-1], positions, offset)
    modes = (["step"] if show.startswith("paths") else []) + list(col_opts) + ["none"]
    if st.session_state.get("tr_col") not in modes:
        st.session_state["tr_col"] = "class" if "class" in modes else modes[0]
    colour = st.radio("Colour by", modes, key="tr_col", horizontal=True)
    if colour == "class":
        st.caption("**class** = " + (
            "the target class of the query that attends to this key most at the final recorded step "
            "(a value or key vector is coloured by who uses it)" if "uses it most" in col_opts["class"][1]
            else "the target class recorded for this position") + "; one colour per class.")

    if proj == "raw 2-D":
        B = None
        sym = f"{VECTORS[vec][3]}_{VECTORS[vec][1]}"
        axes = [f"{sym}[0]", f"{sym}[1]"]
        project = lambda x: x                                        # noqa: E731
    else:
        k = 3 if proj.endswith("3-D") else 2
        B = basis(path, mark, vec, layer, head, seq, fit_on, min(k, d), idx)
        axes = [f"PC{i + 1} ({r * 100:.1f}%)" for i, r in enumerate(B.explained)] + ["PC3"]
        project = B.project
    run_id = data.label(data.get_run(path).id)
    at = info.get("attrs", {})                      # the model's layer/head numbers of a selection
    where = f"{run_id} · {site_label(at, layer)} {head_label(at, layer, head)}"
    cv, ctitle = col_opts.get(colour, (None, ""))
    pos_name = VECTORS[vec][1]
    fig_opts = {"vectors": vec, "layer": layer, "head": head, "seq": seq, "projection": proj, "colour": colour}
    if show.startswith("paths"):
        X = load(path, mark, vec, layer, head, seq, idx)[:, positions]           # (n_steps, n_pos, d)
        P = project(X.reshape(-1, d)).reshape(len(idx), len(positions), -1)
        fig = plots.trajectories(P, steps[sub], positions + offset, colour, cv,
                                 f"{VECTORS[vec][2]} over training · {where}", axes, pos_name,
                                 color_title=ctitle)
        note = (f"{len(positions)} of {n_pos} positions, {len(idx)} of {len(steps)} recorded steps "
                f"(evenly spaced, first and last included); stars/diamonds mark the final step.")
    else:
        opts = [int(s) for s in steps[sub]]
        if st.session_state.get("tr_step") not in opts:
            st.session_state["tr_step"] = opts[-1]
        step = st.select_slider("Step", opts, key="tr_step")
        X = load(path, mark, vec, layer, head, seq, (idx[opts.index(step)],))[0]
        fig = plots.snapshot(project(X), positions + offset, cv, colour, f"{VECTORS[vec][2]} at step {step} · {where}",
                             axes, pos_name, ctitle)
        note = f"all {n_pos} positions at step {step}."
    left, right = st.columns([3, 1])
    with left:
        st.plotly_chart(fig, key="tr-fig", config=plots.CONFIG)
        export.download(fig, "tr-fig", f"trajectories-{vec}", ["f2_toy", "f6_value_pca"],
                        [path], fig_opts)
        st.caption(note)
    with right:
        if B is None:
            st.markdown("**Raw coordinates** (d = 2): no projection, the vectors as recorded.")
        else:
            st.markdown(f"**PCA basis** fitted once on the {'final recorded step' if fit_on == 'final' else 'drawn steps stacked'}"
                        f" ({d}-D {VECTORS[vec][2].split(' ')[0]}); every step is projected on it.")
            st.plotly_chart(plots.explained_bar(B.explained), key="tr-ev", config={"displayModeBar": False})
            st.caption("PC1+PC2: " + f"{B.explained[:2].sum() * 100:.1f}% of the variance")
            ent = data.static(path, mark).get("bayes_entropy")
            if ent is not None and len(ent) >= offset + n_pos:
                r = pearson(B.project(x_last)[:, 0], np.asarray(ent, float)[offset:offset + n_pos])
                st.metric("r(PC1, posterior entropy), final step", f"{r:+.3f}")


ui.guard(body)
