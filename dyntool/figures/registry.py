"""The figure registry: ``FIGURES[name] -> FigureSpec``.

A :class:`FigureSpec` knows which runs it can use (``kind_needed``, :meth:`FigureSpec.select`),
whether they hold what it needs (:meth:`FigureSpec.supports` -> ``(ok, reason)``), and how to draw
(``draw(runs, **opts) -> (Figure, data, caption)``, data a DataFrame (written as CSV) or a dict
(JSON)).  ``draw`` may raise :class:`FigureSkip` when it finds out late that something is
missing; :mod:`dyntool.figures.writer` turns that into a "skipped: reason" line.

Figures register themselves at import of their modules :mod:`dyntool.figures.dynamics`,
``.sticky``, ``.controls`` (the sticky study's learning-rate comparisons), ``.geometry``,
``.frame_precision``, ``.bijection``, ``.ls``, ``.ls_logits``, ``.span`` and
``.recorded`` (any run's recorded matrices and per-head statistics)
(imported by :func:`dyntool.figures.catalog.load`, which ``dyntool.figures`` calls).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import DyntoolError


class FigureError(DyntoolError):
    """A bad figure request (e.g. an unknown name in ``--only``)."""


class FigureSkip(FigureError):
    """The given runs lack something a figure needs; the message says what."""


@dataclass(frozen=True)
class FigureSpec:
    name: str
    title: str
    kind_needed: tuple[str, ...]                       # run kinds the figure reads
    draw: Callable[..., tuple[Any, Any, str]]          # draw(runs, **opts) -> (fig, data, caption)
    needs: str = ""                                    # what it needs, in words (CLI --list, docs)
    group: str = ""                                    # "dynamics" | "ls" | "span"
    check: Callable[[list], tuple[bool, str]] | None = None   # finer check on the selected runs
    pick: Callable[[list], list] | None = None         # choose among the selected runs (e.g. a study)
    min_runs: int = 1

    def select(self, runs: list) -> list:
        """The runs of the kinds this figure reads (in the given order), narrowed by ``pick``."""
        sel = [r for r in runs if r.kind in self.kind_needed]
        return self.pick(sel) if (self.pick is not None and sel) else sel

    def supports(self, runs: list) -> tuple[bool, str]:
        of_kind = [r for r in runs if r.kind in self.kind_needed]
        n = "a run" if self.min_runs == 1 else f"{self.min_runs} runs"
        if len(of_kind) < self.min_runs:
            kinds = " or ".join(repr(k) for k in self.kind_needed)
            have = sorted({r.kind for r in runs})
            return False, f"needs {n} of kind {kinds} (given: {', '.join(have) if have else 'no runs'})"
        sel = self.select(runs)
        if len(sel) < self.min_runs:        # the kind is right, but pick found nothing it can draw
            why = f"needs {self.needs}" if self.needs else f"needs {n} it can draw"
            if self.check is not None and sel:      # checks read runs[0]: never given none
                try:
                    ok, said = self.check(sel)
                    why = said if not ok and said else why
                except FigureSkip as e:
                    why = str(e)
            broken = [f"{r.id}: {r.problems[0]}" for r in of_kind if r.problems]
            return False, why + (f" (a given run has problems: {broken[0]})" if broken else "")
        if self.check is not None:
            try:
                return self.check(sel)
            except FigureSkip as e:
                return False, str(e)
        return True, ""


FIGURES: dict[str, FigureSpec] = {}


def register(spec: FigureSpec) -> FigureSpec:
    if spec.name in FIGURES:
        raise ValueError(f"figure {spec.name!r} registered twice")
    FIGURES[spec.name] = spec
    return spec


def figure(name: str, title: str, kind_needed, needs: str = "", group: str = "", check=None,
           pick=None, min_runs: int = 1):
    """Decorator form of :func:`register` for a draw function."""
    kinds = (kind_needed,) if isinstance(kind_needed, str) else tuple(kind_needed)

    def deco(fn):
        register(FigureSpec(name, title, kinds, fn, needs, group, check, pick, min_runs))
        return fn
    return deco
