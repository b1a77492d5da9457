"""The figure catalogue: every figure module imported once (each registers its figures with
:func:`~dyntool.figures.registry.figure`), then :func:`plan` picks the figures some runs support.

Kept apart from the registry so the registry imports no figure module and no figure module
imports this one: the imports run one way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .registry import FIGURES, FigureError, FigureSpec

_loaded = False


def load() -> dict[str, FigureSpec]:
    """Import the figure modules (once) and return :data:`FIGURES`."""
    global _loaded
    if not _loaded:
        # deferred: torch (atlas, icl_markov) loads with the first figure asked for, not with dyntool.figures
        from . import (atlas, bijection, controls, dynamics, frame_precision, geometry, icl_markov, ls,  # noqa: F401
                       ls_logits, recorded, span, sticky)  # imported for their side effect: each registers its figures
        groups = ("dynamics", "ls", "span", "recorded")
        ordered = sorted(FIGURES.items(), key=lambda kv: (groups.index(kv[1].group)
                                                          if kv[1].group in groups else 9, kv[0]))
        FIGURES.clear()
        FIGURES.update(ordered)
        _loaded = True
    return FIGURES


@dataclass
class Plan:
    """What :func:`plan` decided for each figure."""
    ready: dict[str, FigureSpec] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def plan(runs: list, only: list[str] | None = None) -> Plan:
    figs = load()
    if only:
        unknown = [n for n in only if n not in figs]
        if unknown:
            raise FigureError(f"unknown figure(s) {', '.join(unknown)}; known: {', '.join(figs)}")
    out = Plan()
    for name, spec in figs.items():
        if only and name not in only:
            continue
        ok, why = spec.supports(runs)
        if ok:
            out.ready[name] = spec
        else:
            out.skipped[name] = why
    return out
