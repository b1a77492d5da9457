"""WikiText from wherever a user has it: text files, the hub's parquet layout, the hub cache (read
offline through the real huggingface_hub client) all give the same ids, vocabulary and first-step
loss; bad input is one line naming what was found and what was expected."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dyntool.cli import main
from dyntool.data import wikitext as wt
from dyntool.data.wikitext import DataError, load_wikitext

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "data" / "tiny_wikitext"
PQ_NAMES = {"train": "train", "valid": "validation", "test": "test"}
REV = "0123456789abcdef0123456789abcdef01234567"


def _corpus_text(seed: int = 0) -> dict[str, str]:
    """The tiny corpus plus generated lines (blank lines included), so a test can fail on order."""
    rng = np.random.default_rng(seed)
    words = (TINY / "train.txt").read_text(encoding="utf-8").split()
    out = {}
    for split in ("train", "valid", "test"):
        base = (TINY / f"{split}.txt").read_text(encoding="utf-8")
        extra = "".join(" \n" if rng.random() < 0.2 else
                        " " + " ".join(rng.choice(words, rng.integers(1, 12))) + " \n" for _ in range(30))
        out[split] = base + extra
    return out


def write_text(d: Path, text: dict[str, str]) -> Path:
    d.mkdir(parents=True)
    for s, t in text.items():
        (d / f"{s}.txt").write_text(t, encoding="utf-8")
    return d


def _rows(t: str) -> list[str]:
    """One row per line as the hub has them: the line with its newline, blank lines as ''."""
    return [ln if ln.strip() else "" for ln in t.splitlines(keepends=True)]


def write_parquet(d: Path, text: dict[str, str], config: str = "wikitext-2-v1") -> Path:
    c = d / config
    c.mkdir(parents=True)
    for s, t in text.items():
        pq.write_table(pa.table({"text": _rows(t)}), c / f"{PQ_NAMES[s]}-00000-of-00001.parquet")
    return d


def write_hub_cache(hf_home: Path, text: dict[str, str], config: str = "wikitext-2-v1") -> Path:
    """The standard hub cache layout: blobs/<sha256>, snapshots/<rev>/<config>/<file> -> blob, refs/main."""
    repo = hf_home / "hub" / "datasets--Salesforce--wikitext"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    snap = repo / "snapshots" / REV / config
    snap.mkdir(parents=True)
    tmp = hf_home / "tmp.parquet"
    for s, t in text.items():
        pq.write_table(pa.table({"text": _rows(t)}), tmp)
        data = tmp.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / f"{PQ_NAMES[s]}-00000-of-00001.parquet")
    tmp.unlink()
    (repo / "refs" / "main").write_text(REV)
    return snap


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    hf = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(hf))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return hf


def _tree(d: Path):
    return sorted((str(p.relative_to(d)), p.lstat().st_size, p.lstat().st_mtime_ns) for p in d.rglob("*"))


def test_three_sources_same_ids_vocab_and_first_loss(tmp_path, offline_hub):
    pytest.importorskip("huggingface_hub")
    text = _corpus_text()
    txt = write_text(tmp_path / "txt", text)
    par = write_parquet(tmp_path / "par", text)
    write_hub_cache(offline_hub, text)
    before = {d: _tree(d) for d in (txt, par, offline_hub)}
    specs = [str(txt), str(par), str(par / "wikitext-2-v1"), "hf:Salesforce/wikitext"]
    corpora = [load_wikitext(s) for s in specs]
    kinds = [Path(c.cache_file).parent for c in corpora]
    assert len(set(kinds)) >= 3                                   # really read from different places
    assert corpora[3].path == offline_hub / "hub" / "datasets--Salesforce--wikitext" / "snapshots" / REV / \
        "wikitext-2-v1"
    ref = corpora[0]
    n_lines = text["train"].count("\n")
    assert int((np.asarray(ref.train) == ref.stoi["<eos>"]).sum()) == n_lines
    for c in corpora[1:]:
        assert c.vocab == ref.vocab
        for s in ("train", "valid", "test"):
            assert np.array_equal(getattr(c, s), getattr(ref, s)), s
    assert isinstance(ref.train, np.memmap)                       # cached ids are memory-mapped
    # the same first-step loss through `dyntool train`
    losses = []
    for i, spec in enumerate(specs[:2] + specs[3:]):
        argv = ["train", "--config", "wikitext_mhsa", "--preset", "small", "--out", str(tmp_path / "runs"),
                "--name", f"r{i}", "--quiet", "--max-steps", "1", f"--data.path={spec}",
                "--data.batch_size=2", "--data.block_size=8", "--model.n_layer=1", "--model.n_head=1",
                "--model.n_embd=16", "--train.eval_every=0", "--train.final_eval=false",
                "--train.checkpoint=false", "--record.every=0"]
        assert main(argv) == 0
        row = json.loads((tmp_path / "runs" / f"r{i}" / "metrics.jsonl").read_text().splitlines()[0])
        losses.append(row["loss"])
    assert losses[0] == losses[1] == losses[2] and np.isfinite(losses[0])
    assert {d: _tree(d) for d in before} == before                # no data folder was written to


def test_hub_config_is_a_subfolder(tmp_path, offline_hub):
    pytest.importorskip("huggingface_hub")
    text = _corpus_text(1)
    write_hub_cache(offline_hub, text, config="wikitext-103-v1")
    c = load_wikitext("hf:Salesforce/wikitext/wikitext-103-v1")
    assert c.path.name == "wikitext-103-v1" and c.source == "hf:Salesforce/wikitext/wikitext-103-v1"
    with pytest.raises(DataError) as e:                            # that config only is cached
        load_wikitext("hf:Salesforce/wikitext")
    assert "wikitext-2-v1" in str(e.value)


def test_sharded_split(tmp_path):
    text = _corpus_text(2)
    par = write_parquet(tmp_path / "par", text)
    c = par / "wikitext-2-v1"
    rows = _rows(text["train"])
    (c / "train-00000-of-00001.parquet").unlink()
    pq.write_table(pa.table({"text": rows[:40]}), c / "train-00000-of-00002.parquet")
    pq.write_table(pa.table({"text": rows[40:]}), c / "train-00001-of-00002.parquet")
    a = load_wikitext(par, use_cache=False)
    b = load_wikitext(write_text(tmp_path / "txt", text), use_cache=False)
    assert np.array_equal(a.train, b.train) and a.vocab == b.vocab


def _err(spec) -> str:
    with pytest.raises(DataError) as e:
        load_wikitext(spec, use_cache=False)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_bad_folders(tmp_path):
    d = tmp_path / "junk"
    d.mkdir()
    (d / "notes.csv").write_text("a,b\n")
    msg = _err(d)
    assert "neither layout" in msg and "notes.csv" in msg and "train.txt" in msg and "parquet" in msg
    par = write_parquet(tmp_path / "par", _corpus_text())
    (par / "wikitext-2-v1" / "validation-00000-of-00001.parquet").unlink()
    msg = _err(par)
    assert "validation-*.parquet" in msg and "train-00000-of-00001.parquet" in msg
    nt = tmp_path / "nt" / "wikitext-2-v1"
    nt.mkdir(parents=True)
    for s in ("train", "validation", "test"):
        pq.write_table(pa.table({"line": ["a b \n"]}), nt / f"{s}-00000-of-00001.parquet")
    msg = _err(nt)
    assert "has columns line" in msg and "'text' column" in msg


def test_unknown_hub_config(offline_hub):
    msg = _err("hf:Salesforce/wikitext/wikitext-3-v1")
    assert "unknown config 'wikitext-3-v1'" in msg and "wikitext-103-v1" in msg


def test_nothing_anywhere_names_path_and_hub(tmp_path, offline_hub, monkeypatch):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(wt, "_repo_root", lambda: tmp_path / "a" / "repo")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(wt.ENV_VAR, raising=False)
    msg = _err(None)
    assert "--data.path" in msg and "hf:Salesforce/wikitext" in msg and "hf download" in msg


def test_cli_offline_no_cache_exits_2_fast(tmp_path):
    pytest.importorskip("huggingface_hub")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
           "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "dyntool", "train", "--config", "wikitext_mhsa", "--preset",
                        "small", "--out", str(tmp_path / "runs"), "--data.path=hf:Salesforce/wikitext"],
                       env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 2, p.stderr
    errs = [ln for ln in p.stderr.splitlines() if ln.startswith("dyntool: error")]
    assert len(errs) == 1 and "--data.path" in errs[0] and "hf:Salesforce/wikitext" in errs[0]
    assert "Traceback" not in p.stderr and took < 30
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
