"""Shared reports open offline: headless Chromium (Debian's package, through selenium) with
the network off loads each page and counts the charts that actually rendered; the overview's
links land on their figures; a report prints to PDF."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import altair as alt
import pandas as pd
import pytest

from conftest import committed as committed_files
from tunebook.cli import EXIT_OK, main
from tunebook.present import browser, compare, index, overview, report

REPO = Path(__file__).resolve().parents[2]

if browser.find_chromium() is None:
    # CI installs chromium (.ci/run) and sets TUNEBOOK_REQUIRE_BROWSER: there a skip is a failure
    if os.environ.get("TUNEBOOK_REQUIRE_BROWSER"):
        raise RuntimeError("chromium/chromedriver missing but TUNEBOOK_REQUIRE_BROWSER is set")
    pytest.skip("needs chromium and chromedriver (apt-get install chromium chromium-driver)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def drv():
    with browser.chromium(offline=True) as d:
        yield d


@pytest.fixture(scope="module")
def experiments(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Copies of committed CPU and H200 experiments, their reports rendered afresh by this
    checkout's code (so the test checks today's renderer, not yesterday's file)."""
    root = tmp_path_factory.mktemp("outputs")
    for machine in ("cpu", "h200"):
        dst = root / machine / "ch01"
        shutil.copytree(REPO / "outputs" / machine / "ch01", dst)
        (dst / "report.html").unlink()
        report.to_html(report.latest_notebook(dst))
    index.write(root)
    return root


def test_network_is_really_off(drv) -> None:
    with pytest.raises(Exception, match="ERR_INTERNET_DISCONNECTED|ERR_NAME_NOT|ERR_PROXY"):
        drv.get("https://example.com/")


def test_rendered_notebook_charts_show_offline(drv, experiments: Path) -> None:
    for machine in ("cpu", "h200"):
        page = experiments / machine / "ch01" / "report.html"
        r = browser.rendered(drv, page)
        assert r.remote == [], r
        # Fig 1.1 table, Fig 1.2 process tree, Fig 1.3 beside the manual, latency percentiles
        assert r.images >= 4 and r.images_ok == r.images, r


def test_comparison_page_draws_offline(drv, experiments: Path, tmp_path: Path) -> None:
    out = compare.write([experiments / "cpu" / "ch01", experiments / "h200" / "ch01"],
                        tmp_path / "cmp.html")
    r = browser.rendered(drv, out, settle_s=3.0)
    assert r.remote == [] and r.svgs + r.canvases >= 1, r


def test_slimmed_report_looks_the_same(drv, experiments: Path, tmp_path: Path) -> None:
    """Issue 34: report.html without the CSS its markup cannot use (slim_css, ~245 KB of the
    lab template's ~265 KB) is the same page, pixel for pixel, as with all of it."""
    exp = experiments / "cpu" / "ch01"
    full = report.to_html(report.latest_notebook(exp), tmp_path / "full.html", slim=False)
    slim = exp / "report.html"
    assert slim.stat().st_size < full.stat().st_size - 200_000
    drv.get(full.as_uri())
    height = drv.execute_script("return document.documentElement.scrollHeight")
    drv.set_window_size(1400, height)
    try:
        shots = []
        for page in (full, slim):
            browser.rendered(drv, page)  # loaded and settled
            shots.append(drv.get_screenshot_as_png())
        assert shots[0] == shots[1]
    finally:
        drv.set_window_size(1400, 1000)


def test_index_links_open(drv, experiments: Path) -> None:
    drv.get((experiments / "index.html").as_uri())
    links = [a.get_attribute("href") for a in drv.find_elements("css selector", "a")]
    reports = [u for u in links if u.endswith("/report.html")]
    assert len(reports) == 2
    assert browser.rendered(drv, reports[0]).images_ok >= 4


def test_fresh_reports_have_stable_figure_anchors(drv, experiments: Path) -> None:
    """A report rendered today: each figure's heading carries id="fig-1-3"; the overview the
    index wrote beside it links there, and following the link shows that heading."""
    drv.get((experiments / "index.html").as_uri())
    drv.find_element("link text", "Which of the manual's claims hold on our machines").click()
    assert drv.current_url.endswith("/overview.html")
    drv.find_element("css selector", 'td[data-machine="h200"][data-figure="1.3"] a').click()
    assert drv.current_url.endswith("h200/ch01/report.html#fig-1-3"), drv.current_url
    heading = drv.execute_script("return document.getElementById('fig-1-3').parentElement")
    assert heading.tag_name in ("h1", "h2", "h3") and heading.text.startswith("Fig 1.3")
    top = drv.execute_script("return arguments[0].getBoundingClientRect().top", heading)
    assert 0 <= top < 200  # scrolled to it


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The overview of the committed outputs, from their claims tables, in a folder whose
    machines (and index) are links to the repository's: its relative links stay valid."""
    root = tmp_path_factory.mktemp("committed")
    for name in ("cpu", "h200", index.INDEX):
        (root / name).symlink_to(REPO / "outputs" / name)
    overview.write(root, overview.claims_files(root))
    return root


# Where a link lands: the document's path, and whether the fragment names an element there
_LANDED_JS = """
const f = location.hash.slice(1);
return [decodeURIComponent(location.pathname), document.readyState,
        !f || !!(document.getElementById(f) || document.getElementById(decodeURIComponent(f)))];
"""


def test_every_overview_link_lands_on_its_target(drv, committed: Path) -> None:
    page = committed / overview.OVERVIEW
    r = browser.rendered(drv, page, settle_s=0)
    assert r.remote == [], r
    links = [a.get_attribute("href") for a in drv.find_elements("css selector", "a[href]")]
    assert len(links) >= 40
    by_page: dict[str, list[str]] = {}
    for url in links:
        assert url.startswith(committed.as_uri() + "/"), url  # relative: stays in the folder
        doc, _, fragment = url.partition("#")
        by_page.setdefault(doc, []).append(fragment)
    for doc, fragments in by_page.items():  # each target opened once, every anchor looked up
        drv.get(doc)
        path, state, _ = drv.execute_script(_LANDED_JS)
        assert state == "complete" and Path(path).is_file(), doc
        for f in filter(None, fragments):
            found = drv.execute_script(
                "const f = arguments[0]; return !!(document.getElementById(f) || "
                "document.getElementById(decodeURIComponent(f)));", f)
            assert found, f"{doc}#{f}"
    # and one followed by a click, as a reader would
    drv.get(page.as_uri())
    drv.find_element("css selector", 'td[data-machine="cpu"][data-figure="6.2"] a').click()
    path, state, found = drv.execute_script(_LANDED_JS)
    assert path.endswith("cpu/ch06-disagg/report.html") and found


def test_export_pdf(tmp_path: Path, committed: Path) -> None:
    """`tunebook export EXPERIMENT --pdf`: the report printed beside it; a page such as the
    overview too."""
    exp = tmp_path / "ch01"
    exp.mkdir()
    shutil.copy(REPO / "outputs" / "cpu" / "ch01" / "report.html", exp)
    assert main(["export", str(exp), "--pdf"]) == EXIT_OK
    out = tmp_path / "overview.pdf"
    assert main(["export", str(committed / overview.OVERVIEW), "--pdf", "--out",
                 str(out)]) == EXIT_OK
    for pdf in (exp / "report.pdf", out):
        data = pdf.read_bytes()
        assert data.startswith(b"%PDF")
        pages = re.search(rb"/Type\s*/Pages\s*/Count\s+(\d+)", data)
        assert pages and int(pages[1]) >= 1


def test_the_check_fails_for_a_page_that_needs_the_network(drv, tmp_path: Path) -> None:
    """Control: altair's default HTML loads vega from a CDN; offline it draws nothing."""
    chart = alt.Chart(pd.DataFrame({"x": [1, 2], "y": [3, 4]})).mark_line().encode(x="x", y="y")
    page = tmp_path / "cdn.html"
    page.write_text(chart.to_html())  # not inline: <script src="https://cdn.jsdelivr.net/...">
    r = browser.rendered(drv, page)
    assert r.charts == 0


# Chapters 6–8 (issue 13): their committed reports, as rendered by `tunebook run`, open
# offline with every chart decoded (widgets and vega from the page itself, nothing fetched).
CHAPTER_REPORTS = [str(p.relative_to(REPO / "outputs"))
                   for p in committed_files("ch0[678]*/report.html")]


@pytest.mark.parametrize("page", CHAPTER_REPORTS)
def test_chapter_reports_render_offline(drv, page: str) -> None:
    r = browser.rendered(drv, REPO / "outputs" / page)
    assert r.remote == [], r
    assert r.images >= 1 and r.images_ok == r.images, r


# Issue 35: labels that never collide. Every chart of every committed report, and the chart
# that collided, checked as Chromium lays them out (browser.label_problems).
REPORTS = [str(p.relative_to(REPO / "outputs")) for p in committed_files("**/report.html")]


def test_no_axis_label_collides_or_is_cut_off_in_any_committed_report(drv, tmp_path) -> None:
    """Each SVG chart of each committed report (nested experiments' too), one page per report:
    no two labels of one axis overlap, none leaves its chart. Before the ratio bars' labels
    were wrapped to their band, cpu/ch01 and h200/ch01 (Fig 1.3: "output tok/s, 64 ÷ 1 users"
    over "median TPOT, 64 ÷ 1 users") and cpu/ch03 and h200/ch03 (Fig 3.2: "TTFT, longest ÷
    shortest shared prefix, cache off" over "…, cache on") failed here; those four were
    re-rendered."""
    assert len(REPORTS) >= 20
    problems = []
    for page in REPORTS:
        html = (REPO / "outputs" / page).read_text(encoding="utf-8")
        svgs = {f"{page} chart {i + 1}": s for i, s in enumerate(browser.report_svgs(html))}
        assert svgs, page
        problems += browser.label_problems(drv, svgs, tmp_path)
    assert problems == [], "\n".join(map(str, problems))


def _quickstart_fig_1_3() -> dict:
    """Fig 1.3 as the CPU quickstart draws it (params/quickstart.yaml: 1 to 8 users, the
    default config): the figure's chart on the committed cpu/ch01 rows up to 8 users."""
    import dataclasses

    from tunebook import figures
    from tunebook.results.evidence import load_evidence

    ev = load_evidence(REPO / "outputs" / "cpu" / "ch01")
    ev = dataclasses.replace(ev, df=ev.df[(ev.df["max_concurrency"] <= 8)
                                          & (ev.df["engine_label"] == "default")])
    return figures.chart(ev, "1.3").to_dict()


def test_the_quickstart_ratio_labels_do_not_collide(drv, tmp_path) -> None:
    """The case of issue 35: in the quickstart's Fig 1.3 the two ratio labels "output tok/s,
    8 ÷ 1 users" and "median TPOT, 8 ÷ 1 users" printed over each other (one measured bar
    each, 100 px bands, labels upright on one line). Today's chart passes; the same chart with
    the axis as it was before the fix (``labelAngle=0, labelLimit=320``, no wrapping) is
    caught — the check fails on the old code."""
    import vl_convert as vlc

    spec = _quickstart_fig_1_3()
    ratio = spec["vconcat"][0]["hconcat"][0]
    names = {r["ratio"] for layer in ratio["layer"] if "data" in layer
             for r in spec["datasets"][layer["data"]["name"]] if "ratio" in r}
    assert names == {"output tok/s, 8 ÷ 1 users", "median TPOT, 8 ÷ 1 users"}
    assert browser.label_problems(drv, {"fig 1.3": vlc.vegalite_to_svg(spec)}, tmp_path) == []
    for layer in ratio["layer"]:
        x = layer.get("encoding", {}).get("x", {})
        if x.get("field") == "ratio":
            x["axis"] = {"labelAngle": 0, "labelLimit": 320}  # before the fix
    old = browser.label_problems(drv, {"fig 1.3 before": vlc.vegalite_to_svg(spec)}, tmp_path)
    assert [(p.kind, set(p.labels)) for p in old] == [("overlap", names)]


def test_a_label_past_the_chart_edge_is_cut_off(drv, tmp_path) -> None:
    """Control: a label drawn beyond the SVG's box is reported cut off."""
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="100" height="40" viewBox="0 0 100 40">'
           '<g class="mark-text role-axis-label"><text x="60" y="20">far too long a label</text>'
           '<text x="2" y="20">a</text></g></svg>')
    problems = browser.label_problems(drv, {"edge": svg}, tmp_path)
    assert [(p.kind, p.labels) for p in problems] == [("cut off", ("far too long a label",))]
