"""Word-level WikiText loader: tokenisation, cache, errors, batching (tiny bundled corpus)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dyntool.data import wikitext as wt
from dyntool.data.wikitext import (DataError, eval_batches, fixed_batch, get_batch,
                                   load_wikitext, resolve_data_dir)

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny_wikitext"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2"


@pytest.fixture
def tiny(tmp_path):
    """A private copy, so the cache never lands in the repo and tests can break files."""
    d = tmp_path / "wt"
    d.mkdir()
    for name in ("train.txt", "valid.txt", "test.txt"):  # not a cache someone left in TINY
        shutil.copy(TINY / name, d / name)
    return d


def _reference(path: Path):
    """pytorch/examples word_language_model/data.py, written out independently."""
    vocab, out = {}, {}
    for split in ("train", "valid", "test"):
        ids = []
        with open(path / f"{split}.txt", encoding="utf8") as f:
            for line in f:
                for w in line.split() + ["<eos>"]:
                    if split == "train":
                        vocab.setdefault(w, len(vocab))
                    ids.append(vocab[w])
        out[split] = ids
    return vocab, out


def test_tokenisation_matches_reference(tiny):
    c = load_wikitext(tiny, cache_dir=tiny / "c")
    vocab, ref = _reference(tiny)
    assert c.vocab == list(vocab) and c.stoi == vocab        # train-only, first-occurrence order
    for s in ("train", "valid", "test"):
        arr = getattr(c, s)
        assert arr.dtype == np.int32 and arr.tolist() == ref[s]
    n_lines = len((tiny / "train.txt").read_text().split("\n")) - 1
    assert int((c.train == c.stoi["<eos>"]).sum()) == n_lines  # one <eos> per line, blanks too
    assert c.vocab[c.train[1]] == "Harrow" and c.vocab[c.train[0]] == "="
    assert {"@-@", "@,@", "@.@", "<unk>", "="} <= set(c.vocab)


def test_decode_round_trip(tiny):
    c = load_wikitext(tiny, cache_dir=tiny / "c")
    for s in ("train", "valid", "test"):
        assert c.decode(getattr(c, s)) == (tiny / f"{s}.txt").read_text(encoding="utf-8")


def test_cache_hit_reuses_file(tiny):
    cdir = tiny / "c"
    c1 = load_wikitext(tiny, cache_dir=cdir)
    assert c1.cache_file is not None and c1.cache_file.exists()
    m1 = c1.cache_file.stat().st_mtime_ns
    meta = c1.cache_file.with_name(c1.cache_file.name.replace(".ids.npy", ".meta.json"))
    mm1 = meta.stat().st_mtime_ns
    c2 = load_wikitext(tiny, cache_dir=cdir)
    assert c2.cache_file == c1.cache_file
    assert c2.cache_file.stat().st_mtime_ns == m1 and meta.stat().st_mtime_ns == mm1
    assert np.array_equal(c1.train, c2.train) and c1.vocab == c2.vocab
    assert not list(cdir.glob("*.tmp"))  # temp files renamed away


def test_cache_hit_does_not_tokenise(tiny, monkeypatch):
    load_wikitext(tiny, cache_dir=tiny / "c")
    monkeypatch.setattr(wt, "tokenize", lambda *a, **k: pytest.fail("re-tokenised on a hit"))
    load_wikitext(tiny, cache_dir=tiny / "c")


@pytest.mark.parametrize("damage", ["flip", "truncate", "meta", "no_meta"])
def test_corrupt_cache_is_rebuilt(tiny, damage):
    cdir = tiny / "c"
    good = load_wikitext(tiny, cache_dir=cdir)
    f = good.cache_file
    meta = f.with_name(f.name.replace(".ids.npy", ".meta.json"))
    if damage == "flip":
        b = bytearray(f.read_bytes()); b[-3] ^= 0x01; f.write_bytes(bytes(b))
    elif damage == "truncate":
        f.write_bytes(f.read_bytes()[:-8])
    elif damage == "meta":
        meta.write_text(meta.read_text()[:50])
    else:
        meta.unlink()
    again = load_wikitext(tiny, cache_dir=cdir)
    assert np.array_equal(again.train, good.train) and again.vocab == good.vocab
    assert wt._read_cache(f, meta) is not None  # rewritten and valid again


def test_data_change_invalidates_cache(tiny):
    cdir = tiny / "c"
    a = load_wikitext(tiny, cache_dir=cdir)
    with open(tiny / "train.txt", "a", encoding="utf-8") as fh:
        fh.write(" a brand new line of words \n")
    b = load_wikitext(tiny, cache_dir=cdir)
    assert b.cache_file != a.cache_file and len(b.train) == len(a.train) + 7
    assert "brand" in b.stoi


def test_no_cache_writes_nothing(tiny):
    c = load_wikitext(tiny, use_cache=False)
    assert c.cache_file is None and not (tiny / ".dyntool-cache").exists()


def _snapshot(d):
    return sorted((str(p.relative_to(d)), p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*"))


def test_default_cache_is_user_cache_dir_never_data_dir(tiny, tmp_path, monkeypatch):
    """Even a writable data folder is left alone: the cache goes to $XDG_CACHE_HOME/dyntool."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    before = _snapshot(tiny)
    c = load_wikitext(tiny)
    assert (tmp_path / "xdg" / "dyntool" / "wikitext") in c.cache_file.parents
    assert _snapshot(tiny) == before
    assert load_wikitext(tiny).cache_file == c.cache_file          # and it is reused


def test_home_cache_when_xdg_unset(tiny, tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    c = load_wikitext(tiny)
    assert (tmp_path / "home" / ".cache" / "dyntool" / "wikitext") in c.cache_file.parents


def test_read_only_data_dir_works_and_is_untouched(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    before = _snapshot(tiny)
    for f in tiny.iterdir():
        f.chmod(0o444)
    tiny.chmod(0o555)
    try:
        c = load_wikitext(tiny)
        again = load_wikitext(tiny)                                 # from the cache
    finally:
        tiny.chmod(0o755)
    assert c.vocab_size > 0 and np.array_equal(again.train, c.train)
    assert (tmp_path / "xdg" / "dyntool" / "wikitext") in c.cache_file.parents
    assert _snapshot(tiny) == before


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, ValueError)
    return msg


def test_missing_dir(tmp_path):
    with pytest.raises(DataError) as e:
        load_wikitext(tmp_path / "nope")
    msg = _one_line(e)
    assert msg.startswith(f"wikitext-2 directory not found at {tmp_path / 'nope'} (found nothing there): "
                          f"expected a folder of train.txt, valid.txt, test.txt")
    assert "--data.path" in msg and "hf:Salesforce/wikitext" in msg


def test_nothing_found_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(wt, "_repo_root", lambda: tmp_path / "a" / "repo")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(wt.ENV_VAR, raising=False)
    with pytest.raises(DataError) as e:
        resolve_data_dir(None)
    assert _one_line(e).startswith("wikitext-2 directory not found at ")


def test_env_var_fallback(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(wt, "_repo_root", lambda: tmp_path / "a" / "repo")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(wt.ENV_VAR, str(tiny))
    assert resolve_data_dir(None) == tiny


def test_missing_file(tiny):
    (tiny / "valid.txt").unlink()
    with pytest.raises(DataError) as e:
        load_wikitext(tiny, cache_dir=tiny / "c")
    assert _one_line(e) == (f"wikitext-2 directory {tiny} is missing valid.txt: expected "
                            f"train.txt, valid.txt, test.txt (set --data.path)")


def test_empty_file(tiny):
    (tiny / "test.txt").write_text("")
    with pytest.raises(DataError) as e:
        load_wikitext(tiny, cache_dir=tiny / "c")
    assert "test.txt is empty" in _one_line(e)


@pytest.mark.parametrize("payload,needle", [(b"\x00\x01\x02binary", "looks binary"),
                                            (b" caf\xe9 au lait \n", "is not UTF-8")])
def test_binary_or_undecodable(tiny, payload, needle):
    (tiny / "train.txt").write_bytes(payload)
    with pytest.raises(DataError) as e:
        load_wikitext(tiny, use_cache=False)
    assert needle in _one_line(e)


def test_oov_error_and_unk(tiny):
    with open(tiny / "test.txt", "a", encoding="utf-8") as fh:
        fh.write(" zyzzyva \n")
    with pytest.raises(DataError) as e:
        load_wikitext(tiny, use_cache=False)
    assert "test.txt line" in _one_line(e) and "'zyzzyva'" in str(e.value)
    c = load_wikitext(tiny, use_cache=False, oov="unk")
    assert c.test[-2] == c.stoi["<unk>"] and c.test[-1] == c.stoi["<eos>"]


def test_get_batch_shapes_and_shift(tiny):
    c = load_wikitext(tiny, use_cache=False)
    for g in (torch.Generator().manual_seed(0), np.random.default_rng(0)):
        x, y = get_batch(c.train, 4, 16, g, "cpu")
        assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row_x, row_y in zip(x.numpy(), y.numpy()):  # really consecutive corpus tokens
            s = _find(c.train, row_x)
            assert c.train[s + 16] == row_y[-1]
    a = get_batch(c.train, 4, 16, torch.Generator().manual_seed(1))
    b = get_batch(c.train, 4, 16, torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0])  # seeded -> reproducible


def _find(data, row):
    for s in range(len(data) - len(row) + 1):
        if np.array_equal(data[s:s + len(row)], row):
            return s
    raise AssertionError("window not found in the split")


def test_fixed_batch_deterministic(tiny):
    c = load_wikitext(tiny, use_cache=False)
    x1, y1 = fixed_batch(c.valid, 3, 8)
    x2, y2 = fixed_batch(c.valid, 3, 8)
    assert torch.equal(x1, x2) and x1.shape == (3, 8) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert x1[0].tolist() == c.valid[:8].tolist()
    last = len(c.valid) - 9
    assert y1[-1].tolist() == c.valid[last + 1:last + 9].tolist()  # spread to the very end
    xo, _ = fixed_batch(c.valid, 1, 8, offset=5)
    assert xo[0].tolist() == c.valid[5:13].tolist()
    with pytest.raises(DataError):
        fixed_batch(c.valid, 2, 8, offset=len(c.valid))


def test_eval_batches_cover_split_exactly(tiny):
    c = load_wikitext(tiny, use_cache=False)
    T = 16
    batches = list(eval_batches(c.valid, 5, T))
    ys = torch.cat([y.reshape(-1) for _, y in batches])
    xs = torch.cat([x.reshape(-1) for x, _ in batches])
    assert ys.tolist() == c.valid[1:].tolist() and xs.tolist() == c.valid[:-1].tolist()
    assert all(x.shape[1] == T for x, _ in batches[:-1])
    assert len(list(eval_batches(c.valid, 5, T, max_batches=2))) == 2
    no_tail = list(eval_batches(c.valid, 5, T, include_tail=False))
    assert sum(x.numel() for x, _ in no_tail) == ((len(c.valid) - 1) // T) * T


def test_block_size_too_large(tiny):
    c = load_wikitext(tiny, use_cache=False)
    with pytest.raises(DataError):
        get_batch(c.test, 2, len(c.test))


@pytest.mark.skipif(not (SHARED / "train.txt").exists(),
                    reason=f"shared WikiText-2 not present at {SHARED}")
def test_real_wikitext2_counts(tmp_path):
    c = load_wikitext(SHARED, cache_dir=tmp_path / "cache")
    assert len(c.vocab) == 33_278 and c.vocab_size == 33_278
    assert (len(c.train), len(c.valid), len(c.test)) == (2_088_628, 217_646, 245_569)
    assert c.stoi["<eos>"] < len(c.vocab) and int(c.train.max()) == 33_277
