"""No chart asks its reader to decode an identifier (issue 35): every title, subtitle, axis
title, axis label, legend title and legend label of a chart is words, where the only names with
underscores allowed are vLLM's knobs (``tunebook.core.knobs.KNOBS``: ``max_num_seqs=16`` is
what a reader types into vLLM).

Checked on the Vega-Lite specs themselves (no rendering): those the figure code draws today
from each committed experiment's stored rows, and those saved in the committed executed
notebooks (the latest one per experiment)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import committed
from tunebook import figures
from tunebook.charts import plots as charts
from tunebook.core.knobs import KNOBS
from tunebook.present.report import VEGALITE_MIME, chart_outputs, latest_notebook
from tunebook.results.evidence import load_evidence

REPO = Path(__file__).resolve().parents[2]
OUTPUTS = REPO / "outputs"
# every committed experiment with a report, nested ones too (slo-…-bench/slo-grid)
EXPERIMENTS = [str(p.parent.relative_to(OUTPUTS)) for p in committed("**/report.html")]

AXIS_CHANNELS = ("x", "y")
LEGEND_CHANNELS = ("color", "fill", "stroke", "shape", "size", "opacity", "strokeDash")
_IDENTIFIER = re.compile(r"[A-Za-z0-9.]*_[A-Za-z0-9_.]*")


def _title_texts(title: Any) -> list[str]:
    if isinstance(title, str):
        return [title]
    if isinstance(title, list):
        return [str(t) for t in title]
    if isinstance(title, dict):
        return _title_texts(title.get("text")) + _title_texts(title.get("subtitle"))
    return []


def _guide(channel: str, enc: dict[str, Any]) -> dict[str, Any] | None:
    """The channel's axis or legend (``{}``: the default one); None where it has none."""
    key = "axis" if channel in AXIS_CHANNELS else "legend"
    if key in enc and enc[key] is None:
        return None
    return enc.get(key) or {}


def _channel_title(enc: dict[str, Any], guide: dict[str, Any]) -> tuple[bool, list[str]]:
    """(explicit, the title's texts) of one channel in one unit chart: Vega-Lite titles a
    guide by the field's name when nothing else names it."""
    for src in (guide, enc):
        if "title" in src:
            return True, _title_texts(src["title"])
    field = enc.get("field")
    if not field:
        return False, []
    return False, [f"{enc['aggregate']} of {field}" if enc.get("aggregate") else str(field)]


def chart_labels(spec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, text) for every title and guide text of a Vega-Lite spec: chart titles and
    subtitles, each axis's and legend's title (Vega-Lite's rule in a layer: an explicit title
    wins over the fields' names), and the labels of categorical axes and legends (their
    field's values in the data the chart draws, or the scale's domain where it names one)."""
    datasets = spec.get("datasets", {})

    def walk(node: Any, data: str | None) -> Iterator[tuple[str, str]]:
        if not isinstance(node, dict):
            return
        if isinstance(node.get("data"), dict) and "name" in node["data"]:
            data = node["data"]["name"]
        for t in _title_texts(node.get("title")):
            yield "title", t
        units = [(node, data)] if "mark" in node else []
        if "layer" in node:  # one guide per channel for the whole layer
            units = [(u, u["data"]["name"] if isinstance(u.get("data"), dict)
                      and "name" in u["data"] else data) for u in node["layer"] if "mark" in u]
        for channel in (*AXIS_CHANNELS, *LEGEND_CHANNELS):
            titles: dict[bool, list[str]] = {True: [], False: []}
            for unit, unit_data in units:
                enc = unit.get("encoding", {}).get(channel)
                if not isinstance(enc, dict):
                    continue
                guide = _guide(channel, enc)
                if guide is None:
                    continue
                explicit, texts = _channel_title(enc, guide)
                titles[explicit] += texts
                if enc.get("type") in ("nominal", "ordinal") and enc.get("field"):
                    domain = (enc.get("scale") or {}).get("domain")
                    values = (domain if isinstance(domain, list) else
                              [row.get(enc["field"]) for row in datasets.get(unit_data, [])])
                    for v in dict.fromkeys(v for v in values if v is not None):
                        yield f"{channel} label", str(v)
            for t in titles[True] or titles[False]:
                yield f"{channel} title", t
        for key in ("layer", "hconcat", "vconcat", "concat"):
            for child in node.get(key, []):
                if key != "layer" or "mark" not in child:
                    yield from walk(child, data)
                else:
                    yield from (("title", t) for t in _title_texts(child.get("title")))
        if "spec" in node:
            yield from walk(node["spec"], data)

    yield from walk(spec, None)


def identifiers(spec: dict[str, Any]) -> list[str]:
    """Each "<where>: <identifier> in <text>" of the spec's labels that is not a vLLM knob."""
    found = []
    for where, text in chart_labels(spec):
        for word in _IDENTIFIER.findall(text):
            if word.strip(".") not in KNOBS:
                found.append(f"{where}: {word} in {text!r}")
    return sorted(set(found))


def test_the_check_finds_what_the_old_reference_panel_showed() -> None:
    """Control: the manual's numbers as the reference panel drew them before issue 35 (a bar
    per number, labelled by its key) are caught; a knob's name and the panel today are not."""
    import altair as alt
    import pandas as pd

    old = alt.Chart(pd.DataFrame({"ref": ["max_num_seqs_cap", "output_tok_s_default_32_users"],
                                  "bar": [0.5, 1.0]})).mark_bar().encode(
        y=alt.Y("ref:N", title=None), x=alt.X("bar:Q", axis=None))
    assert identifiers(old.to_dict()) == [
        "y label: max_num_seqs_cap in 'max_num_seqs_cap'",
        "y label: output_tok_s_default_32_users in 'output_tok_s_default_32_users'"]
    knob = alt.Chart(pd.DataFrame({"engine_label": ["max_num_seqs=16"], "v": [1]})).mark_bar(
    ).encode(x=alt.X("engine_label:N", title="engine config"), y="v:Q")
    assert identifiers(knob.to_dict()) == []
    for fig in ("1.3", "3.1", "4.1"):
        panel = figures.get(fig).reference_panel().to_dict()
        assert identifiers(panel) == [], fig
        assert "bar" not in json.dumps(panel["layer"])  # words, not bars
    lines = dict(charts.reference_lines(figures.get("4.1").refs))
    assert lines["draft depth with the highest output"] == "3 draft tokens"


def _fresh_specs(exp: str) -> Iterator[tuple[str, dict[str, Any]]]:
    ev = load_evidence(OUTPUTS / exp)
    for fig in ev.figures:
        chart = figures.chart(ev, fig)
        if chart is not None:
            yield f"Fig {fig}", chart.to_dict(validate=False)


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_the_figures_of_each_committed_experiment_name_no_identifier(exp: str) -> None:
    """Today's figure code on the committed rows (what a replot would draw)."""
    found = [f"{name}: {i}" for name, spec in _fresh_specs(exp) for i in identifiers(spec)]
    assert found == [], "\n".join(found)


# Every committed report was re-rendered after issue 35's labels (`tunebook run PARAMS --outputs
# outputs/<machine> --replot -q`; the SLO benches' last, from the params in their inputs/).


def _saved_specs(exp: str) -> Iterator[dict[str, Any]]:
    nb = json.loads(latest_notebook(OUTPUTS / exp).read_text(encoding="utf-8"))
    for _, data in chart_outputs(nb):
        if data[VEGALITE_MIME]:
            yield data[VEGALITE_MIME]


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_the_charts_of_each_committed_report_name_no_identifier(exp: str) -> None:
    found = [i for spec in _saved_specs(exp) for i in identifiers(spec)]
    assert found == [], "\n".join(found)
