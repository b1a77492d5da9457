"""Stable names of structured metrics (``metrics.jsonl`` columns), formatted and parsed here only.

Array names live in :mod:`dyntool.record.names`; this module owns the *metric* columns that
carry a layer / head / head-group in their name, so writers (``train/recording.py``) and
readers (figures, app, studies, exports) can't drift apart.  Pinned by
``tests/unit/test_metric_names.py``.

Forms (``BASE`` is e.g. ``logit_max`` or ``attn_entropy``):

* ``BASE``                    model-level value
* ``BASE/L{l}``               one layer (e.g. max over its heads)
* ``BASE/L{l}H{h}``           one head
* ``BASE/L{l}/{group}``       one group of heads of a layer (``local`` / ``global``)
* ``grad_norm/{group}``       gradient norm of a parameter group (``emb``, ``L{l}.attn``, ...)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

LOGIT_MAX = "logit_max"          # max |τ q·k| over allowed pairs (train.logit_stat)
ATTN_ENTROPY = "attn_entropy"    # mean attention entropy of the recorded batch
GRAD_NORM = "grad_norm"          # gradient norm per parameter group
HEAD_GROUPS = ("local", "global")
# the cheap tier (dyntool.flight, formulas in dyntool.cheap_stats), one column per layer × head
SCORE_MAX = "score_max"                  # max s_ij the softmax sees (after soft-cap and bias)
EXPECTED_COMPAT = "expected_compat"      # mean over queries of E_α[b]_i = u_i·o_i
COMPAT_VAR = "compat_var"                # mean over queries of Var_α[b]_i
SCORE_GRAD_NORM = "score_grad_norm"      # ‖∂L/∂S‖_F per sequence, RMS over the batch
UPSTREAM_NORM = "upstream_norm"          # ‖U‖_F per sequence, RMS over the batch
VALUE_GRAD_NORM = "value_grad_norm"      # ‖αᵀU‖_F (the value update) per sequence, RMS over the batch
COLUMN_MAX = "column_max"                # max_j Σ_i α_ij / T, mean over the batch
COLUMN_ENTROPY = "column_entropy"        # entropy of the column usage Σ_i α_ij (normalised), mean
SINK_MASS = "sink_mass"                  # mean sink share (models with attention sinks)
CHEAP_TIER = (SCORE_MAX, LOGIT_MAX, ATTN_ENTROPY, EXPECTED_COMPAT, COMPAT_VAR, SCORE_GRAD_NORM,
              UPSTREAM_NORM, VALUE_GRAD_NORM, COLUMN_MAX, COLUMN_ENTROPY, SINK_MASS)

# Baselines beside the manifold metrics (dyntool.manifold.baseline_comparison).  A geometry metric
# ``{prefix}r2_linear`` etc. gets ``{prefix}r2_partial`` (partial R² beyond the baseline) and
# ``{prefix}ordering_null_mean`` / ``_p`` (permutation null of the ordering score); the baseline
# representation's own metrics are logged under its own prefix.
R2_PARTIAL = "r2_partial"
ORDERING_NULL_MEAN = "ordering_null_mean"
ORDERING_NULL_P = "ordering_null_p"
STICKY_BASELINE = "x"              # sticky chain: the raw input x_t at the held-out positions
BIJECTION_BASELINE = "pos_onehot"  # wind tunnel: a one-hot of the key position (H_Bayes is its function)
BIJECTION_NORMED_VALUES = "normed_values"  # wind tunnel, the authors' read-out: final normed state at value positions


def sticky_manifold(rep: str) -> str:
    """Prefix of the sticky study's held-out manifold metrics of a representation (``g``, ``v``, ``x``)."""
    return f"heldout_{rep}_"


def bijection_manifold(rep: str, l: int | None = None) -> str:
    """Prefix of the wind tunnel's manifold metrics: ``manifold/{rep}/L{l}/`` per layer, or
    ``manifold/{rep}/`` for a layer-free representation (the position one-hot baseline)."""
    return f"manifold/{rep}/" if l is None else f"manifold/{rep}/L{int(l)}/"

_BASE = r"(?P<base>[A-Za-z_][A-Za-z0-9_]*)"
_REGEX = {
    "layer": re.compile(_BASE + r"/L(?P<layer>\d+)$"),
    "head": re.compile(_BASE + r"/L(?P<layer>\d+)H(?P<head>\d+)$"),
    "group": re.compile(_BASE + r"/L(?P<layer>\d+)/(?P<group>" + "|".join(HEAD_GROUPS) + r")$"),
}


def layer(base: str, l: int) -> str:
    return f"{base}/L{int(l)}"


def head(base: str, l: int, h: int) -> str:
    return f"{base}/L{int(l)}H{int(h)}"


def group(base: str, l: int, grp: str) -> str:
    if grp not in HEAD_GROUPS:
        raise ValueError(f"head group must be one of {HEAD_GROUPS}, got {grp!r}")
    return f"{base}/L{int(l)}/{grp}"


def grad_norm(param_group: str) -> str:
    return f"{GRAD_NORM}/{param_group}"


@dataclass(frozen=True)
class MetricName:
    """A parsed structured metric name; ``kind`` is ``layer``, ``head`` or ``group``."""
    base: str
    kind: str
    layer: int
    head: int | None = None
    group: str | None = None

    def format(self) -> str:
        if self.kind == "head":
            return head(self.base, self.layer, self.head)
        if self.kind == "group":
            return group(self.base, self.layer, self.group)
        return layer(self.base, self.layer)


def parse(name: str) -> MetricName | None:
    """``logit_max/L2H3`` -> MetricName("logit_max", "head", 2, 3); None for unstructured names."""
    for kind, rx in _REGEX.items():
        m = rx.match(name)
        if m:
            g = m.groupdict()
            return MetricName(g["base"], kind, int(g["layer"]),
                              int(g["head"]) if g.get("head") else None, g.get("group"))
    return None


def regex(base: str, kind: str) -> re.Pattern:
    """Compiled pattern for one base and kind, groups as positional captures:
    layer -> (l,), head -> (l, h), group -> (l, group)."""
    tail = {"layer": r"/L(\d+)$", "head": r"/L(\d+)H(\d+)$",
            "group": r"/L(\d+)/(" + "|".join(HEAD_GROUPS) + r")$"}[kind]
    return re.compile("^" + re.escape(base) + tail)


def per_head(columns, base: str) -> dict[tuple[int, int], str]:
    """Columns ``base/L{l}H{h}`` -> {(l, h): column}."""
    out = {}
    for c in columns:
        p = parse(str(c))
        if p is not None and p.base == base and p.kind == "head":
            out[(p.layer, p.head)] = c
    return out


def per_layer(columns, base: str) -> dict[int, str]:
    """Columns ``base/L{l}`` -> {l: column}."""
    out = {}
    for c in columns:
        p = parse(str(c))
        if p is not None and p.base == base and p.kind == "layer":
            out[p.layer] = c
    return out
