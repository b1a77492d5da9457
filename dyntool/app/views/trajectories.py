"""Trajectories: value vectors (or head outputs, upstream gradients, queries, keys) over training,
projected on ONE PCA basis fitted per run (never refitted per step), in 2-D or 3-D, coloured by
step, class or posterior entropy; the toy's raw 2-D values as they are."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import streamlit as st

from dyntool.app import analysis, data, downloads, plots, ui
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


def reference(arrs: dict, vec: str) -> dict:
    """The recorded array that gives the vectors' shape (n, layers, heads, sequences, ..., d)."""
    return arrs["values" if vec == "head_outputs" else vec]


@dataclass(frozen=True)
class Selection:
    """What the top row picked: one run's vectors of one kind at one (layer, head, sequence)."""
    path: str
    mark: int
    info: dict
    vec: str
    layer: int
    head: int
    seq: int

    @property
    def ref(self) -> dict:
        return reference(self.info["arrays"], self.vec)

    @property
    def offset(self) -> int:                    # position of the first drawn vector in the sequence
        arrs = self.info["arrays"]
        return int(arrs["attn"]["attrs"].get("query_offset", 0)) if self.vec == "head_outputs" else 0

    def load(self, idx: tuple[int, ...]) -> np.ndarray:
        return load(self.path, self.mark, self.vec, self.layer, self.head, self.seq, idx)

    def where(self) -> str:
        """The run and the model's layer/head numbers of the selection, for the figure titles."""
        at = self.info.get("attrs", {})
        run_id = data.label(data.get_run(self.path).id)
        return f"{run_id} · {site_label(at, self.layer)} {head_label(at, self.layer, self.head)}"


def pick_vectors(arrs: dict, container) -> str:
    """The "Vectors" picker over the kinds this run recorded (an error when it recorded none)."""
    avail = [v for v, (a, *_) in VECTORS.items()
             if all(x in arrs for x in a.split("+"))]
    if not avail:
        raise AppInputError("This run recorded no vectors to project (`values`, `upstream`, `queries`, "
                            "`keys`, or `attn` + `values`); add them to `record.arrays`.")
    if st.session_state.get("tr_vec") not in avail:
        st.session_state["tr_vec"] = avail[0]
    return container.selectbox("Vectors", avail, key="tr_vec", format_func=lambda v: VECTORS[v][2])


def pick_selection() -> Selection:
    """The top row: run, layer, head, sequence and vectors."""
    top = st.columns([3, 1, 1, 1, 2])
    path = ui.pick_run("Run", key="tr_run", container=top[0])
    ui.run_banner(path)
    mark = data.marker(path)
    info = data.array_info(path, mark)
    vec = pick_vectors(info["arrays"], top[4])
    n, L, H, S = reference(info["arrays"], vec)["shape"][:4]
    at = info.get("attrs", {})                          # pickers name the model's layer/head
    layer = ui.pick_index("Layer", L, "tr_layer", top[1], fmt=lambda l: site_label(at, l))
    head = ui.pick_index("Head", H, "tr_head", top[2], fmt=lambda h: head_label(at, layer, h))
    seq = ui.pick_index("Sequence", S, "tr_seq", top[3])
    return Selection(path, mark, info, vec, layer, head, seq)


def pick_view(c: list, d: int) -> tuple[str, str, str]:
    """Projection, what the PCA basis is fitted on, and paths or one step."""
    projs = (["raw 2-D"] if d == 2 else []) + ["PCA 2-D", "PCA 3-D"]
    proj = c[0].radio("Projection", projs, key="tr_proj", horizontal=True)
    fit_on = c[1].radio("PCA basis fitted on", ["final", "all"], key="tr_fit", horizontal=True,
                        format_func=lambda f: "final recorded step" if f == "final" else "all drawn steps",
                        disabled=proj == "raw 2-D")
    show = c[2].radio("Show", ["paths over training", "one step"], key="tr_show", horizontal=True)
    return proj, fit_on, show


def pick_positions(container, n_pos: int, show: str) -> np.ndarray:
    """The positions drawn: evenly spaced ones for the paths, all of them for one step."""
    max_paths = container.slider("Positions drawn", 1, n_pos, min(n_pos, 24), key="tr_npos",
                                 help="Evenly spaced positions; the 'one step' view shows all of them.") if n_pos > 1 else 1
    return analysis.even_subset(n_pos, max_paths) if show.startswith("paths") else np.arange(n_pos)


def pick_colour(col_opts: dict[str, tuple[np.ndarray, str]], show: str) -> str:
    """The "Colour by" radio, and what "class" means here when it is picked."""
    modes = (["step"] if show.startswith("paths") else []) + list(col_opts) + ["none"]
    if st.session_state.get("tr_col") not in modes:
        st.session_state["tr_col"] = "class" if "class" in modes else modes[0]
    colour = st.radio("Colour by", modes, key="tr_col", horizontal=True)
    if colour == "class":
        st.caption("**class** = " + (
            "the target class of the query that attends to this key most at the final recorded step "
            "(a value or key vector is coloured by who uses it)" if "uses it most" in col_opts["class"][1]
            else "the target class recorded for this position") + "; one colour per class.")
    return colour


def projection(sel: Selection, proj: str, fit_on: str, d: int, idx: tuple[int, ...]):
    """(basis or None for raw coordinates, axis names, the map from vectors to drawn coordinates)."""
    if proj == "raw 2-D":
        sym = f"{VECTORS[sel.vec][3]}_{VECTORS[sel.vec][1]}"
        return None, [f"{sym}[0]", f"{sym}[1]"], lambda x: x
    k = 3 if proj.endswith("3-D") else 2
    B = basis(sel.path, sel.mark, sel.vec, sel.layer, sel.head, sel.seq, fit_on, min(k, d), idx)
    axes = [f"PC{i + 1} ({r * 100:.1f}%)" for i, r in enumerate(B.explained)] + ["PC3"]
    return B, axes, B.project


def paths_figure(sel: Selection, project, steps: np.ndarray, sub: np.ndarray, positions: np.ndarray,
                 n_pos: int, colour: str, col: tuple, axes: list[str]):
    """The paths over the drawn steps, and the note saying how many are drawn."""
    idx = tuple(int(i) for i in sub)
    d = sel.ref["shape"][-1]
    X = sel.load(idx)[:, positions]                                          # (n_steps, n_pos, d)
    P = project(X.reshape(-1, d)).reshape(len(idx), len(positions), -1)
    fig = plots.trajectories(P, steps[sub], positions + sel.offset, colour, col[0],
                             f"{VECTORS[sel.vec][2]} over training · {sel.where()}", axes, VECTORS[sel.vec][1],
                             color_title=col[1])
    note = (f"{len(positions)} of {n_pos} positions, {len(idx)} of {len(steps)} recorded steps "
            f"(evenly spaced, first and last included); stars/diamonds mark the final step.")
    return fig, note


def step_figure(sel: Selection, project, steps: np.ndarray, sub: np.ndarray, positions: np.ndarray,
                n_pos: int, colour: str, col: tuple, axes: list[str]):
    """The "Step" slider, every position at that step, and the note."""
    idx = tuple(int(i) for i in sub)
    opts = [int(s) for s in steps[sub]]
    if st.session_state.get("tr_step") not in opts:
        st.session_state["tr_step"] = opts[-1]
    step = st.select_slider("Step", opts, key="tr_step")
    X = sel.load((idx[opts.index(step)],))[0]
    fig = plots.snapshot(project(X), positions + sel.offset, col[0], colour,
                         f"{VECTORS[sel.vec][2]} at step {step} · {sel.where()}", axes, VECTORS[sel.vec][1], col[1])
    return fig, f"all {n_pos} positions at step {step}."


def show_figure(sel: Selection, fig, note: str, proj: str, colour: str) -> None:
    st.plotly_chart(fig, key="tr-fig", config=plots.CONFIG)
    fig_opts = {"vectors": sel.vec, "layer": sel.layer, "head": sel.head, "seq": sel.seq,
                "projection": proj, "colour": colour}
    downloads.download(fig, "tr-fig", f"trajectories-{sel.vec}", ["f2_toy", "f6_value_pca"],
                    [sel.path], fig_opts)
    st.caption(note)


def basis_notes(sel: Selection, B: analysis.Basis | None, fit_on: str, x_last: np.ndarray) -> None:
    """Beside the figure: the coordinates drawn, the variance explained, r(PC1, posterior entropy)."""
    if B is None:
        st.markdown("**Raw coordinates** (d = 2): no projection, the vectors as recorded.")
        return
    d = sel.ref["shape"][-1]
    st.markdown(f"**PCA basis** fitted once on the {'final recorded step' if fit_on == 'final' else 'drawn steps stacked'}"
                f" ({d}-D {VECTORS[sel.vec][2].split(' ')[0]}); every step is projected on it.")
    st.plotly_chart(plots.explained_bar(B.explained), key="tr-ev", config={"displayModeBar": False})
    st.caption("PC1+PC2: " + f"{B.explained[:2].sum() * 100:.1f}% of the variance")
    ent = data.static(sel.path, sel.mark).get("bayes_entropy")
    n_pos, offset = x_last.shape[0], sel.offset
    if ent is not None and len(ent) >= offset + n_pos:
        r = pearson(B.project(x_last)[:, 0], np.asarray(ent, float)[offset:offset + n_pos])
        st.metric("r(PC1, posterior entropy), final step", f"{r:+.3f}")


def body() -> None:
    st.title("Trajectories")
    sel = pick_selection()
    steps = data.steps(sel.path, sel.mark)
    if not len(steps):
        st.info("No recorded step is committed yet.")
        return
    sub = analysis.even_subset(len(steps), MAX_STEPS)
    idx = tuple(int(i) for i in sub)
    d = sel.ref["shape"][-1]
    c = st.columns(4)
    proj, fit_on, show = pick_view(c, d)
    x_last = sel.load(idx[-1:])[0]
    n_pos = x_last.shape[0]
    positions = pick_positions(c[3], n_pos, show)
    col_opts = colours(sel.path, sel.mark, sel.info, sel.vec, sel.layer, sel.head, sel.seq, idx[-1],
                       positions, sel.offset)
    colour = pick_colour(col_opts, show)
    B, axes, project = projection(sel, proj, fit_on, d, idx)
    draw = paths_figure if show.startswith("paths") else step_figure
    fig, note = draw(sel, project, steps, sub, positions, n_pos, colour, col_opts.get(colour, (None, "")), axes)
    left, right = st.columns([3, 1])
    with left:
        show_figure(sel, fig, note, proj, colour)
    with right:
        basis_notes(sel, B, fit_on, x_last)


ui.guard(body)
