"""A damaged WikiText parquet file is one line (exit 2) before a byte is hashed or read: a FIFO or a
link to /dev/zero in its place used to hang training; a flipped byte, an integer 'text' column or a
folder in its place were internal errors; a folder of unrelated files (/etc) listed all its names."""
from __future__ import annotations

import os
import threading

import pytest

from dyntool.cli import main
from dyntool.data.wikitext import DataError, load_wikitext
from tests.integration.test_train import CONFIG, TINY_ARGS
from tests.unit.test_wikitext_sources import _corpus_text, pa, pq, write_parquet


def _fifo(f):
    f.unlink()
    os.mkfifo(f)


def _zero(f):
    f.unlink()
    f.symlink_to("/dev/zero")


def _flip(f):
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0xFF
    f.write_bytes(bytes(b))


def _intcol(f):
    pq.write_table(pa.table({"text": [1, 2, 3]}), f)


def _folder(f):
    f.unlink()
    f.mkdir()


CASES = {"fifo": (_fifo, "is a FIFO, not a regular file"), "dev_zero": (_zero, "is a character device"),
         "flipped_byte": (_flip, "is damaged ("), "int_text": (_intcol, "'text' column holds int64"),
         "folder": (_folder, "is a directory, not a regular file")}


def _load_within(path, seconds=20):
    """load_wikitext in a thread, so a hang fails the test instead of stopping it."""
    out = {}

    def go():
        try:
            load_wikitext(path, use_cache=False)
        except Exception as e:          # noqa: BLE001  (what it raised is the result)
            out["e"] = e
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "load_wikitext hung"
    return out.get("e")


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_parquet_is_one_line(case, tmp_path):
    damage, expect = CASES[case]
    d = write_parquet(tmp_path / "pq", _corpus_text())
    damage(d / "wikitext-2-v1" / "train-00000-of-00001.parquet")
    e = _load_within(d)
    assert isinstance(e, DataError), repr(e)
    assert expect in str(e) and "\n" not in str(e), str(e)


def test_damaged_parquet_in_train_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    d = write_parquet(tmp_path / "pq", _corpus_text())
    _flip(d / "wikitext-2-v1" / "train-00000-of-00001.parquet")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = ["train", "--config", str(CONFIG), "--preset", "small", "--out", str(tmp_path / "out"), "--quiet",
            *TINY_ARGS, f"--data.path={d}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is damaged" in err, err
    assert not (tmp_path / "out").exists()


def test_a_folder_of_other_files_is_counted_not_listed(tmp_path):
    d = tmp_path / "etc"
    d.mkdir()
    for i in range(40):
        (d / f"file{i}.conf").write_text("x")
    with pytest.raises(DataError) as e:
        load_wikitext(d, use_cache=False)
    msg = str(e.value)
    assert "40 entries, none of them WikiText's" in msg and "file1.conf" not in msg and len(msg) - len(str(d)) < 250, msg
