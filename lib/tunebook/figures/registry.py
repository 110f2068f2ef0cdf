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

import inspect
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.core import manual
from tunebook.core.manual import DEFAULT_MODEL, RESULT, SETTING, SOURCE, Ref
from tunebook.results.evidence import CANNOT, NOT_MEASURED, VERDICT_ICON, Claim, Evidence


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
        parts = [f"{what}: {value}"
                 for what, value in charts.reference_lines(self.results, self.model)]
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

    def rule_text(self) -> str:
        """The rule as its docstring states it: what every verdict of this figure applies."""
        return inspect.getdoc(type(self).rule) or ""

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

    def manual_numbers(self) -> str:
        """The manual's numbers in a few words ("8×, ≈7.5× on DGX Spark"); "" when the claim
        states none."""
        nums = numbers_text(self.results)
        return f"{nums} on {self.hardware}" if nums and self.hardware else nums

    def headline(self, c: Claim) -> str:
        """What was measured, in a few words: the lead of a verdict (the whole text stays in
        ``c.measured``). The first clauses of the measured text — of the reason when the
        figure cannot run here or nothing was measured — asides dropped where they do not
        fit (``short_text``)."""
        text = c.measured if c.verdict != CANNOT and c.measured.strip() not in ("", "—") \
            else c.why
        return short_text(text)

    def lead(self, c: Claim) -> str:
        """The verdict in one line of at most ~30 words: verdict, where, what was measured,
        and the manual's numbers."""
        manual = self.manual_numbers()
        return (f"{c.verdict} on {c.hardware or 'this machine'}: {self.headline(c)}"
                + (f" (manual: {manual})" if manual else ""))

    def markdown(self, c: Claim) -> str:
        """The verdict shown above the chart: the lead, then the manual's numbers, what was
        measured and why in full, one click away (a ``<details>`` block)."""
        manual = self.manual_numbers()
        return (f"**Fig {c.figure} — {VERDICT_ICON.get(c.verdict, '')} {c.verdict}** on "
                f"{c.hardware or 'this machine'}: {self.headline(c)}"
                + (f" *(manual: {manual})*" if manual else "") + ".\n\n"
                "<details><summary>The manual, the measurement and why</summary>\n\n"
                f"*Manual (reference):* {c.manual}. *Measured here:* {c.measured}. "
                f"*Why:* {c.why}.\n\n</details>\n")


def _top_level(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` outside brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        depth += ch in "([{"
        depth -= depth > 0 and ch in ")]}"
        if depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i = start = i + len(sep)
            continue
        i += 1
    return [*parts, text[start:]]


def _fit(clause: str, limit: int) -> str:
    """One clause in ``limit`` characters, the first of these that fits: the clause; without
    its asides in parentheses; its first comma-separated parts; its part before a colon;
    its first words. Cut ones end in "…"."""
    if len(clause) <= limit:
        return clause
    bare = re.sub(r"\s+\([^()]*(?:\([^()]*\)[^()]*)*\)", "", clause).strip()
    if len(bare) <= limit:
        return bare
    parts = _top_level(bare, ", ")
    kept = parts[0]
    for p in parts[1:]:
        if len(kept) + len(p) + 3 > limit:
            break
        kept += ", " + p
    for cut in (kept, _top_level(clause, ": ")[0], _top_level(bare, ": ")[0]):
        if len(cut) + 1 <= limit:
            return cut + "…"
    return bare[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:( ") + "…"


def short_text(text: str, limit: int = 80) -> str:
    """A verdict's text cut to about ``limit`` characters, in whole clauses where it can: the
    engine label in front ("[default] ") dropped, then the clauses (up to "; " or ". ") that
    fit — the first always, shortened by ``_fit`` when alone it is too long."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", " ".join(str(text).split()))
    clauses = [c.strip() for part in _top_level(text, "; ") for c in _top_level(part, ". ")
               if c.strip()]
    if not clauses:
        return ""
    out = _fit(clauses[0].rstrip("."), limit)
    for c in clauses[1:]:
        c = c.rstrip(".")
        if out.endswith("…") or len(out) + 2 + len(c) > limit:
            break
        out += "; " + c
    return out


def numbers_text(refs: tuple[Ref, ...]) -> str:
    """Reference numbers in a few words: "8×, ≈7.5×"; numbers that share a unit name it once,
    "3, 3, 5 draft tokens"; units apart by "; "."""
    groups: list[tuple[str, list[str]]] = []
    for r in refs:
        text = charts.ref_text(r)
        value = text if r.unit == "x" else text.removesuffix(" " + r.unit)
        if groups and groups[-1][0] == r.unit:
            groups[-1][1].append(value)
        else:
            groups.append((r.unit, [value]))
    return "; ".join(", ".join(vals) + ("" if unit == "x" else f" {unit}")
                     for unit, vals in groups)


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
