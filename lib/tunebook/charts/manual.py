"""The manual's numbers beside measured ones: in words (``ref_text``, ``reference_lines``,
``manual_panel``, ``beside``), as ratio bars (``Ratio``, ``ratio_bars``, ``ratio_first``) and
as reference bars (``ref_bars``); category labels that never collide (``label_lines``,
``wrapped_labels``)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import altair as alt
import pandas as pd

from tunebook.charts.base import (
    _QUALIFIER,
    HEIGHT,
    PALETTE,
    REFERENCE_FILL,
    REFERENCE_STROKE,
    WIDTH,
    display_label,
    fmt,
    titled,
    wrap,
)
from tunebook.core.manual import RESULT, SETTING, SOURCE, Ref


# --- the manual ---------------------------------------------------------------------------
def ref_text(r: Ref) -> str:
    """A reference number as the manual states it: a qualifier (≈, >, ≤), the value with
    thousands separators, the unit (× for a ratio)."""
    q = {"=": "", "≈": "≈", ">": ">", "≤": "≤"}[r.qualifier]
    v = f"{r.value:,.2f}".rstrip("0").rstrip(".") if r.value % 1 else f"{int(r.value):,}"
    return f"{q}{v}{'×' if r.unit == 'x' else ' ' + r.unit}"


def reference_lines(refs: Iterable[Ref], model: str | None = None) -> list[tuple[str, str]]:
    """The manual's numbers in words, one (what, value) pair per number: the number's meaning
    as the claims table words it ("total output tok/s at 64 users ÷ at 1 user") and its value
    with the unit as the manual states it ("8×"); a number measured on another model than the
    figure's names it. Results first, then the settings they were measured under."""
    refs = list(refs)
    out = []
    for r in [*(r for r in refs if r.kind == RESULT), *(r for r in refs if r.kind == SETTING)]:
        what = r.meaning
        if r.model and r.model != model and r.model not in what:
            what += f" ({r.model})"
        out.append((what, ref_text(r)))
    return out


PANEL_WIDTH, _LINE_PX, _LINE_CHARS = 320, 15, 54


def manual_panel(fig: str, refs: Iterable[Ref], claim: str, note: str | None,
                 hardware: str | None, model: str) -> alt.LayerChart:
    """The manual's numbers for one figure in words, as a short table in grey italics: one
    line "<what>: <value> <unit>" per number (``reference_lines``), the conditions they were
    measured under after "measured under:", the machine and model in the title. Text, not
    bars: the numbers of one figure carry different units, and no axis compares them."""
    refs = list(refs)
    results = [r for r in refs if r.kind == RESULT]
    rows: list[dict[str, Any]] = []
    y = 6  # below the subtitle

    def add(text: str, r: Ref | None, head: bool = False) -> None:
        nonlocal y
        for i, line in enumerate(wrap(text, _LINE_CHARS) or [""]):
            rows.append({"line": ("   " if i and not head else "") + line, "y": y,
                         "head": head, "ref": r.name if r else None,
                         "value": r.value if r else None, "unit": r.unit if r else None,
                         "meaning": r.meaning if r else None,
                         "kind": r.kind if r else None, "source": SOURCE})
            y += _LINE_PX

    lines = reference_lines(refs, model)
    for r, (what, value) in zip([*results, *(r for r in refs if r.kind == SETTING)], lines,
                                strict=True):
        if r.kind == SETTING and (not rows or not any(x["kind"] == SETTING for x in rows)):
            if rows:
                y += 4
            add("measured under:", None, head=True)
        add(f"{what}: {value}", r)
    if not rows:
        add("this figure states no numbers", None)
    data = pd.DataFrame(rows)
    tips = ["meaning", "value", "unit", "kind", "ref", "source"]
    enc = dict(x=alt.value(0), y=alt.Y("y:Q", scale=None, axis=None), text="line:N")
    body = alt.Chart(data[~data["head"]]).mark_text(
        align="left", baseline="top", fontSize=11, fontStyle="italic", color="#333"
    ).encode(tooltip=tips, **enc)
    layers = [body]
    if data["head"].any():
        layers.append(alt.Chart(data[data["head"]]).mark_text(
            align="left", baseline="top", fontSize=11, color=REFERENCE_STROKE).encode(**enc))
    subtitle = [*wrap(claim), *(wrap(note) if note else []), SOURCE]
    title = (f"vLLM manual Fig {fig} — reference ({hardware or 'machine not named'}, "
             f"{model})")
    return alt.layer(*layers).properties(
        width=PANEL_WIDTH, height=y, view=alt.ViewBackground(stroke=None),
        title=titled(title, subtitle))


def beside(measured: alt.TopLevelMixin, panel: alt.TopLevelMixin) -> alt.HConcatChart:
    """A measured chart with the manual's reference panel on its right."""
    return alt.hconcat(measured, panel, spacing=40).resolve_scale(color="independent")


# Category labels under bars: each wrapped into lines that fit its band. Vega's default axis
# labels are 10 px sans-serif, whose widest common glyphs average under 6.5 px.
_LABEL_CHAR_PX, _MIN_BAND_PX = 6.5, 90


def label_lines(text: str, chars: int) -> list[str]:
    """``text`` in lines of at most ``chars`` characters: its comma-separated parts kept
    whole on a line where they fit (the comma ends the line), else wrapped at spaces."""
    lines: list[str] = []
    parts = text.split(", ")
    for i, part in enumerate(parts):
        piece = part + ("," if i < len(parts) - 1 else "")
        if lines and lines[-1].endswith(",") and len(lines[-1]) + 1 + len(piece) <= chars:
            lines[-1] += " " + piece
        else:
            lines += wrap(piece, chars) or [piece]
    return lines


def wrapped_labels(values: Iterable[Any], band_px: float, **axis: Any) -> alt.Axis:
    """A horizontal axis of categories whose labels never collide: each label broken into
    lines (at spaces, after ", " first) of at most the characters its band holds, upright,
    none cut short (``labelLimit`` the band's width: a word longer than that is the only thing
    that would be)."""
    chars = max(6, int((band_px - 8) // _LABEL_CHAR_PX))
    cases = []
    for v in values:
        lines = label_lines(str(v), chars)
        if len(lines) > 1:
            cases.append(f"datum.value === {json.dumps(str(v))} ? {json.dumps(lines)}")
    expr = " : ".join([*cases, "datum.label"])
    return alt.Axis(labelAngle=0, labelLimit=int(band_px), labelExpr=expr,
                    labelBaseline="top", labelLineHeight=12, **axis)


@dataclass(frozen=True)
class Ratio:
    """One ratio a figure claims, as the manual states it and as measured here."""

    name: str  # axis label: "output 64 ÷ 1 users"
    manual: float | None  # None: the manual states no such ratio
    measured: Mapping[str, float]  # curve label -> measured ratio (NaN: not measured)
    qualifier: str = "="


def ratio_bars(ratios: Iterable[Ratio], title: str, subtitle: Iterable[str] = (),
               band: tuple[float, float] | None = None) -> alt.LayerChart:
    """Grouped bars on one ratio axis: the manual's ratio (grey, reference) beside each
    measured one; a dashed rule at 1× (no change); `band` (low, high) shades the range a claim
    allows (e.g. within 3%: 0.97–1.03). Absolute numbers from different machines are not
    comparable; ratios are, so they lead. With a band the bars become dots on an axis zoomed
    to the band: a 3.5% gap against a 3% band is a few pixels on bars that start at 0."""
    rows = []
    for r in ratios:
        if r.manual is not None:
            rows.append({"ratio": r.name, "source": "manual (reference)", "value": r.manual,
                         "label": _QUALIFIER[r.qualifier] + fmt(r.manual, "x")})
        for curve, v in sorted(r.measured.items(), key=lambda kv: str(kv[0])):
            ok = v is not None and math.isfinite(float(v))
            rows.append({"ratio": r.name, "value": float(v) if ok else None,
                         "source": "measured here" + (f" · {display_label(curve)}"
                                                      if curve else ""),
                         "label": fmt(v, "x") if ok else "not measured"})
    data = pd.DataFrame(rows, columns=["ratio", "source", "value", "label"])
    data["label_y"] = data["value"].fillna(0.0)
    sources = list(dict.fromkeys(data["source"]))
    colour = alt.Color("source:N", title=None, legend=alt.Legend(labelLimit=400,
                                                                 orient="bottom", columns=1),
                       scale=alt.Scale(domain=sources, range=[
                           REFERENCE_FILL if s.startswith("manual") else PALETTE[i % 10]
                           for i, s in enumerate(sources)]))
    names = list(dict.fromkeys(data["ratio"]))
    width = int(min(600, max(200, 44 * len(names) * len(sources))))
    width = max(width, _MIN_BAND_PX * len(names))  # each category's label gets its room
    enc = dict(x=alt.X("ratio:N", title=None, sort=None,
                       axis=wrapped_labels(names, width // max(1, len(names)))),
               xOffset=alt.XOffset("source:N", sort=sources),
               tooltip=["ratio", "source", "value", "label"])
    if band is None:
        y_scale = alt.Scale()
        mark = alt.Chart(data).mark_bar(stroke=REFERENCE_STROKE, strokeWidth=0.5)
    else:  # zoomed: the band and every value inside, with a margin; dots, not bars from 0
        vals = [float(v) for v in data["value"].dropna()] + list(band)
        pad = 0.25 * (max(vals) - min(vals)) or 0.01
        y_scale = alt.Scale(zero=False, domain=[min(vals) - pad, max(vals) + pad])
        data["label_y"] = data["value"].fillna(min(vals))  # "not measured" at the bottom
        mark = alt.Chart(data).mark_point(filled=True, size=90, opacity=1,
                                          stroke=REFERENCE_STROKE, strokeWidth=0.5)
    bars = mark.encode(y=alt.Y("value:Q", title="ratio (×)", scale=y_scale), color=colour, **enc)
    text = alt.Chart(data).mark_text(dy=-10 if band else -5, fontSize=10).encode(
        y=alt.Y("label_y:Q", scale=y_scale), text="label:N", **enc)
    one = alt.Chart(pd.DataFrame({"one": [1.0]})).mark_rule(
        strokeDash=[2, 2], color="#999").encode(y="one:Q")
    layers = [bars, text, one]
    if band is not None:  # behind the bars: what the claim allows
        layers.insert(0, alt.Chart(pd.DataFrame({"low": [band[0]], "high": [band[1]]}))
                      .mark_rect(color="#2ca02c", opacity=0.18).encode(y="low:Q", y2="high:Q"))
        subtitle = [*subtitle, f"green band: {band[0]:g}–{band[1]:g}×, what the claim allows"]
    return alt.layer(*layers).properties(
        width=width, height=HEIGHT,
        title=titled(title, [*subtitle, "grey: the manual's ratio (reference); colours: "
                                        "measured here"]))


def ratio_first(ratios: alt.TopLevelMixin, absolute: alt.TopLevelMixin | None,
                panel: alt.TopLevelMixin) -> alt.VConcatChart | alt.HConcatChart:
    """The layout of a ratio claim: measured ratio beside the manual's (and the manual's
    panel) first; the absolute values below, second."""
    top = beside(ratios, panel)
    return top if absolute is None else alt.vconcat(top, absolute, spacing=30).resolve_scale(
        color="independent")


def ref_bars(data: pd.DataFrame, x: str, y: str, colour: str, x_title: str,
              title: str, subtitle: Iterable[str], fmt: str = ",.0f") -> alt.LayerChart:
    """Horizontal bars where rows whose ``colour`` starts with 'manual' are grey reference."""
    sources = list(dict.fromkeys(data[colour]))
    rng = [REFERENCE_FILL if str(s).startswith("manual") else PALETTE[i % len(PALETTE)]
           for i, s in enumerate(sources)]
    enc = dict(y=alt.Y(f"{y}:N", title=None, sort=None, axis=alt.Axis(labelLimit=320)),
               x=alt.X(f"{x}:Q", title=x_title))
    bars = alt.Chart(data).mark_bar(stroke=REFERENCE_STROKE, strokeWidth=0.5).encode(
        color=alt.Color(f"{colour}:N", title=None, scale=alt.Scale(domain=sources, range=rng),
                        legend=alt.Legend(labelLimit=360, orient="bottom", columns=1)),
        tooltip=list(data.columns), **enc)
    text = alt.Chart(data).mark_text(align="left", dx=4, fontSize=10).encode(
        text=alt.Text(f"{x}:Q", format=fmt), **enc)
    return alt.layer(bars, text).properties(width=WIDTH, height=alt.Step(22),
                                            title=titled(title, subtitle))
