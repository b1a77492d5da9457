"""The page guard: problems of the input or the data are one-line messages; a bug is not hidden."""
from __future__ import annotations

import json

import pytest
import zarr.errors

from dyntool.record.store import RecordError

from . import fixtures


@pytest.fixture
def guarded(monkeypatch):
    ui = fixtures.load_app_package().ui
    shown: list[str] = []
    monkeypatch.setattr(ui.st, "error", lambda msg, *a, **k: shown.append(str(msg)))
    monkeypatch.delenv("DYNTOOL_DEBUG", raising=False)

    def run(exc: BaseException) -> list[str]:
        def body():
            raise exc
        ui.guard(body)
        return shown
    return ui, run


def test_reader_errors_show_the_readers_message(guarded):
    """Shown as plain text: Markdown punctuation is backslash-escaped (it renders as written)."""
    import re
    ui, run = guarded
    shown = run(RecordError("array attn: chunk attn/c/0 is missing (deleted?)"))
    assert [re.sub(r"\\(.)", r"\1", m) for m in shown] == ["array attn: chunk attn/c/0 is missing (deleted?)"]
    assert shown != ["array attn: chunk attn/c/0 is missing (deleted?)"]          # escaped, not raw


@pytest.mark.parametrize("exc", [
    FileNotFoundError(2, "No such file or directory"),              # a file gone since it was listed
    KeyError("steps_written"),
    IndexError("index 3 is out of bounds"),
    json.JSONDecodeError("Expecting value", "", 0),                  # a half-written JSON file
    zarr.errors.GroupNotFoundError("record.zarr"),
    ValueError("cannot reshape array of size 0"),
])
def test_data_errors_are_one_line_and_name_the_error(guarded, exc):
    ui, run = guarded
    shown = run(exc)
    assert len(shown) == 1 and "\n" not in shown[0]
    assert shown[0].startswith(f"This view could not be drawn: {type(exc).__name__}: ")
    assert "the other pages still work" in shown[0]


@pytest.mark.parametrize("exc", [ZeroDivisionError("division by zero"), TypeError("bad operand"),
                                 AttributeError("no attribute 'x'")])
def test_a_bug_is_not_turned_into_a_data_message(guarded, exc):
    ui, run = guarded
    with pytest.raises(type(exc)):
        run(exc)


def test_esc_leaves_no_markdown_and_no_bare_url_to_link():
    """``esc`` is what every run string goes through before Streamlit Markdown: punctuation is
    escaped and a URL can't start a word (GFM would link it even escaped)."""
    import re
    from dyntool.app.data import esc
    out = esc("![i](http://h/x.png) <b>www.h.org</b> HTTPS://h\n:red[x]")
    assert "\n" not in out
    plain = out.replace("\u2060", "")
    bare = [c for i, c in enumerate(plain) if re.match(r"[!-/:-@\[-`{-~]", c)
            and c != "\\" and plain[i - 1] != "\\"]
    assert bare == [], (bare, out)                                   # every punctuation escaped
    for url in ("http", "www", "HTTPS"):
        i = out.index(url)
        assert out[i - 1] == "\u2060", (url, out)
    assert out.replace("\u2060", "").replace("\\", "") == "![i](http://h/x.png) <b>www.h.org</b> HTTPS://h :red[x]"
