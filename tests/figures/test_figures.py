"""The figure registry: every figure of the manual is registered once, in its chapter module, and
a manual number is written nowhere else (no engine)."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tunebook import figures
from tunebook.core import manual
from tunebook.figures import registry
from tunebook.results.evidence import VERDICTS, Evidence

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "lib" / "tunebook"
CHAPTER_MODULES = sorted((LIB / "figures").glob("ch[0-9][0-9]_*.py"))


def test_every_figure_of_the_seed_is_registered_once_in_its_chapter() -> None:
    assert list(figures.REGISTRY) and set(figures.REGISTRY) == set(manual.FIGURES)
    assert len(figures.REGISTRY) == 26
    for unit in figures.units():
        module = type(unit).__module__.rsplit(".", 1)[-1]
        assert module.startswith(f"ch{unit.chapter:02d}_"), (unit.fig, module)
        assert unit.title, unit.fig
    assert sorted(figures.CHAPTERS) == sorted({f.chapter for f in manual.FIGURES.values()})
    assert len(CHAPTER_MODULES) == len(figures.CHAPTERS)


def test_duplicates_and_unknown_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        registry.figure("1.1")(type("Again", (registry.FigureUnit,), {}))
    with pytest.raises(ValueError, match="not in the manual's index"):
        registry.figure("9.9")(type("Nowhere", (registry.FigureUnit,), {}))
    assert "9.9" not in figures.REGISTRY
    with pytest.raises(KeyError, match="no figure '9.9'"):
        figures.get("9.9")


def _params_files() -> list[Path]:
    return sorted((REPO / "params").glob("*.yaml")) + sorted((REPO / "tests").rglob("*.yaml"))


def test_every_figures_entry_names_a_registered_figure() -> None:
    named = 0
    for path in _params_files():
        if "bad_params" in path.parts:
            continue  # the bad-params corpus is broken on purpose (tests/inputs/test_bad_params.py)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue  # the bad-params corpus holds broken YAML on purpose
        if not isinstance(data, dict) or not isinstance(data.get("figures"), list):
            continue
        for fig in data["figures"]:
            assert str(fig) in figures.REGISTRY, f"{path.name}: figures: {fig}"
            named += 1
    assert named >= 10


def test_every_rule_states_its_rule_and_runs_on_nothing() -> None:
    empty = Evidence(Path("/nonexistent/exp"), pd.DataFrame(), [], {})
    for unit in figures.units():
        if type(unit).rule is not registry.FigureUnit.rule:
            doc = type(unit).rule.__doc__ or ""
            assert len(doc.split()) >= 8, f"Fig {unit.fig}: its rule's docstring states no rule"
        c = unit.rule(empty)
        assert c.figure == unit.fig and c.verdict in VERDICTS and c.why


def _distinctive(v: float) -> bool:
    """Numbers that identify a manual figure. Not: 1, 2, 16, 32 users and other small counts
    or powers of two, pixel-like hundreds (400), or one-decimal numbers such as 1.2 that read
    like figure ids."""
    if not float(v).is_integer():
        digits = len(f"{v:g}".replace(".", "").lstrip("0"))
        return (digits >= 3 or v < 1) and v != 0.5
    n = int(v)
    return n >= 90 and n & (n - 1) != 0 and not (n < 1000 and n % 100 == 0)


# "Fig 2.3", "Figs 1.1–1.3", "figures 2.1–2.6": figure ids, not numbers
FIG_IDS = re.compile(r"\b(?:Figs?|figures?)\.?\s+\d+\.\d+(?:\s*[–-]\s*\d+\.\d+)?", re.I)


def _spellings(v: float) -> list[re.Pattern[str]]:
    if float(v).is_integer():
        texts = {str(int(v)), f"{int(v):,}"}
    else:
        texts = {f"{v:g}", f"{v:.2f}".rstrip("0")}
    return [re.compile(rf"(?<![\d.,]){re.escape(t)}(?![\d,]|\.\d)") for t in texts]


def _owners() -> dict[float, set[str]]:
    """Each distinctive reference number -> the chapter modules whose figures state it."""
    out: dict[float, set[str]] = {}
    for unit in figures.units():
        for r in unit.refs:
            if _distinctive(r.value):
                out.setdefault(r.value, set()).add(type(unit).__module__.rsplit(".", 1)[-1])
    return out


def _literals(path: Path) -> list[tuple[int, object]]:
    """(line, value) of every number and string constant of a Python file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant)]


def test_no_manual_number_is_written_outside_its_figure_module() -> None:
    owners = _owners()
    assert {144.0, 96.0, 284.7, 208.8, 7300.0, 14600.0, 2.94, 0.75, 24096.0} <= set(owners)
    # notebooks are generated from these (scripts/make_notebooks.py and the registry)
    files = [*LIB.rglob("*.py"), *(REPO / "scripts").glob("*.py")]
    found = []
    for path in files:
        for line, value in _literals(path):
            for v, mods in owners.items():
                if path.stem in mods:
                    continue
                if isinstance(value, int | float) and not isinstance(value, bool):
                    hit = math.isclose(float(value), v, rel_tol=1e-9)
                elif isinstance(value, str):
                    hit = any(p.search(FIG_IDS.sub(" ", value)) for p in _spellings(v))
                else:
                    hit = False
                if hit:
                    found.append(f"{path.relative_to(REPO)}:{line}: {v:g} (Fig of {sorted(mods)})")
    assert not found, "manual numbers outside their figure's module:\n" + "\n".join(found)


def test_notebooks_are_generated_from_the_registry() -> None:
    for ch in figures.CHAPTERS.values():
        if not ch.notebook:
            continue
        cells = json.loads((REPO / "notebooks" / f"{ch.notebook}.ipynb").read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells)
        for unit in ch.figures:
            assert f'wb.figure("{unit.fig}")' in text and unit.title in text
