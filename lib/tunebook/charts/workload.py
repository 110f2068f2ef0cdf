"""A workload file's profile (tunebook.results.workload): what it asked beside what vLLM's
client sent, arrivals over time and tokens per request."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from tunebook.charts.base import HEIGHT, PALETTE, WIDTH, titled


# --- a workload file's profile (tunebook.results.workload) -------------------------------------
def workload_profile(asked: pd.DataFrame, sent: pd.DataFrame, title: str) -> alt.VConcatChart:
    """What a workload asked (its prepared requests, at the replay speed: grey bars) beside what
    vLLM's client sent (one run's per-request arrays: blue line): arrivals per second over
    time, then input and output tokens per request. Where the line runs along the tops of the
    bars, the requests went out as the file asked."""
    frames = []
    if not asked.empty:
        frames.append(asked.assign(which=ASKED, t_s=asked["arrival_s"]))
    if not sent.empty:
        frames.append(sent.assign(which=SENT, t_s=sent["start_s"]))
    if not frames:
        raise ValueError("nothing to profile: no requests asked or sent")
    both = pd.concat(frames, ignore_index=True)
    colour = alt.Color("which:N", title=None, scale=alt.Scale(
        domain=[ASKED, SENT], range=["#c7c7c7", PALETTE[0]]),
        legend=alt.Legend(orient="top", symbolType="square"))
    parts = []
    timed = both.dropna(subset=["t_s"])
    if not timed.empty:
        span = float(timed["t_s"].max()) or 1.0
        bin_s = max(0.1, round(span / 30, 1))  # about 30 bins, whatever the speed
        # + 1 ms: a trace's times fall on bin edges, and a request sent a hair early or late
        # must land in the bin it was asked for
        t = timed.assign(bin_s=((timed["t_s"] + 1e-3) // bin_s) * bin_s)
        per = _zero_filled(t.groupby(["which", "bin_s"]).size().rename("requests"), bin_s)
        per["req_s"] = per["requests"] / bin_s
        per["bin_s_end"] = per["bin_s"] + bin_s
        parts.append(_asked_sent(per, "bin_s", "req_s", colour,
                                 f"Seconds after the first request ({bin_s:g}-s bins)",
                                 "Arrivals (req/s)", "Arrivals over time", 2 * WIDTH + 60, 160))

    def lengths(column: str, what: str) -> alt.LayerChart:
        d = both.dropna(subset=[column])
        lo, hi = float(d[column].min()), float(d[column].max())
        step = max(1.0, math.ceil((hi - lo + 1) / 25))
        d = d.assign(bin=((d[column] - lo) // step) * step + lo)
        per = _zero_filled(d.groupby(["which", "bin"]).size().rename("n"), step)
        per["share"] = per["n"] / per.groupby("which")["n"].transform("sum")
        per["bin_end"] = per["bin"] + step
        return _asked_sent(per, "bin", "share", colour, f"{what} (tokens, bins of {step:g})",
                           "Share of requests", f"{what} per request", WIDTH, HEIGHT - 60,
                           percent=True)

    parts.append(alt.hconcat(lengths("input_len", "Input"), lengths("output_len", "Output")))
    return alt.vconcat(*parts).properties(title=titled(title)).resolve_scale(color="shared")


ASKED, SENT = "asked (the file)", "sent (vLLM's client)"


def _zero_filled(counts: pd.Series, step: float) -> pd.DataFrame:
    """Counts per (which, bin) with every empty bin between the first and the last as 0: a
    step line must drop to 0 where nothing came, not carry the last count across."""
    which, binned = counts.index.names
    lo, hi = counts.index.get_level_values(1).min(), counts.index.get_level_values(1).max()
    grid = [lo + i * step for i in range(int(round((hi - lo) / step)) + 1)]
    full = pd.MultiIndex.from_product([counts.index.get_level_values(0).unique(), grid],
                                      names=[which, binned])
    snapped = counts.copy()
    snapped.index = pd.MultiIndex.from_arrays(
        [counts.index.get_level_values(0),
         [lo + round((b - lo) / step) * step for b in counts.index.get_level_values(1)]],
        names=[which, binned])
    return snapped.groupby(level=[0, 1]).sum().reindex(full, fill_value=0).reset_index()


def _asked_sent(per: pd.DataFrame, x: str, y: str, colour: alt.Color, x_title: str,
                y_title: str, title: str, width: int, height: int,
                percent: bool = False) -> alt.LayerChart:
    """Asked as grey bars, sent as a line with points over them, on the same bins."""
    axis = alt.Axis(format="%") if percent else alt.Undefined
    enc = dict(x=alt.X(f"{x}:Q", title=x_title),
               y=alt.Y(f"{y}:Q", title=y_title, axis=axis, scale=alt.Scale(zero=True)),
               color=colour, tooltip=["which", alt.Tooltip(f"{x}:Q", title=x_title),
                                      alt.Tooltip(f"{y}:Q", title=y_title,
                                                  format=".1%" if percent else ".2f")])
    bars = alt.Chart(per[per["which"] == ASKED]).mark_rect().encode(
        x2=f"{x}_end:Q", y2=alt.datum(0), **enc)
    line = alt.Chart(per[per["which"] == SENT]).mark_line(
        point=True, interpolate="step-after", strokeWidth=1.5).encode(**enc)
    return alt.layer(bars, line).properties(width=width, height=height, title=titled(title))
