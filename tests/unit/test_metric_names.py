"""Structured metric names are public (metrics.jsonl columns): pinned here, owned by one module."""
import re

import pytest

from dyntool.record import metric_names as mn


def test_formats_are_pinned():
    assert mn.LOGIT_MAX == "logit_max" and mn.ATTN_ENTROPY == "attn_entropy" and mn.GRAD_NORM == "grad_norm"
    assert mn.head(mn.LOGIT_MAX, 0, 3) == "logit_max/L0H3"
    assert mn.head(mn.ATTN_ENTROPY, 12, 10) == "attn_entropy/L12H10"
    assert mn.layer(mn.LOGIT_MAX, 2) == "logit_max/L2"
    assert mn.group(mn.LOGIT_MAX, 1, "local") == "logit_max/L1/local"
    assert mn.group(mn.LOGIT_MAX, 1, "global") == "logit_max/L1/global"
    assert mn.grad_norm("L0.attn") == "grad_norm/L0.attn" and mn.grad_norm("emb") == "grad_norm/emb"
    with pytest.raises(ValueError):
        mn.group(mn.LOGIT_MAX, 0, "sideways")


@pytest.mark.parametrize("name", ["logit_max/L0H3", "attn_entropy/L12H10", "logit_max/L7",
                                  "logit_max/L1/global", "logit_max/L3/local"])
def test_parse_inverts_format(name):
    p = mn.parse(name)
    assert p is not None and p.format() == name


@pytest.mark.parametrize("name", ["logit_max", "loss", "grad_norm/L0.attn", "logit_max/L0H", "logit_max/LxH1",
                                  "logit_max/L1/middle", "logit_max/L1H2/local", "val_ppl"])
def test_unstructured_names_parse_to_none(name):
    assert mn.parse(name) is None


def test_parse_fields():
    assert mn.parse("logit_max/L2H3") == mn.MetricName("logit_max", "head", 2, 3, None)
    assert mn.parse("logit_max/L2/local") == mn.MetricName("logit_max", "group", 2, None, "local")
    assert mn.parse("attn_entropy/L4") == mn.MetricName("attn_entropy", "layer", 4)


def test_regex_groups_match_the_readers_expectations():
    assert mn.regex(mn.LOGIT_MAX, "layer").match("logit_max/L10").groups() == ("10",)
    assert mn.regex(mn.LOGIT_MAX, "head").match("logit_max/L1H2").groups() == ("1", "2")
    assert mn.regex(mn.LOGIT_MAX, "group").match("logit_max/L0/global").groups() == ("0", "global")
    assert mn.regex(mn.LOGIT_MAX, "layer").match("attn_entropy/L1") is None
    assert mn.regex(mn.LOGIT_MAX, "layer").match("logit_max/L1H0") is None


def test_column_helpers():
    cols = ["step", "loss", "logit_max", "logit_max/L0", "logit_max/L1", "logit_max/L0H0", "logit_max/L1H1",
            "attn_entropy/L0H1", "grad_norm/L0.attn"]
    assert mn.per_layer(cols, mn.LOGIT_MAX) == {0: "logit_max/L0", 1: "logit_max/L1"}
    assert mn.per_head(cols, mn.LOGIT_MAX) == {(0, 0): "logit_max/L0H0", (1, 1): "logit_max/L1H1"}
    assert mn.per_head(cols, mn.ATTN_ENTROPY) == {(0, 1): "attn_entropy/L0H1"}


def test_no_module_formats_these_names_by_hand():
    """Writers and readers go through metric_names: no f-string or regex spells ``logit_max/L``."""
    from pathlib import Path
    import dyntool
    root = Path(dyntool.__file__).parent
    hand = re.compile(r"""(f["'](logit_max|attn_entropy)/L\{|f["']grad_norm/\{|r["']\^?(logit_max|attn_entropy)/L)""")
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "metric_names.py" and hand.search(p.read_text())]
    assert offenders == []
