"""docs/recording.md's second generated table (more families through the dataflow adapter) is what
running each family against the float64 autograd truth gives today (slow: ~12 tiny models)."""
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")

from .dataflow_families import MARK, table  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "recording.md"


@pytest.mark.slow
def test_dataflow_families_table_is_current():
    got = table()
    assert "WRONG" not in got
    text = DOC.read_text()
    assert MARK in text, "docs/recording.md lacks the dataflow families table"
    start = text.index(MARK)
    end = text.find("\n\n", start)
    assert text[start:end if end >= 0 else None] == got, (
        "docs/recording.md's dataflow families table is stale: regenerate it with "
        "`python -m tests.adapters.dataflow_families`")
