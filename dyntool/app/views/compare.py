"""Compare: several runs overlaid, grouped by a config key (e.g. ``arm``: SGD vs EM-like) with
mean ± std bands across seeds; any logged metric, or recorded max|logit| / attention entropy."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dyntool.run import study_summary
from dyntool.stats import mean_std
from dyntool.app import analysis, data, downloads, plots, ui
from dyntool.app.data import AppInputError

REC_LMAX = "max |logit| (recorded, max over layers and heads)"
REC_ENT = "attention entropy (recorded, mean over layers, heads, queries)"
NO_GROUP, SAME_CONFIG = analysis.NO_GROUP, analysis.SAME_CONFIG
FIGURES_FOR = {"loss": ["f3_em_vs_sgd", "ls_loss_logits"], "entropy": ["f4_entropy"],
               "val_loss": ["span_val_loss", "ls_loss_logits"], REC_LMAX: ["ls_loss_logits", "ls_logit_heatmap"]}


def curve(path: str, metric: str) -> pd.Series | None:
    """One run's curve of ``metric`` indexed by step, or None if it doesn't have it."""
    if metric in (REC_LMAX, REC_ENT):
        mark = data.marker(path)
        name = "logit_max" if metric == REC_LMAX else "attn_entropy"
        if name not in data.array_info(path, mark)["arrays"]:
            return None
        arr = data.head_series(path, mark, name)
        v = arr.reshape(len(arr), -1)
        v = np.nanmax(v, axis=1) if metric == REC_LMAX else np.nanmean(v, axis=1)
        return pd.Series(v, index=data.steps(path, mark))
    df = data.metrics(path, data.signature(path))
    if metric not in df.columns or "step" not in df.columns:
        return None
    s = df[["step", metric]].dropna()
    return pd.Series(s[metric].to_numpy(dtype=float), index=s["step"].to_numpy())


def group_labels(paths: list[str], key: str) -> dict[str, str]:
    """{run path: the label of its group under ``key``}.  Seeds of one config are labelled by
    their first run's id (the band's legend adds how many runs it holds)."""
    runs = {p: data.get_run(p) for p in paths}
    if key == SAME_CONFIG:
        members: dict[str, list[str]] = {}
        for p in sorted(paths, key=lambda p: runs[p].id):
            members.setdefault(analysis.config_identity(runs[p].config), []).append(runs[p].id)
        ids = {p: members[analysis.config_identity(r.config)] for p, r in runs.items()}
        return {p: data.label(i[0] if len(i) == 1 else f"{i[0]} + seeds") for p, i in ids.items()}
    out = {}
    for p, run in runs.items():
        if key == NO_GROUP:
            out[p] = data.label(run.id)
        elif key == "kind":
            out[p] = data.label(run.kind)
        else:
            flat = analysis.flatten(run.config)
            out[p] = data.label(f"{key}={flat[key]}" if key in flat else f"{run.id} (no {key})")
    return out


def reference(paths: list[str], metric: str) -> tuple[float, str] | None:
    """H_min from a study's summary.json (inside RUNS_DIR) for entropy/loss curves."""
    if metric not in ("loss", "entropy", "val_loss"):
        return None
    for p in paths:
        folder = data.parent_of(p)
        if not data.backend(folder).contained():      # a study folder above RUNS_DIR is not read
            continue
        h = study_summary(folder).get("h_min")
        if isinstance(h, (int, float)) and not isinstance(h, bool):
            return float(h), f"H_min = {h:.4f}"
    return None


def default_runs(cands: list[str]) -> list[str]:
    """The runs preset: the selection, else the newest run's kind (readable runs only)."""
    if ui.selected():
        return cands[:24]
    kinds = {r: data.get_run(ui.abspath(r)).kind for r in cands}
    ok = [r for r in cands if not data.get_run(ui.abspath(r)).problems]
    return [r for r in ok if kinds[r] == kinds[(ok or cands)[0]]][:24]


def pick_runs() -> list[str]:
    """The "Runs to compare" multiselect; the chosen runs' paths."""
    cands = ui.candidates()
    default = default_runs(cands)
    if not set(st.session_state.get("cmp_runs", [])) <= set(cands):
        st.session_state.pop("cmp_runs", None)
    chosen = st.multiselect("Runs to compare", cands, default=default, key="cmp_runs",
                            help="Preset from the selection on the Runs page.")
    return [ui.abspath(r) for r in chosen]


def available_metrics(paths: list[str]) -> dict[str, int]:
    """{metric: how many of the runs have it}: numeric logged metrics and the recorded curves."""
    metrics_avail: dict[str, int] = {}
    for p in paths:
        df = data.metrics(p, data.signature(p))
        for c in df.columns:
            if c != "step" and pd.api.types.is_numeric_dtype(df[c]):
                metrics_avail[c] = metrics_avail.get(c, 0) + 1
        arrs = data.array_info(p, data.marker(p))["arrays"]
        for name, label in (("logit_max", REC_LMAX), ("attn_entropy", REC_ENT)):
            if name in arrs:
                metrics_avail[label] = metrics_avail.get(label, 0) + 1
    if not metrics_avail:
        raise AppInputError("None of these runs has logged metrics or recorded curves yet.")
    return metrics_avail


def pick_options(paths: list[str], metrics_avail: dict[str, int]) -> tuple[str, str, float, bool, bool]:
    """The row of controls: metric, grouping, smoothing, log y, each run."""
    order = sorted(metrics_avail, key=lambda m: (-metrics_avail[m], m))
    pref = next((m for m in ("loss", "val_loss") if m in metrics_avail), order[0])
    configs = [data.get_run(p).config for p in paths]
    groupings = analysis.differing_keys(configs) + ["kind", SAME_CONFIG, NO_GROUP]
    default_group = analysis.default_grouping(configs, [data.parent_of(p) for p in paths])

    c = st.columns([2, 2, 1, 1, 1])
    if st.session_state.get("cmp_metric") not in metrics_avail:
        st.session_state["cmp_metric"] = pref
    metric = c[0].selectbox("Metric", order, key="cmp_metric",
                            format_func=lambda m: f"{m}  ({metrics_avail[m]}/{len(paths)} runs)")
    if st.session_state.get("cmp_group") not in groupings:
        st.session_state["cmp_group"] = default_group
    group = c[1].selectbox("Group runs by (mean ± std within a group)", groupings, key="cmp_group")
    smooth = c[2].slider("Smoothing (EMA)", 0.0, 0.99, 0.0, 0.01, key="cmp_ema")
    log_y = c[3].toggle("log y", key="cmp_log")
    each = c[4].toggle("each run", key="cmp_each", help="Also draw every run's own curve")
    return metric, group, smooth, log_y, each


def grouped_curves(paths: list[str], metric: str, group: str, smooth: float) -> tuple[dict, list[str]]:
    """({group label: the smoothed curves of its runs}, ids of the runs without ``metric``)."""
    groups: dict[str, list[pd.Series]] = {}
    lacking = []
    labels = group_labels(paths, group)
    for p in paths:
        s = curve(p, metric)
        if s is None or s.empty:
            lacking.append(data.get_run(p).id)
            continue
        groups.setdefault(labels[p], []).append(analysis.ema(s, smooth).rename(p))
    if not groups:
        raise AppInputError(f"None of the chosen runs has {metric}.")
    return groups, lacking


def draw_bands(paths: list[str], groups: dict, metric: str, group: str, log_y: bool, each: bool) -> None:
    """Mean ± std per group (and every run's own curve if asked), with the figure download."""
    bands = {g: analysis.band(v) for g, v in sorted(groups.items())}
    if each:
        for g, curves in sorted(groups.items()):
            for s in curves:
                bands[f"{g} · {data.label(data.get_run(s.name).id)}"] = analysis.band([s])
    fig = plots.bands(bands, data.label(f"{metric} by {group}"), data.label(metric), log_y=log_y,
                      hline=reference(paths, metric))
    st.plotly_chart(fig, key="cmp-fig", config=plots.CONFIG)
    drops = [f"{g}: n falls from {a} to {b} at step {s}" for g, band in bands.items()
             for s, a, b in analysis.n_drops(band)]
    if drops:      # a band's mean jumps where one of its runs ends; say so under the plot
        st.caption("Fewer runs from a step on (the band's mean is over the runs that reached it): "
                   + data.esc("; ".join(drops[:8])) + (" …" if len(drops) > 8 else "") + ".")
    downloads.download(fig, "cmp-fig", f"compare-{metric}".replace("/", "_").replace(" ", "_")[:60],
                    FIGURES_FOR.get(metric, []), paths, {"metric": metric, "group": group})


def summary_table(groups: dict) -> None:
    """Per group: runs, final value (mean, std), minimum (mean), last step."""
    rows = []
    for g, curves in sorted(groups.items()):
        finals = np.array([s.iloc[-1] for s in curves])
        best = np.array([s.min() for s in curves])
        rows.append({"group": g, "runs": len(curves), "final (mean)": finals.mean(),
                     "final (std)": mean_std(finals)[1], "min (mean)": best.mean(),
                     "last step": int(max(s.index.max() for s in curves))})
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                 column_config={k: st.column_config.NumberColumn(k, format="%.5g")
                                for k in ("final (mean)", "final (std)", "min (mean)")})


def body() -> None:
    st.title("Compare")
    paths = pick_runs()
    if not paths:
        st.info("Choose at least one run.")
        return
    metrics_avail = available_metrics(paths)
    metric, group, smooth, log_y, each = pick_options(paths, metrics_avail)
    groups, lacking = grouped_curves(paths, metric, group, smooth)
    draw_bands(paths, groups, metric, group, log_y, each)
    if lacking:
        st.caption(f"Without {data.esc(metric)}: {data.esc(', '.join(lacking))}.")
    summary_table(groups)


ui.guard(body)
