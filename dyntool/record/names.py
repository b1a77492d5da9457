"""Stable public names of recorded arrays and their dimension names.

These names are public API (pinned by ``tests/unit/test_names.py``): the app, the figures and
users' notebooks read them.  Formulas live in :mod:`dyntool.quantities`.
"""
from __future__ import annotations

HEAD = ("layer", "head", "seq")

# name -> dimension names (after the leading "step" axis)
DIMS: dict[str, tuple[str, ...]] = {
    # T × T matrices (optionally restricted to a query/key crop)
    "attn": HEAD + ("query", "key"),
    "scores": HEAD + ("query", "key"),
    "compat": HEAD + ("query", "key"),
    "advantage": HEAD + ("query", "key"),
    "score_grad": HEAD + ("query", "key"),
    # block-pooled overviews of the full matrices (only when record.pool > 0)
    "attn_pooled": HEAD + ("query_block", "key_block"),
    "compat_pooled": HEAD + ("query_block", "key_block"),
    "advantage_pooled": HEAD + ("query_block", "key_block"),
    "score_grad_pooled": HEAD + ("query_block", "key_block"),
    # per-position vectors
    "upstream": HEAD + ("query", "d_v"),
    "values": HEAD + ("key", "d_v"),
    "queries": HEAD + ("query", "d_k"),
    "keys": HEAD + ("key", "d_k"),
    "value_grad": HEAD + ("key", "d_v"),
    "query_grad": HEAD + ("query", "d_k"),
    "key_grad": HEAD + ("key", "d_k"),
    # per-query / per-key scalars
    "expected_compat": HEAD + ("query",),
    "attn_entropy": HEAD + ("query",),
    "attn_entropy_norm": HEAD + ("query",),
    "sink_mass": HEAD + ("query",),          # models with attention sinks only
    "column_usage": HEAD + ("key",),
    "value_norm": HEAD + ("key",),
    # per-head scalars
    "logit_max": ("layer", "head"),
    "logit_norm": ("layer", "head"),
    "routing_residual": ("layer", "head"),
    # per-step scalars
    "grad_scale": (),
}

MATRICES = ("attn", "scores", "compat", "advantage", "score_grad")
POOLED = {m: f"{m}_pooled" for m in ("attn", "compat", "advantage", "score_grad")}
# gradient quantities: stored in record.grad_dtype (float32 by default), the rest in record.dtype
GRADIENTS = ("compat", "advantage", "score_grad", "upstream", "value_grad", "query_grad", "key_grad",
             "expected_compat")
# always kept in float32 whatever the storage dtype: small, and precision matters for curves
FLOAT32_ALWAYS = ("logit_max", "logit_norm", "routing_residual", "grad_scale")

# The array holding the training step of each recorded index
STEP = "step"

RECORDED_NAMES = (STEP,) + tuple(DIMS)


def dims(name: str) -> tuple[str, ...]:
    """Full dimension names of a recorded array, including the leading ``step``.

    Arrays not in the registry (e.g. a simulation's extra diagnostics ``diag_*``) are per-step
    scalars unless the writer declares otherwise.
    """
    if name == STEP:
        return (STEP,)
    return (STEP,) + DIMS.get(name, ())
