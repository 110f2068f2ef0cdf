"""The manual's figures, one unit per figure, one module per chapter (see ``registry``).

    from tunebook import figures
    unit = figures.get("2.6")          # FigureUnit: refs, narrative, table, rule, chart
    figures.verdict(ev, "2.6")         # -> Claim
    figures.chart(ev, "2.6")           # -> altair chart, or None when nothing here stands for it

Importing this package registers every chapter module below; nothing else lists figures.
"""

from __future__ import annotations

import altair as alt

# Registration happens on import: each chapter module's @figure units land in REGISTRY.
from tunebook.figures import (  # noqa: F401
    ch01_engine,
    ch02_memory,
    ch03_scheduler,
    ch04_speculation,
    ch05_benchmarking,
    ch06_layouts,
    ch07_troubleshooting,
    ch08_internals,
)
from tunebook.figures.registry import (
    CHAPTERS,
    REGISTRY,
    Chapter,
    FigureUnit,
    Needs,
    get,
    reference_frame,
    short_text,
    units,
)
from tunebook.results.evidence import CANNOT, Claim, Evidence


def verdict(ev: Evidence, fig: str) -> Claim:
    """The rule of Fig ``fig`` applied to ``ev`` (the rows of the parts that stand for it)."""
    return get(fig).rule(ev.for_figure(fig))


def chart(ev: Evidence, fig: str, claim: Claim | None = None) -> alt.TopLevelMixin | None:
    """The figure's chart, or None when nothing here can stand for it: the figure cannot run
    on this machine, or there is no ok run and the figure is not a model property."""
    unit = get(fig)
    ev = ev.for_figure(fig)
    c = claim or unit.rule(ev)
    if c.verdict == CANNOT and not unit.chart_when_unmeasured:
        return None
    if ev.ok.empty and not unit.chart_when_unmeasured:
        return None
    return unit.chart(ev)


def verdict_markdown(c: Claim) -> str:
    return get(c.figure).markdown(c)


def chapter(number: int) -> Chapter:
    try:
        return CHAPTERS[number]
    except KeyError:
        raise KeyError(f"no chapter {number}; chapters: {sorted(CHAPTERS)}") from None


__all__ = ["CHAPTERS", "REGISTRY", "Chapter", "FigureUnit", "Needs", "chapter", "chart", "get",
           "reference_frame", "short_text", "units", "verdict", "verdict_markdown"]
