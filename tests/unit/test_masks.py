import pytest
import torch

from dyntool import masks


def test_causal_keeps_diagonal():
    m = masks.causal().dense(4)[0]
    assert torch.equal(m, torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_sliding_window_sees_p_keys_including_itself():
    p, T = 3, 8
    m = masks.sliding_window(p).dense(T)[0]
    for i in range(T):
        visible = m[i].nonzero().flatten().tolist()
        assert visible == list(range(max(0, i - p + 1), i + 1))


def test_local_global_head_order():
    m = masks.local_global(2, 1, 2).dense(5, n_head=3)
    assert torch.equal(m[0], masks.sliding_window(2).dense(5)[0])
    assert torch.equal(m[1], m[0])
    assert torch.equal(m[2], masks.causal().dense(5)[0])


def test_pure_local_and_pure_global():
    assert masks.local_global(0, 4, 3).is_causal
    assert masks.local_global(4, 0, 3).name == "sliding_window_3"
    with pytest.raises(ValueError):
        masks.local_global(0, 0, 3)
    with pytest.raises(ValueError):
        masks.sliding_window(0)


def test_full_and_composition():
    assert masks.full().dense(3).all()
    both = masks.and_masks(masks.causal(), masks.sliding_window(2))
    assert torch.equal(both.dense(6)[0], masks.sliding_window(2).dense(6)[0])
    either = masks.or_masks(masks.causal(), masks.full())
    assert either.dense(4).all()


def test_mask_mod_matches_dense():
    m = masks.local_global(1, 1, 2)
    mod = m.mask_mod()
    h, q, k = torch.arange(2)[:, None, None], torch.arange(4)[None, :, None], torch.arange(4)[None, None, :]
    assert torch.equal(mod(0, h, q, k), m.dense(4, 2))


def test_one_mask_convention_in_the_package():
    """Masks come from dyntool.masks; a hand-built triangle elsewhere is a second convention that can
    drift (top-left vs bottom-right, diagonal kept or not).  The one copy that stays is torch_mha's
    bottom-right causal mask for Tk > T, which masks.causal() does not express; at T == Tk it must be
    masks.causal()."""
    import re
    from pathlib import Path

    import dyntool
    from dyntool import masks
    root = Path(dyntool.__file__).parent
    hand = re.compile(r"\.(tril|triu)\(|torch\.(tril|triu)\(|np\.(tril|triu)\(")
    found = {str(p.relative_to(root)) for p in root.rglob("*.py") if hand.search(p.read_text())}
    assert found == {"adapters/torch_mha.py"}, f"hand-built triangular masks in {sorted(found)}"
    T = 7
    assert torch.equal(torch.ones(T, T, dtype=torch.bool).tril(T - T), masks.causal().dense(T)[0])
    # the tile mask of the sticky engine and span's SDPA-causal mask are masks.causal() itself
    assert torch.equal(~masks.causal().dense(4)[0], torch.ones(4, 4, dtype=torch.bool).triu(1))
