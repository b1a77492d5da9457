"""Stable names of structured metrics (``metrics.jsonl`` columns), formatted and parsed here only.

Array names live in :mod:`dyntool.record.names`; this module owns the *metric* columns that
carry a layer or head in their name, so writers (``train/recording.py``) and
readers (figures, app, studies, exports) can't drift apart.  Pinned by
``tests/unit/test_metric_names.py``.

Forms (``BASE`` is e.g. ``logit_max`` or ``attn_entropy``):

* ``BASE``                    model-level value
* ``BASE/L{l}``               one layer (e.g. max over its heads)
* ``BASE/L{l}H{h}``           one head
* ``grad_norm/{group}``       gradient norm of a parameter group (``emb``, ``L{l}.attn``, ...)

Simulations add their own structured names, formatted here too: the wind tunnel's
``manifold/{rep}/L{l}/{stat}``, ``key_orth/{keys}/L{l}`` and ``heldout/{stat}``, the sticky study's
``heldout_{rep}_{stat}``.  ``tests/unit/test_metric_names.py`` scans the package for any of these
forms spelled by hand outside this module.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

LOGIT_MAX = "logit_max"          # max |τ q·k| over allowed pairs (train.logit_stat)
ATTN_ENTROPY = "attn_entropy"    # mean attention entropy of the recorded batch
GRAD_NORM = "grad_norm"          # gradient norm per parameter group
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


def sticky_manifold(rep: str, stat: str = "") -> str:
    """The sticky study's held-out manifold metric ``stat`` of a representation (``g``, ``v``, ``x``),
    or, without ``stat``, the prefix ``heldout_{rep}_`` they share."""
    return f"heldout_{rep}_{stat}"


def bijection_heldout(stat: str) -> str:
    """The wind tunnel's held-out evaluation ``heldout/{stat}`` (loss, entropy_mae_bits, excess_loss, ...)."""
    return f"heldout/{stat}"


MANIFOLD = "manifold"    # the wind tunnel's geometry metrics: manifold/{rep}/[L{l}/]{stat}


def bijection_manifold(rep: str, l: int | None = None, stat: str = "") -> str:
    """The wind tunnel's manifold metric ``stat`` of ``rep`` at layer ``l`` (``manifold/{rep}/L{l}/{stat}``),
    ``manifold/{rep}/{stat}`` for a layer-free representation (the position one-hot baseline);
    without ``stat`` the prefix they share."""
    return f"{MANIFOLD}/{rep}/{stat}" if l is None else f"{MANIFOLD}/{rep}/L{int(l)}/{stat}"


def is_bijection_manifold(name: str) -> bool:
    return name.startswith(MANIFOLD + "/")


# Key orthogonality per layer (dyntool.manifold.key_orthogonality): mean |cos| between the keys of the
# sequence's distinct key tokens (``ctx``), of the whole vocabulary E W_K (``vocab``) or of each key token
# fed alone at position 0 (``single``: Paper I's value at init); ``signed``: mean cos
KEY_ORTH = "key_orth"
KEY_SETS = ("ctx", "vocab", "single")      # the wind tunnel's key sets (dyntool/sims/bijection_analysis.py)


def key_orth(keys: str, l: int, signed: bool = False) -> str:
    if keys not in KEY_SETS:
        raise ValueError(f"key set must be one of {KEY_SETS}, got {keys!r}")
    return f"{KEY_ORTH}/{keys}{'_signed' if signed else ''}/L{int(l)}"


# the wind tunnel's attention-entropy summaries beside attn_entropy/L{l}: the uniform level, and the
# reduction of the last layer vs layer 0 and of the layer mean vs uniform (fractions)
ATTN_ENTROPY_UNIFORM = f"{ATTN_ENTROPY}/uniform"
ATTN_ENTROPY_REDUCTION_LAST = f"{ATTN_ENTROPY}/reduction_last_vs_L0"
ATTN_ENTROPY_REDUCTION_MEAN = f"{ATTN_ENTROPY}/reduction_mean_vs_uniform"


# in-context Markov chains (dyntool.sims.icl_markov): KL(strategy ‖ model) on held-out chains
# (``kl/{strategy}``), the held-out loss (``icl_heldout/{stat}``), and the attention scores per head
# (``prev_token_score/L{l}H{h}``, ``induction_score/L{l}H{h}``)
ICL_KL = "kl"
ICL_SCORES = ("prev_token", "induction")


def icl_kl(strategy: str) -> str:
    return f"{ICL_KL}/{strategy}"


def icl_heldout(stat: str) -> str:
    return f"icl_heldout/{stat}"


def icl_score(name: str) -> str:
    """The metric base of an attention score (``prev_token`` or ``induction``), per head via :func:`head`."""
    if name not in ICL_SCORES:
        raise ValueError(f"attention score must be one of {ICL_SCORES}, got {name!r}")
    return f"{name}_score"


_BASE = r"(?P<base>[A-Za-z_][A-Za-z0-9_]*)"
_REGEX = {
    "layer": re.compile(_BASE + r"/L(?P<layer>\d+)$"),
    "head": re.compile(_BASE + r"/L(?P<layer>\d+)H(?P<head>\d+)$"),
}


def layer(base: str, l: int) -> str:
    return f"{base}/L{int(l)}"


def head(base: str, l: int, h: int) -> str:
    return f"{base}/L{int(l)}H{int(h)}"


def grad_norm(param_group: str) -> str:
    return f"{GRAD_NORM}/{param_group}"


@dataclass(frozen=True)
class MetricName:
    """A parsed structured metric name; ``kind`` is ``layer`` or ``head``."""
    base: str
    kind: str
    layer: int
    head: int | None = None

    def format(self) -> str:
        if self.kind == "head":
            return head(self.base, self.layer, self.head)
        return layer(self.base, self.layer)


def parse(name: str) -> MetricName | None:
    """``logit_max/L2H3`` -> MetricName("logit_max", "head", 2, 3); None for unstructured names."""
    for kind, rx in _REGEX.items():
        m = rx.match(name)
        if m:
            g = m.groupdict()
            return MetricName(g["base"], kind, int(g["layer"]), int(g["head"]) if g.get("head") else None)
    return None


def regex(base: str, kind: str) -> re.Pattern:
    """Compiled pattern for one base and kind, groups as positional captures:
    layer -> (l,), head -> (l, h)."""
    tail = {"layer": r"/L(\d+)$", "head": r"/L(\d+)H(\d+)$"}[kind]
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
