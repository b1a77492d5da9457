"""The table a study printed when it finished, drawn again from its ``summary.json`` for
``dyntool info STUDY`` (a flattened key listing is no way to read a study's arms).

Each study kind is recognised by what its summary holds and rendered by the study's own table
function, so ``info`` shows what the study printed; a summary of an older or unknown layout
returns None, and ``info`` falls back to listing its values.
"""
from __future__ import annotations

import contextlib
import io
import math

from ..sims.summary import table as sticky_table
from ..train.ls_logits import print_summary as ls_logits_summary
from ..train.span_study import table as span_table


def _printed(fn, summary: dict) -> str:
    """What a study's ``print_summary`` prints, as text."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(summary)
    return out.getvalue().strip("\n")


def _sticky(s: dict) -> str:
    return sticky_table(s)


def _separable(s: dict) -> str:
    from ..sims.separable import table          # deferred: keeps torch off `dyntool info` of other studies
    return table(s)


def _icl_markov(s: dict) -> str:
    from ..sims.icl_markov_study import table   # deferred: keeps torch off `dyntool info` of other studies
    return table(s)


def _ls_logits(s: dict) -> str:
    return _printed(ls_logits_summary, s)


def _atlas(s: dict) -> str:
    from ..train.atlas import print_summary     # deferred: keeps torch off `dyntool info` of other studies
    return _printed(print_summary, s)


def _span(s: dict) -> str:
    """Per seed: both arms' final validation loss and the span arm's relative change, then the
    mean ± std over seeds (the table ``dyntool study span`` prints; a study with ``arms``, every
    reading it ran, by the study's own table)."""
    if "arms" in s:
        return span_table(s)
    def f(x, w, p=4):
        return f"{x:{w}.{p}f}" if isinstance(x, (int, float)) and math.isfinite(x) else " " * (w - 1) + "-"
    lines = [f"{'seed':>4}  {'baseline val':>12}  {'span val':>10}  {'Δ% final':>9}  {'Δ% best':>8}"]
    for r in s["seeds"]:
        lines.append(f"{r['seed']:>4}  {f(r['baseline']['final_val_loss'], 12)}  {f(r['span']['final_val_loss'], 10)}  "
                     f"{f(r['rel_change_pct'], 9, 3)}  {f(r['rel_change_best_pct'], 8, 3)}")
    m, sd = s.get("rel_change_pct_mean"), s.get("rel_change_pct_std")
    if isinstance(m, (int, float)) and math.isfinite(m):
        lines.append(f"relative validation-loss change: {m:+.3f} ± {sd:.3f} % (final); "
                     f"paper: {s.get('paper_rel_change_pct', -0.56)} %")
    return "\n".join(lines)


# (does this summary look like the study's, its table); the first match renders
RENDERERS = (
    (lambda s: "final" in s and "entropy_gap" in s and "h_min" in s, _sticky),
    (lambda s: s.get("kind") == "sticky-separable", _separable),
    (lambda s: "priors" in s and "k" in s, _icl_markov),
    (lambda s: s.get("study") == "span", _span),
    (lambda s: s.get("study") == "ls-logits", _ls_logits),
    (lambda s: s.get("study") == "atlas", _atlas),
)


def study_table(summary: dict) -> list[str] | None:
    """The study's table as lines, or None when the summary is of no known kind or is missing
    something its table needs (an older layout, a hand edit)."""
    for looks_like, render in RENDERERS:
        if looks_like(summary):
            try:
                return render(summary).splitlines()
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                return None
    return None
