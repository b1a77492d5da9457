"""Overview of one run: facts, curves (loss, perplexity, attention entropy, max|logit| per layer and
head, gradient norms, other metrics), the cheap tier's per-head statistics (every step), the
resolved config, meta and the recorded arrays."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dyntool.app import data, downloads, plots, ui
from dyntool.record import metric_names as mn

MAX_LINES = 8          # more (layer, head) curves than this: a layer × step heatmap instead


def facts(path: str) -> None:
    run = data.get_run(path)
    s = data.summary(path, data.signature(path))
    tags = ", ".join(s.get("tags") or []) or "none"
    esc = data.esc                                  # strings from meta.json: plain text, never Markdown
    st.markdown(f"**{esc(run.kind)}** run · status **{esc(run.status)}** · tags: {esc(tags)} · "
                f"created {esc(s.get('created') or '?')}")
    c = st.columns(4)
    c[0].metric("steps taken", s["steps"])
    c[1].metric("steps recorded", s["recorded"])
    c[2].metric("size on disk", f"{s['size_mb']:.1f} MB")
    fin = next((k for k in ("final val_loss", "final loss") if k in s), None)
    c[3].metric(fin or "final loss", f"{s[fin]:.4g}" if fin else "–")


def per_head_figure(arr: np.ndarray, steps: np.ndarray, title: str, z_title: str, key: str):
    """Lines per (layer, head) when few, else a layer × step heatmap with a head aggregate."""
    L, H = arr.shape[1:3]
    if L * H <= MAX_LINES:
        df = pd.DataFrame({"step": steps})
        names = {}
        for l in range(L):
            for h in range(H):
                col = f"L{l}H{h}"
                df[col] = arr[:, l, h]
                names[col] = f"layer {l} head {h}"
        return plots.curves(df, list(names), title, names=names, y_title=z_title)
    opts = ["max over heads", "mean over heads"] + [f"head {h}" for h in range(H)]
    how = st.selectbox(f"{title}: heads", opts, key=f"agg-{key}")
    if how.startswith("max"):
        v = np.nanmax(arr, axis=2)
    elif how.startswith("mean"):
        v = np.nanmean(arr, axis=2)
    else:
        v = arr[:, :, int(how.split()[1])]
    return plots.layer_step_heatmap(v, steps, f"{title} ({how})", z_title)


def logged_per_head(df: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, values (steps, layer, head)) from metrics ``NAME/L{l}H{h}``, or None if not logged."""
    cells = mn.per_head(df.columns, name)
    if not cells:
        return None
    L, H = max(l for l, _ in cells) + 1, max(h for _, h in cells) + 1
    rows = df.dropna(subset=list(cells.values()), how="all")
    out = np.full((len(rows), L, H), np.nan)
    for (l, h), c in cells.items():
        out[:, l, h] = rows[c].to_numpy(dtype=float)
    return rows["step"].to_numpy(), out


def _chart(fig, key: str, stem: str, figures: list[str], path: str) -> None:
    st.plotly_chart(fig, key=key, config=plots.CONFIG)
    downloads.download(fig, key, stem, figures, [path])


def loss_plot(path: str, df: pd.DataFrame, cols: list[str], log_y: bool) -> None:
    ys = [c for c in ("loss", "val_loss") if c in cols]
    if ys:
        title = "Loss (train / validation)" if "val_loss" in ys else "Training loss"
        fig = plots.curves(df, ys, title, log_y=log_y, y_title="cross-entropy (nats)",
                           names={"loss": "train", "val_loss": "validation"})
        _chart(fig, "ov-loss", "loss", ["f3_em_vs_sgd", "ls_loss_logits", "span_val_loss"], path)


def perplexity_plot(path: str, df: pd.DataFrame, cols: list[str]) -> None:
    if "val_ppl" in cols or "loss" in cols:
        p = pd.DataFrame({"step": df["step"]})
        names = {}                 # train first, as in the loss plot, so the colours match
        if "loss" in cols:
            p["train_ppl"] = np.exp(df["loss"].astype(float).clip(upper=50))
            names["train_ppl"] = "train = exp(loss)"
        if "val_ppl" in cols:
            p["val_ppl"] = df["val_ppl"]
            names["val_ppl"] = "validation"
        fig = plots.curves(p, list(names), "Perplexity", names=names, y_title="perplexity", log_y=True)
        _chart(fig, "ov-ppl", "perplexity", [], path)


def entropy_plot(path: str, mark: int, df: pd.DataFrame, cols: list[str], arrays: dict, steps: np.ndarray) -> None:
    """Attention entropy: logged every step (cheap tier), else recorded, else the logged mean."""
    ent_steps = logged_per_head(df, mn.ATTN_ENTROPY)
    if ent_steps is not None and len(ent_steps[0]) > len(steps):   # the cheap tier: every step
        fig = per_head_figure(ent_steps[1], ent_steps[0], "Attention entropy (mean over queries, every step)",
                              "nats", "ent")
    elif "attn_entropy" in arrays and len(steps):
        arr = data.head_series(path, mark, "attn_entropy")
        fig = per_head_figure(arr, steps, "Attention entropy (mean over queries)", "nats", "ent")
    elif mn.ATTN_ENTROPY in cols:
        fig = plots.curves(df, [mn.ATTN_ENTROPY], "Attention entropy (mean)", y_title="nats")
    else:
        fig = None
        st.caption("No attention entropy recorded (`attn_entropy`).")
    if fig is not None:
        _chart(fig, "ov-ent", "attention_entropy", ["f5_attention"], path)


def logit_max_plot(path: str, mark: int, df: pd.DataFrame, cols: list[str], arrays: dict,
                   steps: np.ndarray) -> None:
    """max|logit| per layer and head: logged every step, else recorded, else logged per layer."""
    lm_cols = sorted(c for c in cols if c.startswith(mn.LOGIT_MAX))
    per_step = logged_per_head(df, mn.LOGIT_MAX)
    if per_step is not None:          # logged every step: finer than the recorded steps
        fig = per_head_figure(per_step[1], per_step[0], "max |logit| per layer and head (every step)",
                              "max |s_ij|", "lmax")
    elif "logit_max" in arrays and len(steps):
        fig = per_head_figure(data.head_series(path, mark, "logit_max"), steps,
                              "max |logit| per layer and head", "max |s_ij|", "lmax")
    elif lm_cols:
        fig = plots.curves(df, lm_cols, "max |logit| per layer", y_title="max |s_ij|")
    else:
        fig = None
        st.caption("No max|logit| recorded (`logit_max`).")
    if fig is not None:
        _chart(fig, "ov-lmax", "logit_max", ["ls_logit_heatmap", "ls_loss_logits"], path)


def grad_norm_plot(path: str, df: pd.DataFrame, cols: list[str], log_y: bool) -> None:
    gn = [c for c in cols if mn.GRAD_NORM in c]
    if gn:
        fig = plots.curves(df, gn, "Gradient norms", log_y=log_y, y_title="‖∇‖")
        _chart(fig, "ov-gn", "grad_norms", [], path)
    else:
        st.caption("No gradient norms logged (`grad_norm*`).")


def other_metrics(path: str, df: pd.DataFrame, cols: list[str]) -> None:
    """The numeric metrics no other plot shows, picked in a multiselect."""
    lm_cols = [c for c in cols if c.startswith(mn.LOGIT_MAX)]
    gn = [c for c in cols if mn.GRAD_NORM in c]
    shown = {"loss", "val_loss", "val_ppl", mn.ATTN_ENTROPY, *lm_cols, *gn}
    rest = [c for c in cols if c not in shown and pd.api.types.is_numeric_dtype(df[c])
            and not _per_head_column(c)]
    if rest:
        default = [c for c in ("accuracy", "entropy", "lr") if c in rest][:2] or rest[:1]
        pick = st.multiselect("Other metrics", rest, default=default, key="ov_other")
        if pick:
            fig = plots.curves(df, pick, "Other metrics")
            _chart(fig, "ov-other", "metrics", [], path)


def curves(path: str) -> None:
    mark = data.marker(path)
    df = data.metrics(path, data.signature(path))
    info = data.array_info(path, mark)
    arrays = info["arrays"]
    if df.empty and not arrays:
        st.info("Nothing logged yet: metrics.jsonl is empty and nothing is recorded.")
        return
    steps = data.steps(path, mark) if "step" in arrays else np.zeros(0, int)
    cols = [c for c in df.columns if c != "step"]
    log_y = st.toggle("log scale for loss and gradient norms", value=False, key="ov_log")
    left, right = st.columns(2)
    with left:
        loss_plot(path, df, cols, log_y)
    with right:
        perplexity_plot(path, df, cols)
    left, right = st.columns(2)
    with left:
        entropy_plot(path, mark, df, cols, arrays, steps)
    with right:
        logit_max_plot(path, mark, df, cols, arrays, steps)
    left, right = st.columns(2)
    with left:
        grad_norm_plot(path, df, cols, log_y)
    with right:
        other_metrics(path, df, cols)


# the cheap tier's statistics (dyntool.flight), in words for the panel
CHEAP_TITLES = {
    mn.SCORE_MAX: ("largest score s_ij the softmax sees", "max s_ij"),
    mn.EXPECTED_COMPAT: ("E_α[b] = u·o, mean over queries", "E_α[b]"),
    mn.COMPAT_VAR: ("Var_α[b], mean over queries", "Var_α[b]"),
    mn.SCORE_GRAD_NORM: ("‖∂L/∂S‖ (score gradient)", "‖dS‖"),
    mn.UPSTREAM_NORM: ("‖U‖ = ‖∂L/∂(head output)‖", "‖U‖"),
    mn.VALUE_GRAD_NORM: ("value update ‖Σ_i α_ij u_i‖", "‖αᵀU‖"),
    mn.COLUMN_MAX: ("column usage max_j Σ_i α_ij / T", "max c_j / T"),
    mn.COLUMN_ENTROPY: ("column usage entropy", "nats"),
    mn.SINK_MASS: ("attention sink share", "sink mass"),
}


def _per_head_column(c: str) -> bool:
    p = mn.parse(c)
    return p is not None and p.kind == "head" and p.base in CHEAP_TITLES


def cheap_tier(path: str) -> None:
    """Every head, every step: one statistic of the cheap tier as a layer × step heatmap."""
    df = data.metrics(path, data.signature(path))
    have = [n for n in CHEAP_TITLES if any(mn.parse(str(c)) == mn.MetricName(n, "head", 0, 0) for c in df.columns)]
    if not have:
        return
    st.subheader("Every head, every step (cheap tier)")
    name = st.selectbox("statistic", have, format_func=lambda n: f"{n}: {CHEAP_TITLES[n][0]}", key="ov_cheap")
    steps, arr = logged_per_head(df, name)
    title, z = CHEAP_TITLES[name]
    fig = per_head_figure(arr, steps, title, z, f"cheap-{name}")
    st.plotly_chart(fig, key="ov-cheap", config=plots.CONFIG)
    downloads.download(fig, "ov-cheap", name, [], [path])


def details(path: str) -> None:
    run = data.get_run(path)
    info = data.array_info(path, data.marker(path))
    t1, t2, t3 = st.tabs(["Resolved config", "Meta", "Recorded arrays"])
    with t1:
        st.json(run.config or {"(missing)": "config.json is missing or unreadable"}, expanded=2)
    with t2:
        st.json(run.meta or {"(missing)": "meta.json is missing or unreadable"}, expanded=1)
    with t3:
        rows = [{"array": n, "dims": " × ".join(f"{d}={s}" for d, s in zip(a["dims"], a["shape"])),
                 "dtype": a["dtype"], "attrs": ", ".join(f"{k}={v}" for k, v in a["attrs"].items())}
                for n, a in info["arrays"].items()]
        rows += [{"array": f"static/{n}", "dims": " × ".join(map(str, s)), "dtype": "", "attrs": "no step axis"}
                 for n, s in info["static"].items()]
        if rows:
            st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        else:
            st.caption("Nothing recorded (no record.zarr).")
        for p in info["problems"]:
            st.warning(data.esc(p))


def body() -> None:
    st.title("Overview")
    path = ui.pick_run("Run", key="ov_run")
    run = data.get_run(path)

    def panel():                  # the banner re-runs with the curves, so it never goes stale
        ui.guard(lambda: (ui.run_banner(path), facts(path), curves(path), cheap_tier(path)))
    ui.live(panel, data.is_live(run), "ov")
    with st.expander("Config, meta and recorded arrays", expanded=False):
        details(path)


ui.guard(body)
