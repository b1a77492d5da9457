"""The full tier streamed (dyntool.stream) equals the dense ``Capture.compute()`` of the same step.

The independent computation is ``Capture.compute()`` (every head at once, itself checked
against autograd in tests/adapters); the streamed path runs ``head_quantities`` on row blocks
of one head at a time and sums the column quantities over blocks.  Every stored value must
agree in float64 to 1e-9 for the selected heads, the crop must be the dense matrices' sub-block,
and every entry the writer gets must be written exactly once."""
from __future__ import annotations

import pytest
import torch

from dyntool.capture import Capture
from dyntool.errors import ConfigError
from dyntool.record import names
from dyntool.record.pooling import pool_blocks
from dyntool.record.selection import Selection, model_head, model_layer, parse_heads, resolve
from dyntool.stream import CPU_BLOCK_ENTRIES, LIVE, PAD, heads_per_block, rows_per_block, size, stream
from tests.unit.test_flight import batch, gpt, gpt_loss

UNSET = float("inf")          # a sentinel no quantity takes: an entry never written stays inf


# ------------------------------------------------------------------ the selector parser
def test_parse_heads():
    assert parse_heads("all") is None and parse_heads(" ALL ") is None
    assert parse_heads("L0H3,L5H*, L*H0") == [(0, 3), (5, None), (None, 0)]
    for bad in ("L0", "H3", "L0H3;L1H2", "l0h3", "L-1H0", "L0H3,foo"):
        with pytest.raises(ConfigError, match=r"record\.heads: unknown head selector"):
            parse_heads(bad)
    for empty in ("", " , ,"):
        with pytest.raises(ConfigError, match="empty head selection"):
            parse_heads(empty)


def test_resolve_and_layout():
    sel = resolve("L2H1,L0H3,L2H*,L0H3", 3, 4)
    assert sel.layers == (0, 2) and sel.heads == ((3,), (0, 1, 2, 3)) and sel.slots == 4
    assert sel.attrs() == {"layers": [0, 2], "heads": [[3, -1, -1, -1], [0, 1, 2, 3]]}
    assert not sel.everything and resolve("L*H*", 3, 4).everything and resolve("all", 3, 4).everything
    assert resolve("L*H0", 3, 4).heads == ((0,), (0,), (0,))
    at = sel.attrs()
    assert [model_layer(at, i) for i in (0, 1)] == [0, 2] and model_head(at, 0, 0) == 3
    assert model_head(at, 0, 1) == -1 and model_layer({}, 5) == 5 and model_head(None, 1, 2) == 2
    with pytest.raises(ConfigError, match="L3: the model has layers 0..2"):
        resolve("L3H0", 3, 4)
    with pytest.raises(ConfigError, match="H4: the model has heads 0..3"):
        resolve("L*H4", 3, 4)


# ------------------------------------------------------------------ streamed == dense
def streamed(cap, sel: Selection, rows: int, crop=None, pool: int = 0, max_block_mib=None):
    """Run :func:`stream`, assembling the emitted blocks; every cell written exactly once."""
    N = size(cap)
    S = next(iter(cap.slots.values())).q.shape[0]
    lo, hi = crop or (0, N)
    mats = {m: torch.full((len(sel.layers), sel.slots, S, hi - lo, N), UNSET, dtype=torch.float64)
            for m in names.MATRICES}

    def emit(li, si, r0, r1, blocks):
        assert lo <= r0 < r1 <= hi
        for m, x in blocks.items():
            cell = mats[m][li, si, :, r0 - lo:r1 - lo]
            assert x.shape == cell.shape and (cell == UNSET).all(), (m, li, si, r0, r1)
            cell.copy_(x)
    small = stream(cap, sel, emit, rows=rows, crop=crop, pool=pool, max_block_mib=max_block_mib)
    for m, x in mats.items():
        assert not (x == UNSET).any(), f"{m}: entries never written"
    return mats, small


def assert_matches(dense, mats, small, sel, crop=None):
    lo, hi = crop or (0, dense["attn"].shape[-2])
    assert set(small) == set(dense) - set(names.MATRICES)
    for li, layer in enumerate(sel.layers):
        for si in range(sel.slots):
            if si >= len(sel.heads[li]):                 # an empty slot: padding
                for m in mats:
                    assert torch.equal(mats[m][li, si], torch.full_like(mats[m][li, si], PAD[m])) or \
                        (m == "scores" and mats[m][li, si].isnan().all()), m
                for n, x in small.items():
                    assert x[li, si].isnan().all(), n
                continue
            h = sel.heads[li][si]
            for n, x in small.items():
                torch.testing.assert_close(x[li, si], dense[n][layer, h], rtol=1e-9, atol=1e-12, equal_nan=True,
                                           msg=f"{n} L{layer}H{h}")
            for m, x in mats.items():
                torch.testing.assert_close(x[li, si], dense[m][layer, h][..., lo:hi, :], rtol=1e-9, atol=1e-12,
                                           equal_nan=True, msg=f"{m} L{layer}H{h}")


def captured(model, loss, **kw):
    with Capture(model, **kw) as cap:
        loss(model).backward()
    model.zero_grad()
    return cap, cap.compute(dtype=torch.float64)


@pytest.mark.parametrize("attention,kw", [("mhsa", dict(backend="manual")),        # + routing_residual
                                          ("ls", dict(n_local=3, n_global=1, window=4)),
                                          ("span", {})])                           # applied dQ/dK
def test_dyntool_gpt_streamed_equals_dense(attention, kw):
    m = gpt(attention, **kw)
    cap, dense = captured(m, gpt_loss(*batch()), grad_scale=0.5)
    assert float(dense["logit_max"].max()) > 5.0
    for spec, rows, crop in (("all", 3, None), ("L1H2,L0H*", 5, (3, 11)), ("L*H0", 16, (0, 1))):
        sel = resolve(spec, 2, 4)
        mats, small = streamed(cap, sel, rows, crop)
        assert_matches(dense, mats, small, sel, crop)
    if kw.get("backend") == "manual":
        assert "routing_residual" in small


def test_streamed_blocks_read_the_mask_once_per_layer(monkeypatch):
    """Every block's key range and the logit-norm counts stay on the device: one host read per
    layer (the key ranges), not one per head nor a nonzero/int/any/sum read per block (each a sync
    on a GPU), whether the heads go one at a time or together."""
    m = gpt("ls", n_local=3, n_global=1, window=4)
    cap, dense = captured(m, gpt_loss(*batch()), grad_scale=0.5)
    sel = resolve("L0H*,L1H1,L1H3", 2, 4)
    for mib in (None, 64.0):
        reads = []
        for name in ("__bool__", "__int__", "__index__", "item", "tolist", "nonzero"):
            orig = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name,
                                lambda self, *a, _o=orig, _n=name, **k: (reads.append(_n), _o(self, *a, **k))[1])
        stream(cap, sel, lambda *a: None, rows=3, max_block_mib=mib)
        monkeypatch.undo()
        assert reads == ["tolist", "tolist"], (mib, reads)          # 2 layers × 6 blocks × 4|2 heads: 2 reads
    mats, small = streamed(cap, sel, 3, max_block_mib=64.0)
    assert_matches(dense, mats, small, sel)


@pytest.mark.parametrize("attention,kw", [("mhsa", dict(backend="manual")),
                                          ("ls", dict(n_local=3, n_global=1, window=4)), ("span", {})])
def test_heads_together_equal_head_by_head(attention, kw):
    """A layer's heads in one block (budget for all), in groups (budget for two) and one at a time
    give the same arrays, every cell emitted once; and the same as the dense compute()."""
    m = gpt(attention, **kw)
    cap, dense = captured(m, gpt_loss(*batch()), grad_scale=0.5)
    sel = resolve("L0H*,L1H3,L1H0,L1H2", 2, 4)
    N, S, rows = size(cap), 3, 5
    one_head = LIVE * S * rows * N * 8 / 2**20                      # MiB: a block of one head, float64
    assert [heads_per_block(S, N, rows, 8, mib) for mib in (None, 0.1 * one_head, 2.5 * one_head, 1e9)] == \
        [1, 1, 2, 2**20 * 1e9 // (one_head * 2**20)]
    # a CPU stops adding heads at CPU_BLOCK_ENTRIES (a GPU only at the budget)
    assert heads_per_block(4, 256, 256, 4, 64.0) == 3 and heads_per_block(4, 256, 256, 4, 64.0, cpu=True) == 1
    assert heads_per_block(4, 64, 64, 4, 64.0, cpu=True) == CPU_BLOCK_ENTRIES // (4 * 64 * 64) == 16
    ref_mats, ref_small = streamed(cap, sel, rows, (2, 13))                        # one head at a time
    for mib in (2.5 * one_head, 4 * one_head, 0.1 * one_head):                      # 2, all 4, 1 (too small)
        mats, small = streamed(cap, sel, rows, (2, 13), max_block_mib=mib)
        assert set(small) == set(ref_small)
        for n in small:
            torch.testing.assert_close(small[n], ref_small[n], rtol=1e-13, atol=1e-15, equal_nan=True, msg=n)
        for n in mats:
            torch.testing.assert_close(mats[n], ref_mats[n], rtol=1e-13, atol=1e-15, equal_nan=True, msg=n)
        assert_matches(dense, mats, small, sel, (2, 13))


def test_pooled_overview_streamed_equals_dense():
    """Pooled tiles from blocks of whole tiles = pooling the dense matrices (float32, as stored)."""
    m = gpt()
    cap, dense = captured(m, gpt_loss(*batch()))
    sel = resolve("L0H1,L0H3,L1H3", 2, 4)
    _, small = streamed(cap, sel, rows=8, crop=(5, 9), pool=4, max_block_mib=64.0)
    vis = torch.isfinite(dense["scores"]).float()
    for li, (layer, hs) in enumerate(zip(sel.layers, sel.heads)):
        for si, h in enumerate(hs):
            for m_ in names.POOLED:
                want = pool_blocks(dense[m_][layer, h].float(), 4, vis[layer, h])
                torch.testing.assert_close(small[names.POOLED[m_]][li, si], want, rtol=1e-5, atol=1e-7,
                                           equal_nan=True)


@pytest.mark.parametrize("kind,impl,pad", [("gpt2", "sdpa", False), ("llama", "sdpa", True), ("llama", "eager", True),
                                           ("gemma2", "eager", False), ("gpt_oss", "eager", False),
                                           ("t5", "sdpa", False)])
def test_hf_streamed_equals_dense(kind, impl, pad):
    """GPT-2; Llama with GQA and left padding (rows with no visible key: 0 under SDPA, uniform
    under eager); Gemma-2's soft-cap; gpt-oss's sinks; T5's sites of different lengths."""
    from tests.adapters.hf_reference import float64_softmax, make_inputs, make_model
    with float64_softmax():
        model = make_model(kind, impl)
        inputs = make_inputs(kind)
        if pad:
            mask = torch.ones(2, 7, dtype=torch.long)
            mask[1, :3] = 0
            inputs.update(attention_mask=mask, labels=inputs["input_ids"].masked_fill(mask == 0, -100))
        cap, dense = captured(model, lambda m: m(**inputs).loss)
    assert float(dense["logit_max"].max()) > 20.0
    L, nh = dense["attn"].shape[:2]
    sel = resolve(f"L{L - 1}H*,L0H{nh - 1}", L, nh)
    N = dense["attn"].shape[-2]
    for mib in (None, 64.0):                                  # one head at a time; a layer's heads together
        mats, small = streamed(cap, sel, rows=2, crop=(1, N - 1), max_block_mib=mib)
        assert_matches(dense, mats, small, sel, (1, N - 1))


def test_rows_per_block_budget():
    per_row = 18 * 2 * 100 * 8 / 2**20                    # MiB: LIVE temporaries of one row, S = 2
    assert rows_per_block(2, 100, 8, 3.5 * per_row) == 3
    assert rows_per_block(2, 100, 8, 3.5 * per_row, multiple=2) == 2
    assert rows_per_block(2, 100, 8, 0.5 * per_row) == 0
    assert rows_per_block(2, 100, 8, 1e9) == 100
