"""Structured metric names are public (metrics.jsonl columns): pinned here, owned by one module."""
import re

import pytest
import torch

from dyntool.record import metric_names as mn


def test_formats_are_pinned():
    assert mn.LOGIT_MAX == "logit_max" and mn.ATTN_ENTROPY == "attn_entropy" and mn.GRAD_NORM == "grad_norm"
    assert mn.head(mn.LOGIT_MAX, 0, 3) == "logit_max/L0H3"
    assert mn.head(mn.ATTN_ENTROPY, 12, 10) == "attn_entropy/L12H10"
    assert mn.layer(mn.LOGIT_MAX, 2) == "logit_max/L2"
    assert mn.grad_norm("L0.attn") == "grad_norm/L0.attn" and mn.grad_norm("emb") == "grad_norm/emb"


def test_simulation_names_are_pinned():
    """The wind tunnel's and the sticky study's names, as existing runs have them on disk."""
    assert mn.key_orth("ctx", 0) == "key_orth/ctx/L0" and mn.key_orth("vocab", 3) == "key_orth/vocab/L3"
    assert mn.key_orth("ctx", 1, signed=True) == "key_orth/ctx_signed/L1"
    assert mn.key_orth("vocab", 2, signed=True) == "key_orth/vocab_signed/L2"
    with pytest.raises(ValueError):
        mn.key_orth("sideways", 0)
    assert mn.bijection_manifold("resid", 2, "pc1_share") == "manifold/resid/L2/pc1_share"
    assert mn.bijection_manifold("g", 0) == "manifold/g/L0/"
    assert mn.bijection_manifold(mn.BIJECTION_BASELINE, stat="r2_linear") == "manifold/pos_onehot/r2_linear"
    assert mn.bijection_manifold(mn.BIJECTION_NORMED_VALUES) == "manifold/normed_values/"
    assert mn.is_bijection_manifold("manifold/resid/L0/r_pc1") and not mn.is_bijection_manifold("key_orth/ctx/L0")
    assert mn.sticky_manifold("g", "r2_linear") == "heldout_g_r2_linear" and mn.sticky_manifold("x") == "heldout_x_"
    assert mn.bijection_heldout("loss") == "heldout/loss"
    assert (mn.ATTN_ENTROPY_UNIFORM, mn.ATTN_ENTROPY_REDUCTION_LAST, mn.ATTN_ENTROPY_REDUCTION_MEAN) == (
        "attn_entropy/uniform", "attn_entropy/reduction_last_vs_L0", "attn_entropy/reduction_mean_vs_uniform")
    assert mn.icl_kl("bigram") == "kl/bigram" and mn.icl_heldout("loss") == "icl_heldout/loss"
    assert mn.head(mn.icl_score("induction"), 1, 0) == "induction_score/L1H0"
    assert mn.head(mn.icl_score("prev_token"), 0, 2) == "prev_token_score/L0H2"
    with pytest.raises(ValueError):
        mn.icl_score("copying")


@pytest.mark.parametrize("name", ["logit_max/L0H3", "attn_entropy/L12H10", "logit_max/L7"])
def test_parse_inverts_format(name):
    p = mn.parse(name)
    assert p is not None and p.format() == name


@pytest.mark.parametrize("name", ["logit_max", "loss", "grad_norm/L0.attn", "logit_max/L0H", "logit_max/LxH1",
                                  "logit_max/L1/local", "logit_max/L1H2/local", "val_ppl",
                                  "key_orth/ctx/L0", "manifold/resid/L1/r_pc1"])
def test_unstructured_names_parse_to_none(name):
    assert mn.parse(name) is None


def test_parse_fields():
    assert mn.parse("logit_max/L2H3") == mn.MetricName("logit_max", "head", 2, 3)
    assert mn.parse("attn_entropy/L4") == mn.MetricName("attn_entropy", "layer", 4)


def test_regex_groups_match_the_readers_expectations():
    assert mn.regex(mn.LOGIT_MAX, "layer").match("logit_max/L10").groups() == ("10",)
    assert mn.regex(mn.LOGIT_MAX, "head").match("logit_max/L1H2").groups() == ("1", "2")
    assert mn.regex(mn.LOGIT_MAX, "layer").match("attn_entropy/L1") is None
    assert mn.regex(mn.LOGIT_MAX, "layer").match("logit_max/L1H0") is None


def test_column_helpers():
    cols = ["step", "loss", "logit_max", "logit_max/L0", "logit_max/L1", "logit_max/L0H0", "logit_max/L1H1",
            "attn_entropy/L0H1", "grad_norm/L0.attn"]
    assert mn.per_layer(cols, mn.LOGIT_MAX) == {0: "logit_max/L0", 1: "logit_max/L1"}
    assert mn.per_head(cols, mn.LOGIT_MAX) == {(0, 0): "logit_max/L0H0", (1, 1): "logit_max/L1H1"}
    assert mn.per_head(cols, mn.ATTN_ENTROPY) == {(0, 1): "attn_entropy/L0H1"}


# A metric name spelled by hand: a layer suffix ``/L0`` / ``/L{l}`` / a regex ``/L(\d+)``, or a
# structured base followed by ``/``, or a sticky held-out prefix.  Strings with a space are prose
# (error messages, captions, help), docstrings are documentation: both may quote the forms.
HAND_FORMATTED = [re.compile(p) for p in (
    r"/L(\d|\{|\(|\\d)",
    r"^(manifold|key_orth|attn_entropy|logit_max|grad_norm|" + "|".join(mn.CHEAP_TIER) + r")/",
    r"^heldout_(\{\}|[gvx])_",
    r"^heldout/",
    r"^(kl|icl_heldout|prev_token_score|induction_score)/",
)]


def _literals(tree):
    """(line, text) of every string literal outside docstrings; an f-string as one text with
    ``{}`` for each replacement field (``f"key_orth/ctx/L{l}"`` -> ``key_orth/ctx/L{}``)."""
    import ast
    skip = set()
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))
        if isinstance(n, ast.JoinedStr):
            skip.update(id(v) for v in n.values)
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.JoinedStr):
            yield n.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in n.values)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            yield n.lineno, n.value


def hand_formatted(source: str) -> list[tuple[int, str]]:
    import ast
    return [(line, text) for line, text in _literals(ast.parse(source))
            if " " not in text.strip() and any(rx.search(text) for rx in HAND_FORMATTED)]


@pytest.mark.parametrize("line", ['x = f"key_orth/ctx/L{l}"', 'x = "manifold/resid/L{l}/r_pc1"',
                                  'x = "key_orth/ctx/L0"', 'x = rf"{name}/L(\\d+)H(\\d+)"',
                                  'x = f"heldout_{rep}_{k}"', "x = 'heldout_g_r2_linear'",
                                  'x = f"{base}/L{l}H{h}"', 'x = "attn_entropy/uniform"', 'x = f"logit_max/L{l}"',
                                  'x = f"heldout/{k}"', 'x = "kl/bigram"', 'x = f"induction_score/L{l}H{h}"'])
def test_the_scan_catches_a_hand_formatted_name(line):
    assert hand_formatted(line)


@pytest.mark.parametrize("line", ['"""Docstring: key_orth/ctx/L{l}."""', 'x = "needs logit_max/L{l}H{h} logged"',
                                  'x = "heldout_loss"', 'x = mn.key_orth("ctx", l)', 'x = f"L{l}H{h}"'])
def test_the_scan_passes_prose_and_helpers(line):
    assert not hand_formatted(line)


def test_no_module_formats_metric_names_by_hand():
    """Writers and readers (sims, wind tunnel, trainer, app, figures) go through metric_names: no
    string literal or f-string in the package spells a structured metric name by itself."""
    from pathlib import Path
    import dyntool
    root = Path(dyntool.__file__).parent
    offenders = [f"{p.relative_to(root)}:{line}: {text!r}" for p in sorted(root.rglob("*.py"))
                 if p.name != "metric_names.py" for line, text in hand_formatted(p.read_text())]
    assert offenders == []


def test_ls_local_global_split_comes_from_per_head_columns():
    """Nobody writes ``logit_max/L{l}/local``: an LS run's local / global panels are the max over
    its per-head columns (heads < n_local local)."""
    from types import SimpleNamespace
    import numpy as np
    import pandas as pd
    from dyntool.figures.train_common import layer_logits
    cols = {mn.head(mn.LOGIT_MAX, l, h): [float(10 * l + h), float(10 * l + h + 1)] for l in range(2) for h in range(3)}
    run = SimpleNamespace(config={"model": {"attention": "ls", "n_local": 2}}, store=None, problems=[],
                          metrics=pd.DataFrame({"step": [0, 1], **cols}))
    out = layer_logits(run)
    assert set(out) == {"local", "global"}
    steps, local = out["local"]
    assert steps.tolist() == [0, 1] and local.tolist() == [[1.0, 2.0], [11.0, 12.0]]      # max of heads 0, 1
    assert out["global"][1].tolist() == [[2.0, 3.0], [12.0, 13.0]]                       # head 2
    run.config["model"]["attention"] = "mhsa"
    assert set(layer_logits(run)) == {"all"} and np.array_equal(layer_logits(run)["all"][1], out["global"][1])


def test_each_cheap_sum_becomes_one_named_statistic():
    """One table (cheap_stats.SUMS) says what every running sum becomes; its statistics are the
    cheap tier's public names and the kernel's slots are the table's fields, by name."""
    from dyntool.cheap_stats import SUMS, Sums
    from dyntool.kernels.stats_names import BACKWARD_SUMS, DKV_SLOTS, DQ_SLOTS, FORWARD_SUMS
    stats = [s.stat for s in SUMS.values()]
    assert len(set(stats)) == len(stats) and set(stats) | {mn.SCORE_MAX, mn.LOGIT_MAX} == set(mn.CHEAP_TIER)
    kernel_sums = set(BACKWARD_SUMS) | set(FORWARD_SUMS) - {"score_max", "logit_max"}
    assert kernel_sums == set(SUMS)
    assert {"var", "ds2"} <= set(DQ_SLOTS) & set(DKV_SLOTS)        # either program may carry them
    s = Sums(2, torch.float64, "cpu")
    s.var += 4.0
    s.ds2 += 9.0
    s.rows += 2
    s.seqs += 1
    out = s.finish()
    assert out[mn.COMPAT_VAR].tolist() == [2.0, 2.0] and out[mn.SCORE_GRAD_NORM].tolist() == [3.0, 3.0]
