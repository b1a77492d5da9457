"""Gradient-dynamics figures from a toy run (arXiv 2512.22473: toy simulation, figures F1–F2).

* ``f1_feedback_loop`` — the routing / value-update loop of arXiv 2512.22473 drawn from one recorded step of a real toy run: routing
  (advantage signs, α), the value update as the α-weighted sum of error signals (it lands on the
  recorded next value), and the resulting change in compatibility.
* ``f2_toy`` — α and B at init / mid / final, 2-D value trajectories, loss and attention entropy.
"""
from __future__ import annotations

import numpy as np

from ..record import metric_names as mn
from . import style
from .common import array, metric, need
from .registry import figure

TOY_NEEDS = ("attn", "compat", "values")


def _toy_run(runs):
    return runs[0]


def _labels(run, T: int) -> list[int]:
    cfg = (run.config or {}).get("model", {})
    labels = cfg.get("labels") or (run.store.attrs.get("labels") if run.store is not None else None)
    return list(labels) if labels and len(labels) == T else [0] * T


def _head(arr, idx=slice(None)) -> np.ndarray:
    """Layer 0, head 0, seq 0 of a recorded per-head array (all or some steps)."""
    return np.asarray(arr[idx, 0, 0, 0], dtype=np.float64)


def _check_toy(runs, names=TOY_NEEDS):
    r = _toy_run(runs)
    missing = [n for n in names if array(r, n) is None]
    need(not missing, f"toy run {r.id} lacks recorded {', '.join(missing)}")
    need(len(metric(r, "loss")[0]) > 0, f"toy run {r.id} has no 'loss' metric")
    a = array(r, "values")
    need(a.shape[-1] == 2, f"toy run {r.id}: values are {a.shape[-1]}-D; these panels need d_v = 2")
    return True, ""


def _key_steps(run) -> tuple[np.ndarray, int, int, int]:
    """Recorded steps and the indices of init, mid (half the loss drop) and final."""
    steps = run.steps
    s, loss = metric(run, "loss")
    i_last = len(steps) - 1
    mid = i_last // 2
    if len(s) > 1 and np.isfinite(loss).all():
        half = 0.5 * (loss[0] + loss[-1])
        hit = np.nonzero(loss <= half)[0]
        if len(hit):
            mid = int(np.clip(np.searchsorted(steps, s[hit[0]]), 1, max(i_last - 1, 1)))
    return steps, 0, mid, i_last


def _dominant_class(attn_final: np.ndarray, labels: list[int]) -> np.ndarray:
    """Per value j: the class whose queries put the most attention mass on it."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    mass = np.stack([attn_final[labels == c].sum(0) for c in classes])     # (C, keys)
    return classes[mass.argmax(0)]


def _label_points(ax, pts: np.ndarray, names: list[str], color=None) -> None:
    """Label 2-D points; points that (nearly) coincide share a label.  Each label sits beside its
    point, on the side away from the nearest other point (else from the centroid), on a pale box so
    a trajectory crossing it leaves it readable."""
    close = 0.06 * (float(np.ptp(pts, axis=0).max()) or 1.0)
    done = set()
    for k in range(len(pts)):
        if k in done:
            continue
        group = [m for m in range(len(pts)) if m not in done and np.linalg.norm(pts[m] - pts[k]) < close]
        done.update(group)
        others = [m for m in range(len(pts)) if m not in group]
        ref = pts[min(others, key=lambda m: np.linalg.norm(pts[m] - pts[k]))] if others else pts.mean(0)
        d = pts[k] - ref
        d = d / (np.linalg.norm(d) or 1.0)
        right = d[0] >= 0                     # beside the point: the equal-aspect panel has room sideways
        ax.annotate(",".join(names[m] for m in group), pts[k], textcoords="offset points",
                    xytext=(6 if right else -6, 0), fontsize=7, zorder=5,
                    ha="left" if right else "right", va="center",
                    color=color[k] if color is not None else "black",
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.75))


def _ticks(ax, labels):
    """Integer ticks on both axes, each label coloured by its position's class."""
    T = len(labels)
    ax.set_xticks(range(T), [str(j) for j in range(T)])
    ax.set_yticks(range(T), [str(j) for j in range(T)])
    for texts in (ax.get_xticklabels(), ax.get_yticklabels()):
        for j, t in enumerate(texts):
            t.set_color(style.CLASS_COLORS[labels[j] % len(style.CLASS_COLORS)])


# ------------------------------------------------------------------------------------------------
# F2
# ------------------------------------------------------------------------------------------------

@figure("f2_toy", "Coupled specialisation in a T = 5 head", "toy",
        needs="a toy run recording attn, compat, values (d_v = 2) and the loss metric",
        group="dynamics", check=_check_toy)
def f2_toy(runs, **opts):
    data = _f2_data(runs)
    return _f2_draw(data), data, _f2_caption(data)


F2_NAMES = ("init", "mid", "final")


def _f2_data(runs) -> dict:
    """α and B at init / mid (half the loss drop) / final, the value trajectories, loss and
    attention entropy of the toy run, as recorded."""
    run = _toy_run(runs)
    steps, i0, im, i1 = _key_steps(run)
    idx = [i0, im, i1]
    alpha = _head(array(run, "attn"), idx)                 # (3, T, T)
    compat = _head(array(run, "compat"), idx)
    vals = _head(array(run, "values"))                     # (S, T, 2)
    labels = _labels(run, alpha.shape[-1])
    s_loss, loss = metric(run, "loss")
    s_ent, ent = metric(run, mn.ATTN_ENTROPY)
    # B = u·v shrinks with the error signal u (→ 0 as the loss does), so one colour range for all
    # three panels leaves the last one blank: show each row divided by its largest |b_ij| (the
    # sign pattern the routing gradient acts on) and print the scale per panel.
    row_max = np.nanmax(np.abs(compat), axis=-1, keepdims=True)                 # (3, T, 1)
    compat_rn = np.divide(compat, row_max, out=np.zeros_like(compat), where=row_max > 0)
    names = list(F2_NAMES)
    return {
        "run": run.id, "labels": labels,
        "steps": {n: int(steps[k]) for n, k in zip(names, idx)},
        "attn": {n: alpha[c].tolist() for c, n in enumerate(names)},
        "compat": {n: compat[c].tolist() for c, n in enumerate(names)},
        "compat_row_normalised": {n: compat_rn[c].tolist() for c, n in enumerate(names)},
        "compat_max_abs": dict(zip(names, [float(np.nanmax(np.abs(compat[c]))) for c in range(3)])),
        "dominant_class": [int(x) for x in _dominant_class(alpha[-1], labels)],
        "values": {"step": steps[: len(vals)].tolist(), "v": vals.tolist()},
        "loss": {"step": s_loss.tolist(), "loss": loss.tolist()},
        "attn_entropy": {"step": s_ent.tolist(), "entropy": ent.tolist()},
    }


def _f2_draw(data: dict):
    labels = data["labels"]
    fig = style.figure(style.DOUBLE, 3.5)
    gs = fig.add_gridspec(2, 6, width_ratios=[1, 1, 1, 0.08, 0.22, 1.45])
    for c, name in enumerate(F2_NAMES):
        ax = fig.add_subplot(gs[0, c])
        im_a = ax.imshow(np.asarray(data["attn"][name]), vmin=0, vmax=1, cmap=style.SEQ_CMAP)
        ax.set_title(f"α, {name} (step {data['steps'][name]})")
        ax.set_xlabel("key j")
        _ticks(ax, labels)
        ax2 = fig.add_subplot(gs[1, c])
        im_b = ax2.imshow(np.asarray(data["compat_row_normalised"][name]), vmin=-1, vmax=1, cmap=style.DIV_CMAP)
        ax2.set_title(f"B / row max, {name}\n|b| ≤ {data['compat_max_abs'][name]:.0e}", fontsize=6.5)
        ax2.set_xlabel("key j")
        _ticks(ax2, labels)
        if c == 0:
            ax.set_ylabel("query i")
            ax2.set_ylabel("query i")
            style.panel_label(ax, "a")
            style.panel_label(ax2, "b")
    fig.colorbar(im_a, cax=fig.add_subplot(gs[0, 3]), label="α")
    fig.colorbar(im_b, cax=fig.add_subplot(gs[1, 3]), label="b_ij / max_j |b_ij|")
    _f2_values(fig.add_subplot(gs[0, 5]), np.asarray(data["values"]["v"]), data["dominant_class"])
    _f2_loss(fig.add_subplot(gs[1, 5]), data)
    return fig


def _f2_values(ax, vals: np.ndarray, dom: list[int]) -> None:
    """(c) the value trajectories, coloured by the class that uses each value most at the end."""
    T = vals.shape[1]
    for j in range(T):
        col = style.CLASS_COLORS[int(dom[j]) % len(style.CLASS_COLORS)]
        ax.plot(vals[:, j, 0], vals[:, j, 1], color=col, lw=1.0)
        ax.plot(*vals[0, j], "o", mfc="white", mec=col, ms=3.5)
        ax.plot(*vals[-1, j], "o", color=col, ms=4.5)
    ax.set_xlabel("value dim 1")
    ax.set_ylabel("value dim 2")
    _label_points(ax, vals[-1], [f"v{j}" for j in range(T)],
                  [style.CLASS_COLORS[int(dom[j]) % len(style.CLASS_COLORS)] for j in range(T)])
    ax.set_title("value trajectories v_j(t)")
    ax.margins(0.2, 0.15)            # room inside the axes for the labels beside the outermost points
    ax.set_aspect("equal", adjustable="datalim")
    style.panel_label(ax, "c")


def _f2_loss(ax, data: dict) -> None:
    """(d) the loss (log scale) and the mean attention entropy, with the three shown steps."""
    ax.plot(data["loss"]["step"], data["loss"]["loss"], color=style.OKABE_ITO["black"], label="loss")
    ax.set_yscale("log")
    style.plain_log(ax)
    ax.set_xlabel(f"{style.STEP} [steps]")
    ax.set_ylabel(style.LOSS)
    for name in F2_NAMES:
        ax.axvline(data["steps"][name], color=style.REF_COLOR, lw=0.5, ls=":")
    ent = data["attn_entropy"]
    if len(ent["step"]):
        tw = ax.twinx()
        tw.plot(ent["step"], ent["entropy"], color=style.OKABE_ITO["orange"], ls="--", label="mean attention entropy")
        tw.set_ylabel("attention entropy [nats]", color=style.OKABE_ITO["orange"])
        tw.spines["right"].set_visible(True)
        tw.set_ylim(bottom=0)
        ax.plot([], [], color=style.OKABE_ITO["orange"], ls="--", label="entropy")    # its axis says whose
    # above the panel: inside, a legend as wide as this narrow panel always covers a curve
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=6, handlelength=1.6,
              columnspacing=0.8, borderaxespad=0.2)
    style.panel_label(ax, "d")


def _f2_caption(data: dict) -> str:
    labels, st, scale, loss = data["labels"], data["steps"], data["compat_max_abs"], data["loss"]["loss"]
    return (f"Toy head (T = {len(labels)}, labels {labels}; run {data['run']}). (a) attention α and (b) compatibility "
            f"B = [u_i·v_j], each row divided by its largest |b_ij| (B itself shrinks with the error signal: "
            f"max |b| = {scale['init']:.2g}, {scale['mid']:.2g}, {scale['final']:.2g}) at steps {st['init']}, "
            f"{st['mid']} (half the loss drop) and "
            f"{st['final']}; tick colours give each position's class. (c) value trajectories in R², "
            f"coloured by the class whose queries use the value most at the end (open: start). "
            f"(d) loss (log scale, from {loss[0]:.3f} to {loss[-1]:.4f} nats) and mean attention entropy.")


# ------------------------------------------------------------------------------------------------
# F1
# ------------------------------------------------------------------------------------------------

def _check_f1(runs):
    _check_toy(runs, ("attn", "values", "upstream", "advantage"))
    need(len(_toy_run(runs).steps) >= 3, "the toy run has fewer than 3 recorded steps")
    return True, ""


@figure("f1_feedback_loop", "The routing–content feedback loop, from a real toy step", "toy",
        needs="a toy run recording attn, advantage, upstream and values (d_v = 2) at consecutive steps",
        group="dynamics", check=_check_f1)
def f1_feedback_loop(runs, **opts):
    data = _f1_data(runs, opts.get("step_index"))
    return _f1_draw(data), data, _f1_caption(data)


def _f1_data(runs, step_index=None) -> dict:
    """One recorded step t of the toy run (default: just before half the loss drop) and the next:
    the query with the strongest routing drive, the value it routes more to, the per-query pulls on
    that value, their sum against the recorded update, and the first-order change of its scores."""
    run = _toy_run(runs)
    steps, _, im, _ = _key_steps(run)
    t = int(step_index if step_index is not None else min(im, len(steps) - 2))
    lr = float((run.config or {}).get("lr", 0.5))
    a = _head(array(run, "attn"), t)                      # (T, T)
    adv = _head(array(run, "advantage"), t)
    u = _head(array(run, "upstream"), t)                  # (T, 2)
    V = _head(array(run, "values"), [t, t + 1])           # (2, T, 2)
    v, v_next = V[0], V[1]
    g = a @ v                                             # contexts g_i
    drive = (a * np.abs(adv)).sum(1)
    i_star = int(drive.argmax())                          # the query with the strongest routing drive
    j_star = int((a[i_star] * adv[i_star]).argmax())      # the value it routes more to
    contrib = -lr * a[:, j_star, None] * u                # per-query pull on v_j*: −η α_ij u_i
    dv_pred = contrib.sum(0)
    dv_rec = v_next[j_star] - v[j_star]
    db = u @ dv_rec                                       # first-order Δb_i'j* = u_i'·Δv_j*
    span = float(np.ptp(np.concatenate([v, g]), axis=0).max()) or 1.0
    err = float(np.linalg.norm(dv_pred - dv_rec) / (np.linalg.norm(dv_rec) or 1.0))
    return {"run": run.id, "step": int(steps[t]), "next_step": int(steps[t + 1]), "lr": lr,
            "query": i_star, "value": j_star, "labels": _labels(run, a.shape[0]), "values": v.tolist(),
            "values_next": v_next.tolist(), "contexts": g.tolist(), "upstream": u.tolist(),
            "attn": a.tolist(), "advantage": adv.tolist(), "contributions": contrib.tolist(),
            "dv_predicted": dv_pred.tolist(), "dv_recorded": dv_rec.tolist(), "dv_rel_error": err,
            "delta_compat": db.tolist(),
            "arrow_scale_u": 0.35 * span / (np.linalg.norm(u, axis=1).max() or 1.0),
            "arrow_scale_dv": 1.0 / (np.linalg.norm(dv_pred) or 1.0)}   # panel (b) is zoomed on v_j*: unit length


def _f1_draw(data: dict):
    d = {k: np.asarray(data[k]) for k in ("attn", "values", "contexts", "upstream", "advantage",
                                          "contributions", "dv_recorded", "delta_compat")}
    labels = data["labels"]
    ccol = [style.CLASS_COLORS[c % len(style.CLASS_COLORS)] for c in labels]      # queries: own class
    users = _dominant_class(d["attn"], labels)
    vcol = [style.CLASS_COLORS[int(c) % len(style.CLASS_COLORS)] for c in users]  # values: users' class
    fig = style.figure(style.DOUBLE, 2.6)
    axs = fig.subplots(1, 3, width_ratios=[1.2, 1.2, 0.9])
    _f1_routing(axs[0], data, d, vcol)
    _f1_pulls(axs[1], data, d, ccol, vcol)
    _f1_compat(axs[2], data, d["delta_compat"], ccol)
    return fig


def _f1_routing(ax, data: dict, d: dict, vcol: list) -> None:
    """(a) query i*'s context, its error signal and its lines to every value (colour: sign of A)."""
    a, adv, v, g, u = d["attn"], d["advantage"], d["values"], d["contexts"], d["upstream"]
    i_star, k_u, T = data["query"], data["arrow_scale_u"], len(v)
    pos, neg = style.OKABE_ITO["blue"], style.OKABE_ITO["vermillion"]
    for j in range(T):
        A_ij = adv[i_star, j]
        ax.plot([g[i_star, 0], v[j, 0]], [g[i_star, 1], v[j, 1]], color=pos if A_ij > 0 else neg,
                lw=0.5 + 4 * a[i_star, j], alpha=0.8, zorder=1)
    ax.scatter(v[:, 0], v[:, 1], c=vcol, s=22, zorder=3)
    _label_points(ax, v, [f"v{j}" for j in range(T)])
    ax.plot(*g[i_star], marker="*", color="black", ms=8, zorder=4, ls="none", label=f"context g_{i_star}")
    tip = g[i_star] - k_u * u[i_star]
    ax.annotate("", tip, g[i_star], arrowprops=dict(arrowstyle="-|>", color="black", lw=1.2), annotation_clip=False)
    ax.plot(*tip, alpha=0)                               # keep the arrow inside the data limits
    ax.plot([], [], color="black", label=f"−u_{i_star}, error signal (×{k_u:.2g})")
    ax.plot([], [], color=pos, lw=2, label="A > 0: route more")
    ax.plot([], [], color=neg, lw=2, label="A < 0: route less")
    ax.set_title(f"routing of query {i_star} (width ∝ α)")
    style.panel_label(ax, "a")
    ax.set_xlabel("value dim 1")
    ax.set_ylabel("value dim 2")
    ax.set_aspect("equal", adjustable="datalim")
    ax.legend(loc="best", fontsize=6)


def _f1_pulls(ax, data: dict, d: dict, ccol: list, vcol: list) -> None:
    """(b) the per-query pulls on v_j* chained tip to tail, beside the recorded update."""
    a, v, contrib, dv_rec = d["attn"], d["values"], d["contributions"], d["dv_recorded"]
    j_star, k_v = data["value"], data["arrow_scale_dv"]
    p = v[j_star].copy()
    tips = [p]
    for i in np.argsort(-a[:, j_star]):
        q = p + k_v * contrib[i]
        ax.annotate("", q, p, arrowprops=dict(arrowstyle="-|>", color=ccol[i], lw=0.9, shrinkA=0, shrinkB=0),
                    annotation_clip=False)
        if a[i, j_star] > 0.1:
            ax.annotate(f"q{i}", 0.5 * (p + q), fontsize=6, color=ccol[i], textcoords="offset points",
                        xytext=(3, -3))
        p = q
        tips.append(q)
    rec_tip = v[j_star] + k_v * dv_rec
    ax.annotate("", rec_tip, v[j_star], annotation_clip=False,
                arrowprops=dict(arrowstyle="-|>", color="black", lw=2.0, alpha=0.35, shrinkA=0, shrinkB=0))
    tips = np.array(tips + [rec_tip])
    ax.plot(tips[:, 0], tips[:, 1], alpha=0)
    ax.plot(*v[j_star], "o", color=vcol[j_star], ms=6, zorder=4)
    ax.annotate(f"v{j_star}", v[j_star], textcoords="offset points", xytext=(-12, 3), fontsize=7)
    ax.plot([], [], color="black", alpha=0.35, lw=2.0, label=f"recorded Δv_{j_star} (×{k_v:.2g})")
    ax.plot([], [], color=style.REF_COLOR, lw=0.9, label="−η α_ij u_i, per query i")
    ax.set_title(f"value {j_star} pulled toward its users")
    style.panel_label(ax, "b")
    ax.set_xticks([]), ax.set_yticks([])
    ax.set_xlabel(f"zoom on v{j_star}; arrows ×{k_v:.2g}")
    ax.set_aspect("equal", adjustable="datalim")
    # the arrows run along a diagonal from v_j*: put the legend in a corner off that diagonal
    ax.legend(loc="upper left" if dv_rec[0] * dv_rec[1] > 0 else "upper right", fontsize=6)


def _f1_compat(ax, data: dict, db: np.ndarray, ccol: list) -> None:
    """(c) the first-order change of b_i'j* per query."""
    j_star, T = data["value"], len(db)
    e = int(np.floor(np.log10(np.abs(db).max()))) if np.abs(db).max() > 0 else 0
    ax.bar(range(T), db / 10.0 ** e, color=ccol)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(T))
    ax.set_xlabel("query i' (colour: its class)")
    ax.set_ylabel(f"Δb_i'{j_star} = u_i'·Δv_{j_star}" + (rf"  [$\times10^{{{e}}}$]" if e else ""))
    ax.set_title("compatibility change")
    style.panel_label(ax, "c")


def _f1_caption(data: dict) -> str:
    i_star, j_star = data["query"], data["value"]
    return (f"The feedback loop at step {data['step']} of toy run {data['run']} (real vectors; colours = class). "
            f"(a) query {i_star}'s context g (star), its error signal −u (arrow) and lines to each value, "
            f"blue where the advantage A = E_α[b] − b is positive (gradient descent raises those scores), "
            f"width ∝ α. (b) the per-query pulls −η α_i{j_star} u_i (η = {data['lr']:g}) chained tip to tail; "
            f"they add up to the recorded update of v{j_star} (grey; relative mismatch {data['dv_rel_error']:.1e}). "
            f"(c) the resulting first-order change of b_i'{j_star}: negative where value {j_star} became "
            f"more useful, which raises those queries' advantage and closes the loop. "
            f"Arrows scaled for visibility.")
