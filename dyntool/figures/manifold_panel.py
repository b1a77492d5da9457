"""F6's summary panel: r(PC1, H_Bayes) on the training sequence and on the held-out sequence.

The F6 scatter shows the recorded values v_j of the TRAINING sequence (the recording holds no
held-out representations); the sticky sim logs the manifold metrics of :mod:`dyntool.manifold` on
HELD-OUT positions (``heldout_v_*`` for values, ``heldout_g_*`` for head outputs) at every recorded
step, and ``diag_r_pc1_entropy`` for the head outputs on the training sequence.  This panel puts the
four side by side, grouped by (representation, sequence), so a reader sees which positions each
number comes from.
"""
from __future__ import annotations

import numpy as np

from ..record import metric_names as mn
from . import style
from .common import diag, mean_std, metric

# (key in per-run rows, x-tick label): values / head outputs on the training / held-out sequence
GROUPS = (("train_v", "values\ntrain"), ("train_g", "outputs\ntrain"),
          ("heldout_v", "values\nheld-out"), ("heldout_g", "outputs\nheld-out"))
HELDOUT_KEYS = ("pc1_share", "r_pc1", "r_best", "r2_linear", "ordering_score")


def _last(run, name: str) -> tuple[int | None, float | None]:
    s, v = metric(run, name)
    ok = np.isfinite(v)
    return (int(s[ok][-1]), float(v[ok][-1])) if ok.any() else (None, None)


def heldout_row(run) -> dict:
    """The sim's last logged held-out manifold metrics of one run (missing ones omitted), and its
    training-sequence head-output r (``diag_r_pc1_entropy``)."""
    row = {}
    for tag in ("g", "v"):
        for k in HELDOUT_KEYS:
            step, val = _last(run, mn.sticky_manifold(tag, k))
            if val is not None:
                row[mn.sticky_manifold(tag, k)] = val
                row["heldout_step"] = step
    ds, dv = diag(run, "diag_r_pc1_entropy")
    if len(dv) and np.isfinite(dv).any():
        row["train_g_r_pc1"] = float(dv[np.isfinite(dv)][-1])
    return row


# group -> the per-run key of its r(PC1, H_Bayes)
R_KEYS = {"train_v": "r_pc1_entropy", "train_g": "train_g_r_pc1", "heldout_v": mn.sticky_manifold("v", "r_pc1"),
          "heldout_g": mn.sticky_manifold("g", "r_pc1")}


def groups(per_run: list[dict]) -> list[str]:
    """The groups some run has a number for (those :func:`draw` draws), in GROUPS order."""
    return [g for g, _ in GROUPS if any(p.get(R_KEYS[g]) is not None for p in per_run)]


def draw(bx, order: list[str], per_run: list[dict], arms: list[str]) -> list[str]:
    """r(PC1, H_Bayes) per seed (dots) and mean ± std (black), per group and arm; ``order``: the
    study's arms in colour order (:func:`dyntool.figures.common.arms_of`); returns the groups drawn."""
    keys = R_KEYS
    present = [(g, lab) for g, lab in GROUPS if g in groups(per_run)]
    w = 0.8 / max(len(arms), 1)
    for gi, (g, _) in enumerate(present):
        for k, arm in enumerate(arms):
            y = [p[keys[g]] for p in per_run if p["arm"] == arm and p.get(keys[g]) is not None]
            if not y:
                continue
            x0 = gi + (k - (len(arms) - 1) / 2) * w
            c = style.arm_color(arm, order.index(arm) if arm in order else k)
            bx.plot(np.full(len(y), x0) + np.linspace(-0.25, 0.25, len(y)) * w, y, "o", color=c, ms=2.5, mew=0)
            bx.errorbar(x0, np.mean(y), yerr=mean_std(y)[1], color="black", marker="_", ms=6, capsize=1.5, lw=0.8)
    n_train = sum(g.startswith("train") for g, _ in present)
    if 0 < n_train < len(present):
        bx.axvline(n_train - 0.5, color=style.REF_COLOR, lw=0.6, ls=":")
    bx.set_xticks(range(len(present)), [lab for _, lab in present], fontsize=5.5)
    bx.set_xlim(-0.6, len(present) - 0.4)
    for k, arm in enumerate(arms):
        bx.plot([], [], "o", color=style.arm_color(arm, order.index(arm) if arm in order else k), ms=3,
                label=style.arm_label(arm, short=True))
    bx.legend(loc="upper left", fontsize=6, handletextpad=0.1, borderaxespad=0.2)
    bx.set_ylabel("r(PC1, Bayes entropy)")
    bx.set_ylim(0, 1.02)
    return [g for g, _ in present]


def caption_numbers(per_run: list[dict], arms: list[str]) -> str:
    """Means over seeds, per arm: training values (PCA of this figure) and the held-out metrics."""
    def m(arm, key, fmt):
        v = [p[key] for p in per_run if p["arm"] == arm and p.get(key) is not None]
        return format(float(np.mean(v)), fmt) if v else None
    parts = []
    for a in arms:
        t = (f"{style.arm_label(a)}: training-sequence values PC1 {m(a, 'pc1_share', '.0%')}, "
             f"r = {m(a, 'r_pc1_entropy', '.2f')}")
        if m(a, "train_g_r_pc1", ".2f") is not None:
            t += f", training-sequence outputs r = {m(a, 'train_g_r_pc1', '.2f')}"
        g = lambda stat, fmt=".2f": m(a, mn.sticky_manifold("g", stat), fmt)    # noqa: E731
        if g("r_pc1") is not None:
            t += (f"; held-out outputs PC1 {g('pc1_share', '.0%')}, r = {g('r_pc1')}"
                  + (f", best r(PC1..5) {g('r_best')}" if g("r_best") else "")
                  + (f", linear R² {g('r2_linear')}" if g("r2_linear") else "")
                  + (f", ordering score {g('ordering_score')}" if g("ordering_score") else ""))
        if m(a, mn.sticky_manifold("v", "r_pc1"), ".2f") is not None:
            t += f"; held-out values r = {m(a, mn.sticky_manifold('v', 'r_pc1'), '.2f')}"
        parts.append(t)
    return " | ".join(parts)
