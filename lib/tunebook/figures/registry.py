"""The figure registry: one unit per figure of the manual, registered by decorator.

A figure unit (a :class:`FigureUnit` subclass in its chapter module) holds everything about
one figure in one place: the manual's reference numbers (``refs``: the only place a manual
number is written), its title and narrative, what it needs to be measured (``needs``), the
table it derives from stored rows (``table``), its rule (``rule``, whose docstring states the
rule), and its chart (``chart``, or just a declarative ``plot`` spec). The claim's words come
from the manual's index (``tunebook.core.manual``)::

    @figure("3.1")
    class CapMaxNumSeqs(FigureUnit):
        title = "Capping max_num_seqs"
        refs = (result("output_tok_s_cap16_32_users", 172, "tok/s", "..."), ...)
        plot = charts.Curves(y="output_tok_s")

        def rule(self, ev: Evidence) -> Claim:
            '''Holds when ...'''

Registering the same figure twice, or a figure the manual's index lacks, is refused at import.
Everything else — claims tables, chapter notebooks, the index, the params check of
``figures:`` — reads this registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.core import manual
from tunebook.core.manual import DEFAULT_MODEL, RESULT, SETTING, SOURCE, Ref
from tunebook.results.evidence import NOT_MEASURED, VERDICT_ICON, Claim, Evidence


@dataclass(frozen=True)
class Needs:
    """What measuring a figure takes; a machine that lacks it gets 'cannot run here'."""

    gpu: bool = False  # GPU kernels or GPU memory accounting (FP8 weights, the memory budget)
    gpus: int = 1  # GPUs in one engine (tensor parallelism)
    knobs: tuple[str, ...] = ()  # engine knobs the params must vary
    real_weights: bool = False  # random (dummy) weights make it meaningless
    peer_engine: str | None = None  # another serving engine beside vLLM (SGLang)
    measured: bool = True  # False: an illustration or a decision guide, nothing to measure

    def text(self) -> str:
        parts = []
        if not self.measured:
            parts.append("an illustration: nothing to measure")
        if self.gpu:
            parts.append(f"{self.gpus} GPU(s)" if self.gpus > 1 else "a GPU")
        elif self.gpus > 1:
            parts.append(f"{self.gpus} GPUs")
        if self.knobs:
            parts.append("knobs " + ", ".join(self.knobs))
        if self.real_weights:
            parts.append("real weights (dummy weights make it meaningless)")
        if self.peer_engine:
            parts.append(f"{self.peer_engine} beside vLLM")
        return "; ".join(parts) or "any machine"


@dataclass(frozen=True)
class Chapter:
    number: int
    title: str
    notebook: str | None  # notebooks/<name>.ipynb, generated from the registry; None: none yet
    intro: str  # markdown: what the chapter shows and how to run it
    extras: tuple[tuple[str, str], ...] = ()  # (markdown, code) cells after the figures

    @property
    def figures(self) -> list[FigureUnit]:
        return [u for u in REGISTRY.values() if u.chapter == self.number]


class FigureUnit:
    """One figure of the manual. Subclass it in the chapter module and decorate with
    ``@figure("N.M")``; override what the figure needs, keep the defaults for the rest."""

    fig: ClassVar[str] = ""  # set by @figure
    title: ClassVar[str] = ""
    narrative: ClassVar[str] = ""  # markdown shown above the figure in its chapter notebook
    refs: ClassVar[tuple[Ref, ...]] = ()  # the manual's numbers (reference data)
    note: ClassVar[str | None] = None  # what the claim leaves open
    model: ClassVar[str] = DEFAULT_MODEL
    needs: ClassVar[Needs] = Needs()
    plot: ClassVar[charts.Curves | None] = None  # the declarative chart, when one is enough
    chart_when_unmeasured: ClassVar[bool] = False  # a model property draws without runs

    # -- the manual ---------------------------------------------------------------------------
    @property
    def seed(self) -> manual.SeedFigure:
        return manual.figure(self.fig)

    @property
    def claim(self) -> str:
        return self.seed.claim

    @property
    def chapter(self) -> int:
        return self.seed.chapter

    @property
    def hardware(self) -> str | None:
        return self.seed.hardware

    @property
    def results(self) -> tuple[Ref, ...]:
        return tuple(r for r in self.refs if r.kind == RESULT)

    @property
    def settings(self) -> tuple[Ref, ...]:
        return tuple(r for r in self.refs if r.kind == SETTING)

    def ref(self, name: str) -> Ref:
        for r in self.refs:
            if r.name == name:
                return r
        raise KeyError(f"Fig {self.fig} has no ref {name!r}; it has {[r.name for r in self.refs]}")

    def manual_text(self) -> str:
        """The manual's numbers in a line, with the machine they came from."""
        parts = [f"{r.meaning}: {charts.ref_text(r)}" for r in self.results]
        where = self.hardware or "machine not named"
        return "; ".join(parts) + f" ({where}, {self.model})" if parts else f"({where})"

    def reference_panel(self) -> alt.LayerChart:
        return charts.manual_panel(self.fig, self.refs, self.claim, self.note,
                                   self.hardware, self.model)

    # -- verdicts -----------------------------------------------------------------------------
    def verdict(self, ev: Evidence, measured: str, verdict: str, why: str,
                value: float | None = None, reference: float | None = None) -> Claim:
        """A Claim of this figure on ``ev``."""
        return Claim(self.fig, self.claim, self.manual_text(), measured, verdict, why,
                     ev.hardware, ev.experiment, value, reference)

    def rule(self, ev: Evidence) -> Claim:
        """No rule yet: the figure is registered with the manual's numbers, not measured."""
        return self.verdict(ev, "—", NOT_MEASURED,
                            f"no rule yet for Fig {self.fig}; it needs {self.needs.text()}")

    # -- what it derives and draws --------------------------------------------------------
    def table(self, ev: Evidence) -> pd.DataFrame:
        """The rows the chart draws (default: the ok rows)."""
        return ev.ok

    def chart(self, ev: Evidence) -> alt.TopLevelMixin | None:
        """The measured chart beside the manual's (default: ``plot`` beside the reference)."""
        if self.plot is None:
            return None
        return charts.beside(charts.curves(ev.df, self.plot), self.reference_panel())

    def markdown(self, c: Claim) -> str:
        """The verdict line shown above the chart."""
        return (f"**Fig {c.figure} — {VERDICT_ICON.get(c.verdict, '')} {c.verdict}** on "
                f"{c.hardware or 'this machine'}. *Manual (reference):* {c.manual}. "
                f"*Measured here:* {c.measured}. *Why:* {c.why}.")


REGISTRY: dict[str, FigureUnit] = {}
CHAPTERS: dict[int, Chapter] = {}


def figure(fig: str) -> Callable[[type[FigureUnit]], type[FigureUnit]]:
    """Class decorator: register the unit of Fig ``fig`` (once; it must be in the index)."""

    def register(cls: type[FigureUnit]) -> type[FigureUnit]:
        if fig in REGISTRY:
            raise ValueError(f"Fig {fig} is registered twice: {type(REGISTRY[fig]).__name__} "
                             f"and {cls.__name__}")
        if fig not in manual.FIGURES:
            raise ValueError(f"Fig {fig} is not in the manual's index ({manual.INDEX_PATH.name})")
        if not issubclass(cls, FigureUnit):
            raise TypeError(f"{cls.__name__} must subclass FigureUnit")
        cls.fig = fig
        REGISTRY[fig] = cls()
        return cls

    return register


def chapter(number: int, title: str, notebook: str | None, intro: str,
            extras: tuple[tuple[str, str], ...] = ()) -> Chapter:
    """Register a chapter (one per chapter module)."""
    if number in CHAPTERS:
        raise ValueError(f"chapter {number} is registered twice")
    CHAPTERS[number] = Chapter(number, title, notebook, intro, extras)
    return CHAPTERS[number]


def get(fig: str) -> FigureUnit:
    try:
        return REGISTRY[str(fig)]
    except KeyError:
        raise KeyError(f"no figure {fig!r} is registered; figures: "
                       f"{', '.join(sorted(REGISTRY, key=manual.fig_key))}") from None


def units() -> Iterator[FigureUnit]:
    """Every registered figure, in the manual's order."""
    for fig in sorted(REGISTRY, key=manual.fig_key):
        yield REGISTRY[fig]


FRAME_COLUMNS = (
    "fig", "ref", "value", "unit", "meaning", "qualifier", "kind", "hardware", "model", "source",
)


def reference_frame(figs: Any = None) -> pd.DataFrame:
    """One row per Ref of the given figures (all when None), labelled as reference data."""
    chosen = [get(f) for f in figs] if figs is not None else list(units())
    rows = [{"fig": u.fig, "ref": r.name, "value": r.value, "unit": r.unit,
             "meaning": r.meaning, "qualifier": r.qualifier, "kind": r.kind,
             "hardware": u.hardware, "model": r.model or u.model, "source": SOURCE}
            for u in chosen for r in u.refs]
    return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))
