"""Reports without copies (issue 34): report.html keeps only the CSS its markup can use, and a
saved notebook keeps a chart's Vega-Lite spec, its SVG drawn into report.html. That the page
looks the same, pixel for pixel, is checked in headless Chromium (tests/present/test_browser.py,
test_slimmed_report_looks_the_same)."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import nbformat
import pandas as pd
import pytest

from tunebook.core import config
from tunebook.present import browser, report, slim_css

PAGE = """<html><head><style>
/* a comment */
:root { --used: 1px; --chain: var(--deep); --deep: red; --unused: url("data:x;y"); }
.kept { color: var(--chain); }
.gone, .also-gone > .x { color: blue; }
.a .b { margin: var(--used); }
.kept:not(.absent) { padding: 0; }
div[data-x="a,b"] { border: 0; }
@media print { .gone { top: 0; } .kept { top: 1px; } }
@media screen { .gone { top: 0; } }
@font-face { font-family: f; src: url(f.woff); }
</style></head>
<body><div class="kept a" id="i"><span class='b'>x</span><p style="width: var(--inline)">
</p></div></body></html>"""


def test_rules_the_markup_cannot_match_are_dropped() -> None:
    out = slim_css.slim_page(PAGE)
    css = out.split("<style>")[1].split("</style>")[0]
    assert ".gone" not in css and "also-gone" not in css and "a comment" not in css
    for kept in (".kept { color", ".a .b", ".kept:not(.absent)", 'div[data-x="a,b"]',
                 "@media print", ".kept { top: 1px; }", "@font-face"):
        assert kept in css, kept
    assert "@media screen" not in css  # nothing left inside it
    # custom properties: kept where used, directly or through another one
    assert "--used: 1px" in css and "--chain: var(--deep)" in css and "--deep: red" in css
    assert "--unused" not in css
    assert out.split("</style>")[1] == PAGE.split("</style>")[1]  # the markup untouched


def test_a_page_that_would_not_shrink_is_left_as_it_was() -> None:
    page = "<html><head><style>.k{color:red}</style></head><body class='k'></body></html>"
    assert slim_css.slim_page(page) == page


def _chart_notebook(path: Path, svg: str | None) -> dict:
    # a continuous colour legend: drawn with a gradient
    spec = alt.Chart(pd.DataFrame({"x": [1, 2], "y": [3, 4]})).mark_point().encode(
        x="x", y="y", color="y:Q").to_dict()
    data = {report.VEGALITE_MIME: spec, "text/plain": "<chart>"}
    if svg is not None:
        data["image/svg+xml"] = svg
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "chart", outputs=[nbformat.v4.new_output("display_data", data=data)])])
    path.write_text(nbformat.writes(nb))
    return spec


def _chart_data(path: Path) -> dict:
    return nbformat.read(str(path), as_version=4).cells[0].outputs[0]["data"]


def test_a_chart_copy_is_dropped_only_where_the_spec_redraws_it(tmp_path: Path) -> None:
    nb = tmp_path / "a.ipynb"
    spec = _chart_notebook(nb, "placeholder")
    drawn = report._svg(spec)
    assert drawn and report._svg(spec) != drawn  # vega numbers gradients per process…
    assert report.same_svg(report._svg(spec), drawn)  # …which same_svg looks past
    _chart_notebook(nb, drawn)
    assert report.drop_chart_copies(nb) > 0
    assert "image/svg+xml" not in _chart_data(nb) and report.VEGALITE_MIME in _chart_data(nb)
    assert report.drop_chart_copies(nb) == 0  # nothing left to drop
    other = tmp_path / "b.ipynb"  # drawn elsewhere (other fonts): a copy worth keeping
    _chart_notebook(other, drawn.replace('width="', 'width="1', 1))
    assert report.drop_chart_copies(other) == 0 and "image/svg+xml" in _chart_data(other)
    # the report draws the dropped copy again
    html = report.to_html(nb, tmp_path / "report.html").read_text()
    assert len(browser.report_svgs(html)) == 1


def test_a_batch_run_saves_the_spec_and_an_interactive_one_the_svg_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = alt.Chart(pd.DataFrame({"x": [1]})).mark_point().encode(x="x").to_dict()
    monkeypatch.setenv(config.BATCH_ENV, "1")
    assert set(report._svg_and_spec(spec)) == {report.VEGALITE_MIME, "text/plain"}
    monkeypatch.delenv(config.BATCH_ENV)
    assert "image/svg+xml" in report._svg_and_spec(spec)
