"""docs/recording.md's "Four short examples": every python block of that section, run in order as
one script in a temporary folder (tiny models, offline), so the documented usage stays true."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "recording.md"
SECTION = "## Four short examples (run by the tests)"


def blocks() -> list[str]:
    text = DOC.read_text()
    assert SECTION in text, "the section the test runs is gone"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def test_the_section_has_the_four_examples():
    code = blocks()
    assert len(code) == 4
    for name in ("dyntool.Capture(", "FlightRecorder(", "RunRecorder(", "HFRecorderCallback("):
        assert sum(name in c for c in code) >= 1, name
    assert "stored as **0**" in DOC.read_text()


def test_the_examples_run(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    import runpy
    # one file, as a user would paste it (the adapters read a module's source to find its attention)
    script = tmp_path / "recording_examples.py"
    script.write_text("\n".join(blocks()))
    runpy.run_path(str(script), run_name="docs_example")
    assert (tmp_path / "runs" / "loop" / "meta.json").is_file()
    assert (tmp_path / "runs" / "hf" / "meta.json").is_file()
