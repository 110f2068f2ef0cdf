"""The vLLM manual's index of figures (the seed): each figure's claim, as the manual words it.

The claims are parsed from ``data/figure-index.txt``, a copy of the manual's own index shipped
with the package. The numbers each claim states are NOT here: they are :class:`Ref` rows in the
figure's chapter module (``tunebook.figures.chNN_*``), the one place a manual number is
written, always labelled as reference data and never mixed with what was measured here.

The manual measured on a DGX Spark and an NVIDIA L4 with Qwen3-8B; where a claim names no
machine, ``SeedFigure.hardware`` is None (we do not guess).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunebook.core import config

INDEX_PATH = config.package_data("figure-index.txt")
DEFAULT_MODEL = "Qwen3-8B"

# Ref.kind: what the figure observed, or a condition it was observed under.
RESULT = "result"
SETTING = "setting"


@dataclass(frozen=True)
class Ref:
    """One number a claim states."""

    name: str  # snake_case, unit in the name: output_tok_s_default_32_users
    value: float
    unit: str  # "x" is a ratio; "%" a percentage
    meaning: str  # one line
    qualifier: str = "="  # "=" stated, "≈" "about", ">" "more than", "≤" "within"/"up to"
    kind: str = RESULT  # RESULT or SETTING
    model: str | None = None  # overrides Figure.model when a claim names two models


@dataclass(frozen=True)
class SeedFigure:
    """One row of the manual's index: the claim as the manual words it."""

    fig: str  # "1.3"
    chapter: int
    claim: str  # verbatim from the index
    hardware: str | None  # "DGX Spark", "L4", or None when the claim names no machine


@dataclass(frozen=True)
class Edition:
    vllm_version: str  # "0.31.0"
    vllm_commit: str  # "db9527a"
    date: str  # "2026-10-05"
    edition: str  # "2026.10"

    @property
    def label(self) -> str:
        return f"Edition {self.edition}"


# Digits in a claim that are names, not numbers the figure states (checked by the tests).
NOT_MEASUREMENTS: dict[str, str] = {
    "Qwen3-30B-A3B": "model name",
    "Qwen3-8B": "model name",
    "BF16": "dtype name",
    "FP8": "dtype name",
    "L4": "GPU name (NVIDIA L4)",
    "99th percentile": "the metric's name (P99)",
    "P99": "the metric's name",
}


def result(name: str, value: float, unit: str, meaning: str, qualifier: str = "=",
           model: str | None = None) -> Ref:
    """A number the figure observed (its chapter module is the only place it is written)."""
    return Ref(name, float(value), unit, meaning, qualifier, RESULT, model)


def setting(name: str, value: float, unit: str, meaning: str, qualifier: str = "=") -> Ref:
    """A condition the figure was observed under (users, a knob's value)."""
    return Ref(name, float(value), unit, meaning, qualifier, SETTING)


def _hardware(claim: str) -> str | None:
    if "DGX Spark" in claim:
        return "DGX Spark"
    if re.search(r"\bL4\b", claim):
        return "L4"
    return None


def _parse_edition(line: str) -> Edition:
    version, commit, date, edition = (p.strip() for p in line.split("·"))
    return Edition(
        vllm_version=version.removeprefix("vLLM").strip(),
        vllm_commit=commit,
        date=date,
        edition=edition.removeprefix("Edition").strip(),
    )


def _parse(text: str) -> tuple[dict[str, SeedFigure], Edition]:
    figures: dict[str, SeedFigure] = {}
    for m in re.finditer(r"^(\d+)\.(\d+)\s+(\S.*?)\s*$", text, flags=re.M):
        fig, claim = f"{m[1]}.{m[2]}", m[3]
        figures[fig] = SeedFigure(fig=fig, chapter=int(m[1]), claim=claim,
                                  hardware=_hardware(claim))
    last = [ln for ln in text.splitlines() if ln.strip()][-1]
    return figures, _parse_edition(last)


FIGURES, EDITION = _parse(INDEX_PATH.read_text(encoding="utf-8"))
SOURCE = f"vLLM manual, {EDITION.label} — reference, not measured here"



def figure(fig: str) -> SeedFigure:
    """FIGURES[fig], with an error that lists the figures there are."""
    try:
        return FIGURES[str(fig)]
    except KeyError:
        raise KeyError(f"no Fig {fig!r} in the manual; figures: {', '.join(FIGURES)}") from None


def fig_key(fig: str) -> tuple[int, ...]:
    """Sort key: "2.10" after "2.9"."""
    return tuple(int(x) for x in str(fig).split("."))
