"""Non-dense attention (Longformer/LED bands, BigBird blocks, Reformer LSH and chunks) is refused in
one line naming the site and what the attention does, never recorded as if it were dense; BigBird
switched to its dense mode records (issue 47)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from dyntool.adapters import AdapterError, find_adapter  # noqa: E402

TINY = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=64)


def build(kind, **extra):
    cfg = getattr(transformers, kind + "Config")(**{**TINY, **extra})
    torch.manual_seed(0)
    return getattr(transformers, kind + "Model")(cfg)


@pytest.mark.parametrize("kind,extra,why", [
    ("Longformer", dict(attention_window=4), "banded attention"),
    ("BigBird", dict(attention_type="block_sparse", block_size=2, num_random_blocks=1), "block-sparse attention"),
    ("Reformer", dict(attn_layers=["lsh"], axial_pos_embds=False, num_hashes=1, lsh_attn_chunk_length=4,
                      attention_head_size=8, feed_forward_size=32, is_decoder=True), "LSH attention"),
])
def test_non_dense_attention_is_refused_in_one_line(kind, extra, why):
    try:
        model = build(kind, **extra)
    except Exception as e:                     # noqa: BLE001  a config this transformers cannot build
        pytest.skip(f"{kind} does not build offline from a tiny config here: {type(e).__name__}")
    with pytest.raises(AdapterError) as e:
        find_adapter(model)
    msg = str(e.value)
    assert "\n" not in msg and "non-dense attention" in msg and why in msg and "nothing recorded" in msg, msg


def test_dense_attention_beside_a_non_dense_one_does_not_hide_it():
    """BigBird-Pegasus: its decoder's attention goes through the registry, its encoder's is
    block-sparse; recording the decoder alone would leave the encoder out without a word."""
    cfg = transformers.BigBirdPegasusConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                            encoder_attention_heads=2, decoder_attention_heads=2,
                                            encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
                                            attention_type="block_sparse", block_size=2, num_random_blocks=1)
    torch.manual_seed(0)
    model = transformers.BigBirdPegasusModel(cfg)
    with pytest.raises(AdapterError, match="non-dense attention, block-sparse") as e:
        find_adapter(model)
    assert "encoder" in str(e.value) and "\n" not in str(e.value)


def test_bigbird_in_its_dense_mode_is_not_refused():
    model = build("BigBird", attention_type="original_full")
    assert find_adapter(model).name in ("dataflow", "hf", "sdpa")
