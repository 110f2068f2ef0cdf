"""The SLO search (tunebook.search.tune) drawn from its summary: every evaluated point against
the bound that binds (``slo_points``), and where the search went through the space of engine
configs (``slo_configs``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd

from tunebook.charts.base import (
    FAILURE_COLOUR,
    HEIGHT,
    WIDTH,
    _words,
    axis_title,
    display_label,
    titled,
)
from tunebook.inputs import slo


# --- the SLO search (tunebook.search.tune) --------------------------------------------------
def _binding_bound(summary: Mapping[str, Any]) -> tuple[slo.Bound, int, int]:
    """The SLO bound the evaluated points miss most often (ties: the first listed): the one
    whose metric the chart of points puts on x, so a point that misses reads as past its
    line. (bound, points that miss it, points that miss any bound)."""
    bounds = [slo.Bound.parse(b) for b in summary.get("slo", [])]
    points = [p for c in summary.get("configs", []) for p in c["points"]]
    counts = [sum(1 for p in points if not b.met(p) and b.slack(p) is not None)
              for b in bounds]
    i = max(range(len(bounds)), key=lambda j: (counts[j], -j))
    return bounds[i], counts[i], sum(1 for p in points if not p.get("meets"))


def bound_words(text: str) -> str:
    """An SLO bound as a chart says it: ``p99_tpot_ms <= 40`` → "P99 TPOT ≤ 40 ms"."""
    b = slo.Bound.parse(text)
    unit = axis_title(b.metric).rpartition(" (")[2].rstrip(")") if " (" in axis_title(
        b.metric) else ""
    op = {"<=": "≤", ">=": "≥"}.get(b.op, b.op)
    return f"{_words(b.metric)} {op} {b.value:g}" + (f" {unit}" if unit else "")


def slo_points(summary: Mapping[str, Any]) -> alt.LayerChart | None:
    """Every point the search evaluated: the SLO metric that binds (the bound missed most
    often) on x against the objective on y, filled where every bound is met; the bound as a
    dashed rule, the Pareto frontier of the points that meet it as a line, the answer ringed.
    Configs are named by their knob values (the legend's title names the knobs)."""
    objective = summary.get("search", {}).get("objective", "output_tok_s")
    if not summary.get("slo"):
        return None
    bound, binding, missed = _binding_bound(summary)
    metric, limit = bound.metric, bound.value
    knobs = list(summary.get("search", {}).get("knobs", {}))
    many = len(knobs) > 1  # "fp8 · 1024 · 2048" under a title naming the knobs
    rows = []
    for c in summary.get("configs", []):
        label = (" · ".join(knob_text(c["knobs"].get(k)) for k in knobs) if many
                 else display_label(", ".join(f"{k}={knob_text(v)}"
                                              for k, v in c["knobs"].items())))
        for p in c["points"]:
            if p.get("value") is None or p.get(metric) is None:
                continue
            rows.append({"config": label, "users": p["users"], metric: p[metric],
                         objective: p["value"], "meets the SLO": "yes" if p["meets"] else "no",
                         "pruned": c["pruned"]})
    data = pd.DataFrame(rows)
    if data.empty:
        return None
    ok = data[data["meets the SLO"] == "yes"].sort_values(metric)
    frontier = ok[ok[objective] >= ok[objective].cummax()] if len(ok) else ok
    x = alt.X(f"{metric}:Q", title=axis_title(metric), scale=alt.Scale(zero=False))
    y = alt.Y(f"{objective}:Q", title=axis_title(objective))
    points = alt.Chart(data).mark_point(size=70, filled=True).encode(
        x=x, y=y, color=alt.Color("config:N", title=" · ".join(knobs) if many
                                  else "engine config",
                                  legend=alt.Legend(orient="bottom", columns=2, labelLimit=320,
                                                    titleLimit=600)),
        shape=alt.Shape("meets the SLO:N", scale=alt.Scale(domain=["yes", "no"],
                                                           range=["circle", "cross"])),
        tooltip=list(data.columns))
    layers = [points]
    if len(frontier) > 1:
        layers.append(alt.Chart(frontier).mark_line(color="#333", strokeDash=[4, 2]).encode(
            x=x, y=y))
    layers.append(alt.Chart(pd.DataFrame({metric: [float(limit)]})).mark_rule(
        color=FAILURE_COLOUR, strokeDash=[6, 3]).encode(x=f"{metric}:Q"))
    best = summary.get("best")
    if best:
        hit = data[(data["users"] == best["users"]) & (data["meets the SLO"] == "yes")
                   & (data[objective] == best[objective])]
        layers.append(alt.Chart(hit).mark_point(size=320, color="#111", strokeWidth=2).encode(
            x=x, y=y))
    spent = (f"{summary.get('points')} points on {len(summary.get('configs', []))} configs, "
             f"{summary.get('engine_starts')} engine starts, {summary.get('engine_s', 0):.0f} s;"
             f" the full grid has {summary.get('grid_points')} points")
    level = (f"{best['users']:g}× the trace's rate" if summary.get("level") == "speed"
             else f"{best['users']} users") if best else ""
    answer = f"answer: {best['knobs']} at {level}" if best else "no config meets the SLO"
    why_x = (f"x: {_words(metric)}, the bound that binds: {binding} of the {missed} points "
             "that miss the SLO miss it"
             if len(summary["slo"]) > 1 else "")
    return alt.layer(*layers).properties(
        width=WIDTH + 80, height=HEIGHT,
        title=titled("SLO search: every evaluated point", [
            " and ".join(map(bound_words, summary["slo"]))
            + f" (red: {_words(metric)}'s bound); dashed: the frontier",
            *([why_x] if why_x else []), answer, spent]))


def knob_text(value: Any) -> str:
    """A searched knob's value as shown: `null` (the engine's default) reads 'default'."""
    return "default" if value is None else str(value)


def slo_configs(summary: Mapping[str, Any]) -> alt.TopLevelMixin | None:
    """Where the search went: one cell per engine config of the space (the first two knobs
    searched on the axes, one panel per value of any further knob), coloured by its score (the
    objective at its best point within the SLO), labelled with the order it was tried in; blank
    cells were never started."""
    knobs = list(summary.get("search", {}).get("knobs", {}))
    objective = summary.get("search", {}).get("objective", "output_tok_s")
    if not knobs or not summary.get("configs"):
        return None
    x_knob, y_knob, rest = knobs[0], (knobs[1] if len(knobs) > 1 else None), knobs[2:]
    best = (summary.get("best") or {}).get("knobs")
    rows = []
    for i, c in enumerate(summary["configs"], 1):
        rows.append({x_knob: knob_text(c["knobs"].get(x_knob)),
                     **({y_knob: knob_text(c["knobs"].get(y_knob))} if y_knob else {}),
                     "panel": ", ".join(f"{k}={knob_text(c['knobs'].get(k))}" for k in rest),
                     "score": c["score"], "tried": i,
                     "label": f"#{i} " + (f"{c['score']:,.0f}" if c["score"] else "–")
                     + (" ★" if c["knobs"] == best else ""),
                     "how it ended": c.get("why", "")})
    data = pd.DataFrame(rows)
    order = {k: [knob_text(v) for v in summary["search"]["knobs"][k]] for k in knobs[:2]}
    enc: dict[str, Any] = {"x": alt.X(f"{x_knob}:O", title=x_knob,
                                      scale=alt.Scale(domain=order[x_knob]))}
    if y_knob:  # the whole space on both axes, so the cells never started show as gaps
        enc["y"] = alt.Y(f"{y_knob}:O", title=y_knob,
                         scale=alt.Scale(domain=list(reversed(order[y_knob]))))
    scored_all = data[data["score"].notna()]
    # one colour scale and one text threshold for every panel
    lo, hi = ((scored_all["score"].min(), scored_all["score"].max()) if len(scored_all)
              else (0.0, 0.0))
    mid = (lo + hi) / 2
    colour = alt.Color("score:Q", title=axis_title(objective),
                       scale=alt.Scale(scheme="viridis", domain=[lo, hi]))
    size = {"width": max(WIDTH // 2, 70 * len(order[x_knob])),
            "height": max(120, 40 * len(order.get(y_knob, [""]))) if y_knob else 60}

    def panel(part: pd.DataFrame, title: str) -> alt.LayerChart:
        scored, unscored = part[part["score"].notna()], part[part["score"].isna()]
        layers = []
        if len(unscored):  # started, but no level met the SLO (or it was cut short first)
            layers.append(alt.Chart(unscored).mark_rect(stroke="white", color="#d9d9d9")
                          .encode(**enc, tooltip=list(part.columns)))
        if len(scored):
            layers.append(alt.Chart(scored).mark_rect(stroke="white").encode(
                **enc, color=colour, tooltip=list(part.columns)))
        layers.append(alt.Chart(part).mark_text(fontSize=11).encode(
            **enc, text="label:N",
            color=alt.condition(f"datum.score != null && datum.score > {mid}",
                                alt.value("black"), alt.value("white"))))
        return alt.layer(*layers).properties(**size, title=title)

    tried = len(data)
    space = 1
    for v in summary["search"]["knobs"].values():
        space *= len(v)
    title = titled("Where the search went", [
        f"{tried} of {space} engine configs started; #n: the order tried; the number: "
        f"{_words(objective)} within the SLO (– none); ★ the answer"])
    if not rest:
        return panel(data, "").properties(title=title)
    combos = [", ".join(f"{k}={knob_text(v)}" for k, v in zip(rest, vals, strict=True))
              for vals in itertools.product(*(summary["search"]["knobs"][k] for k in rest))]
    return alt.hconcat(*(panel(data[data["panel"] == c], c) for c in combos)).properties(
        title=title).resolve_scale(color="shared")
