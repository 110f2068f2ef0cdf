"""What a config's tokens cost against how fast it serves them: one point per engine config
(its load point with the cheapest tokens: USD per million output tokens at the user's price, or
joules per output token where there is no price), the latency metric at that point on the other
axis, and the configs no other beats on both (the Pareto front) joined and named."""

from __future__ import annotations

import altair as alt
import pandas as pd

from tunebook.charts.base import HEIGHT, WIDTH, axis_title, labelled, titled
from tunebook.results.store import ok_rows

COSTS = ("usd_per_m_output_tok", "energy_per_output_tok_j")  # the first a table has
LATENCY = "p99_tpot_ms"


def cost_metric(df: pd.DataFrame) -> str | None:
    return next((c for c in COSTS if c in df and df[c].notna().any()), None)


def front(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The points no other point beats on both x and y (lower is better on both)."""
    best, keep = float("inf"), []
    for i, r in points.sort_values([x, y]).iterrows():
        if r[y] < best:
            best = r[y]
            keep.append(i)
    return points.loc[keep].sort_values(x)


def per_config(df: pd.DataFrame, cost: str, latency: str = LATENCY) -> pd.DataFrame:
    """Each engine config's cheapest-token run (its highest-throughput load point)."""
    ok = labelled(ok_rows(df)).dropna(subset=[cost, latency])
    if ok.empty:
        return ok
    return ok.loc[ok.groupby("engine_label")[cost].idxmin()].reset_index(drop=True)


def pareto(df: pd.DataFrame, latency: str = LATENCY) -> alt.LayerChart | None:
    """The chart, or None when no run has a cost (no price, no energy counter)."""
    cost = cost_metric(df)
    if cost is None or latency not in df:
        return None
    points = per_config(df, cost, latency)
    if points.empty:
        return None
    points["on the front"] = points.index.isin(front(points, latency, cost).index)
    edge = front(points, latency, cost)
    level = "max_concurrency" if "max_concurrency" in points \
        and points["max_concurrency"].notna().any() else "replay_speed"
    tips = [alt.Tooltip("engine_label:N", title="config"),
            alt.Tooltip(f"{cost}:Q", format=",.3f"), alt.Tooltip(f"{latency}:Q", format=",.1f"),
            alt.Tooltip("output_tok_s:Q", format=",.0f"), alt.Tooltip(f"{level}:Q")]
    enc = dict(x=alt.X(f"{latency}:Q", title=axis_title(latency), scale=alt.Scale(zero=False)),
               y=alt.Y(f"{cost}:Q", title=axis_title(cost), scale=alt.Scale(zero=False)))
    dots = alt.Chart(points).mark_point(size=90, filled=True, opacity=1).encode(
        color=alt.Color("on the front:N", scale=alt.Scale(domain=[True, False],
                                                          range=["#4c78a8", "#bab0ac"])),
        tooltip=tips, **enc)
    line = alt.Chart(edge).mark_line(color="#4c78a8").encode(**enc)
    names = alt.Chart(edge).mark_text(dy=-12, fontSize=11).encode(text="engine_label:N", **enc)
    whose = ("your price" if cost == "usd_per_m_output_tok"
             else "the GPUs' energy over each measured window")
    return alt.layer(line, dots, names).properties(width=WIDTH, height=HEIGHT, title=titled(
        f"What each config's tokens cost against its {axis_title(latency).lower()}",
        [f"one point per engine config: its load point with the cheapest tokens ({whose}); "
         "joined: the configs no other beats on both"]))
