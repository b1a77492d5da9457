"""Recorded array names and dimension names are public API: changing them breaks users."""
from dyntool.record import names

PINNED = {
    "step": ("step",),
    "attn": ("step", "layer", "head", "seq", "query", "key"),
    "scores": ("step", "layer", "head", "seq", "query", "key"),
    "compat": ("step", "layer", "head", "seq", "query", "key"),
    "advantage": ("step", "layer", "head", "seq", "query", "key"),
    "score_grad": ("step", "layer", "head", "seq", "query", "key"),
    "attn_pooled": ("step", "layer", "head", "seq", "query_block", "key_block"),
    "compat_pooled": ("step", "layer", "head", "seq", "query_block", "key_block"),
    "advantage_pooled": ("step", "layer", "head", "seq", "query_block", "key_block"),
    "score_grad_pooled": ("step", "layer", "head", "seq", "query_block", "key_block"),
    "upstream": ("step", "layer", "head", "seq", "query", "d_v"),
    "values": ("step", "layer", "head", "seq", "key", "d_v"),
    "queries": ("step", "layer", "head", "seq", "query", "d_k"),
    "keys": ("step", "layer", "head", "seq", "key", "d_k"),
    "value_grad": ("step", "layer", "head", "seq", "key", "d_v"),
    "query_grad": ("step", "layer", "head", "seq", "query", "d_k"),
    "key_grad": ("step", "layer", "head", "seq", "key", "d_k"),
    "expected_compat": ("step", "layer", "head", "seq", "query"),
    "attn_entropy": ("step", "layer", "head", "seq", "query"),
    "attn_entropy_norm": ("step", "layer", "head", "seq", "query"),
    "sink_mass": ("step", "layer", "head", "seq", "query"),
    "column_usage": ("step", "layer", "head", "seq", "key"),
    "value_norm": ("step", "layer", "head", "seq", "key"),
    "logit_max": ("step", "layer", "head"),
    "logit_norm": ("step", "layer", "head"),
    "routing_residual": ("step", "layer", "head"),
    "grad_scale": ("step",),
}


def test_recorded_names_are_pinned():
    assert set(names.RECORDED_NAMES) == set(PINNED)
    for name, dims in PINNED.items():
        assert names.dims(name) == dims, name


def test_quantities_produce_exactly_the_registered_names():
    import torch
    from dyntool.quantities import head_quantities
    q = torch.randn(1, 1, 3, 2)
    out = head_quantities(q, q, q, q, torch.ones(3, 3, dtype=torch.bool))
    unrecorded = set(out) - set(names.DIMS)
    assert not unrecorded
    assert set(names.DIMS) - set(out) == {"routing_residual", "grad_scale", "sink_mass",
                                           *names.POOLED.values()}
    with_sinks = head_quantities(q, q, q, q, torch.ones(3, 3, dtype=torch.bool), sinks=torch.zeros(1, 1, 1, 1))
    assert set(with_sinks) - set(out) == {"sink_mass"}
