"""outputs/overview.html: every figure of the manual's index by every machine, each verdict the
most decisive of that machine's claims rows and linked to the figure in the report that judged
it. Built here from the committed claims tables (no rule runs again: fast), read back as a
reader's browser would see its cells, counts and links."""

from __future__ import annotations

import json
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from conftest import COMMITTED_MACHINES
from tunebook import figures
from tunebook.core import manual
from tunebook.present import claims, overview, report
from tunebook.results.evidence import CANNOT, DIFFERS, HOLDS, NOISE, NOT_MEASURED

REPO = Path(__file__).resolve().parents[2]
# the committed machines that judge figures (h100 holds engine-death runs only)
MACHINES = [m for m in COMMITTED_MACHINES if (REPO / "outputs" / m / "claims.json").is_file()]


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed machines of outputs/, alone: what a user ran before the suite (`make
    demo` writes outputs/quickstart) is their machine's, not one this test knows."""
    root = tmp_path_factory.mktemp("outputs")
    for m in MACHINES:
        (root / m).symlink_to(REPO / "outputs" / m, target_is_directory=True)
    (root / "index.html").symlink_to(REPO / "outputs" / "index.html")  # the page links it
    return root


class _Page(HTMLParser):
    """The overview's cells, count cells and links."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self.counts: dict[tuple[str, str], int] = {}
        self.links: list[str] = []
        self._count: tuple[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "td" and "data-figure" in a:
            self.cells.append(a)
        elif tag == "td" and "data-verdict" in a:
            self._count = (a["data-machine"], a["data-verdict"])
        elif tag == "a":
            self.links.append(a["href"])

    def handle_data(self, data: str) -> None:
        if self._count and data.strip():
            self.counts[self._count] = int(data)
            self._count = None


def _expected(rows: list[dict]) -> dict[str, str]:
    """Per figure the verdict a cell must show: holds or differs before within noise, before
    cannot run here, before not measured (and not measured with no row at all)."""
    order = {HOLDS: 0, DIFFERS: 0, NOISE: 1, CANNOT: 2, NOT_MEASURED: 3}
    out = {}
    for fig in manual.FIGURES:
        verdicts = sorted((r["verdict"] for r in rows if r["figure"] == fig), key=order.get)
        out[fig] = verdicts[0] if verdicts else NOT_MEASURED
    return out


@pytest.fixture(scope="module")
def page(committed: Path) -> str:
    return overview.to_html(overview.claims_files(committed), committed)


@pytest.fixture(scope="module")
def parsed(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    return p


def test_every_figure_by_every_machine_in_the_index_order(parsed: _Page, committed: Path) -> None:
    assert overview.machines(committed) == MACHINES
    for m in MACHINES:
        assert [c["data-figure"] for c in parsed.cells if c["data-machine"] == m] == \
            list(manual.FIGURES)
    assert len(manual.FIGURES) == 26 and len(parsed.cells) == 26 * len(MACHINES)


@pytest.mark.parametrize("machine", MACHINES)
def test_cells_and_counts_are_those_of_the_claims_rows(parsed: _Page, machine: str,
                                                       committed: Path) -> None:
    rows = json.loads((committed / machine / "claims.json").read_text())
    expected = _expected(rows)
    shown = {c["data-figure"]: c["data-verdict"] for c in parsed.cells
             if c["data-machine"] == machine}
    assert shown == expected
    counted = {v: n for (m, v), n in parsed.counts.items() if m == machine}
    assert sum(counted.values()) == 26
    assert counted == {v: Counter(expected.values())[v] for v in counted}
    assert set(Counter(expected.values())) <= set(counted)


def test_every_link_is_relative_and_lands_on_its_figure(parsed: _Page, committed: Path) -> None:
    reports = [h for h in parsed.links if report.REPORT in h]
    assert len(reports) >= 40  # every judged cell links to its report
    for href in parsed.links:
        assert "://" not in href and not href.startswith("/") and ".." not in href, href
        path, _, fragment = href.partition("#")
        target = committed / path
        assert target.is_file(), href
        if fragment:
            assert f'id="{fragment}"' in target.read_text(errors="replace"), href
    # committed reports rendered before the stable anchors: their figure headings' own ids are
    # used (cpu/ch06's); those rendered since, their stable anchors
    assert "h200/quickstart/report.html#fig-1-3" in parsed.links
    assert "cpu/ch01/report.html#fig-1-3" in parsed.links
    assert "cpu/ch06/report.html#Fig-6.1-%E2%80%94-Three-questions-pick-the-layout" in \
        parsed.links


def test_the_most_decisive_row_leads_and_the_other_is_folded(page: str) -> None:
    start = page.index('data-machine="cpu" data-figure="6.2"')
    cell = page[start:page.index("</td>", start)]
    assert 'data-verdict="holds"' in cell and "cpu/ch06-disagg/report.html" in cell
    folded = cell[cell.index("<details>"):]
    assert "cpu/ch06/report.html" in folded and "not measured" in folded
    assert "1 more experiment (another verdict)" in cell


def test_the_page_is_offline_and_shows_no_machine_path(page: str) -> None:
    assert "<script" not in page and report.external_resources(page) == []
    assert str(REPO) not in page and "/home/" not in page
    assert page.count("<details>") >= 26  # each figure's rule, each verdict's reasons


def test_no_experiment_yet_is_26_times_not_measured(tmp_path: Path) -> None:
    (tmp_path / "box" / "exp" / "runs").mkdir(parents=True)
    out = overview.write(tmp_path, overview.gather(tmp_path, {}))
    p = _Page()
    p.feed(out.read_text())
    assert {c["data-verdict"] for c in p.cells} == {NOT_MEASURED} and len(p.cells) == 26
    assert p.counts[("box", NOT_MEASURED)] == 26


def test_leads_are_short() -> None:
    """Verdict first: at most ~30 words before the folded detail, for every committed row."""
    for machine in MACHINES:
        rows = pd.DataFrame(json.loads((REPO / "outputs" / machine / "claims.json").read_text()))
        for row in rows.to_dict("records"):
            c = claims.claim_of(row)
            lead = figures.get(c.figure).lead(c)
            assert len(lead.split()) <= 32 and len(claims.headline(c)) <= 81, lead
            md = figures.verdict_markdown(c)  # a report's verdict: the same, then folded
            folded = md.index("<details>")
            assert len(md[:folded].split()) <= 36 and c.why in md[folded:], md
        html = claims.to_html(rows)
        assert html.count("<details>") == len(rows) and html.count("<tr>") == len(rows) + 1


def test_short_text_keeps_whole_clauses() -> None:
    short = figures.short_text
    assert short("[default] peak 378 tok/s at 64 users; knee at 1 users (91 tok/s)") == \
        "peak 378 tok/s at 64 users; knee at 1 users (91 tok/s)"
    # asides go first, then what does not fit, said with "…"
    assert short("KV auto: 7,282 tokens/GiB, KV fp8: 14,563 tokens/GiB (FP8 / default = "
                 "2.00)", limit=60) == "KV auto: 7,282 tokens/GiB, KV fp8: 14,563 tokens/GiB"
    assert short("a; b (c; d)", limit=80) == "a; b (c; d)"  # no split inside brackets
    assert short("x" * 30 + " " + "y" * 60, limit=40).endswith("…")
