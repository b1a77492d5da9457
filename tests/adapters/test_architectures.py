"""The architecture table of docs/recording.md is what running every architecture gives today.

Each row of ``architectures.hf_table`` runs the tiny model and compares it with the float64
autograd reference (≤ 1e-8, trained-size logits), so every row that says exact is tested here."""
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")

from .architectures import MARK, tables  # noqa: E402

README = Path(__file__).resolve().parents[2] / "docs" / "recording.md"


def test_readme_architecture_table_is_current():
    table = tables()
    assert "WRONG" not in table and "should not happen" not in table
    text = README.read_text()
    assert MARK in text, "docs/recording.md lacks the generated architecture table"
    start = text.index(MARK)
    end = text.index("\n\n", text.index("| other families", start))
    assert text[start:end] == table, (
        "docs/recording.md's architecture table is stale: regenerate it with `python -m tests.adapters.architectures`")
