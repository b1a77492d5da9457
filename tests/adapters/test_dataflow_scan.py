"""docs/recording.md's scan of all families (``python -m tests.adapters.dataflow_scan --write
docs/recording.md``): the table lists every model type of the installed transformers, in the scan's
format, with no wrong recording; a fixed sample of rows re-runs here and matches (one family per
path: the registry, the dataflow adapter); the full re-run is slow."""
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")

from .dataflow_scan import HEADER, MARK, block, model_types, row, table  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "recording.md"
VERDICTS = ("exact", "right padding: ", "refused: ", "not built from a tiny config", "not a text model", "model error without dyntool",
            "no truth", "not scanned", "scan error")
REGEN = "regenerate it: python -m tests.adapters.dataflow_scan --write docs/recording.md"
# rows that differ from the truth, if any were ever accepted as known bugs: a new one fails here
# (bigbird_pegasus was one until dyntool refused a non-dense attention beside dense ones)
KNOWN_WRONG: set[str] = set()


def _rows() -> dict[str, str]:
    text = DOC.read_text()
    assert MARK in text, "docs/recording.md lacks the scan's table; " + REGEN
    lines = block(text).splitlines()
    assert lines[1:3] == HEADER
    return {line.split(" | ")[0].removeprefix("| "): line for line in lines[3:]}


def test_scan_table_lists_todays_model_types_with_known_verdicts():
    rows = _rows()
    assert sorted(rows) == model_types(), "the installed transformers has other model types; " + REGEN
    for t, line in rows.items():
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 4, line
        assert cells[2].startswith(VERDICTS) or t in KNOWN_WRONG, line
        assert cells[1] or not cells[2].startswith("exact"), line
    assert {t for t, line in rows.items() if "differs from the truth" in line} == KNOWN_WRONG


def test_scan_rows_below_trained_size_logits_say_so():
    """The issue's standard is max |τ q·k| ≥ 20: an exact row below it names its max logit and why."""
    for t, line in _rows().items():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[2].startswith("exact") and cells[3] and min(float(x) for x in cells[3].split(" / ")) < 20:
            assert f"(max logit {cells[3]}: " in cells[2], line


# the registry, the dataflow adapter (right and left padding), a padding-split verdict (MPT: its
# float32 softmax of a left-padded row's float64 finfo.min), a non-dense refusal (BigBird)
@pytest.mark.parametrize("model_type", ["bloom", "bert", "mpt", "big_bird"])
def test_scan_sample_rows_are_current(model_type):
    assert row(model_type) == _rows()[model_type], REGEN


@pytest.mark.slow
def test_scan_full_table_is_current():
    """Every model type again (about 40 min on 2 shared cores; docs/recording.md).  A row cut at the
    scan's time limit on either side depends on the machine's load, so it is not compared."""
    def rows(text):
        return {r.split(" | ")[0]: r for r in text.splitlines()[3:]}
    doc, now = rows(block(DOC.read_text())), rows(table())
    assert sorted(doc) == sorted(now), REGEN
    cut = {t for t in now if "not scanned" in doc[t] + now[t]}
    assert {t: now[t] for t in now if t not in cut} == {t: doc[t] for t in doc if t not in cut}, REGEN
