"""Charts of measured series: a metric against the load, one curve per engine config
(``scaling``, ``overlay``, ``latency_percentiles``), each curve's throughput peak and latency
knee marked (``Saturation``), one metric's ratio between two loads (``scaling_ratios``), and
charts by declaration (``Curves``, ``curves``). The conventions: tunebook.charts.base."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import altair as alt
import pandas as pd

from tunebook.charts.base import (
    _CONTEXT,
    _METRIC_NAMES,
    FAILURE_COLOUR,
    HEIGHT,
    PERCENTILES,
    WIDTH,
    _colour,
    _context,
    _is_ok,
    _knobs,
    _labels,
    _repeats_text,
    _vl_type,
    _words,
    _x,
    axis_title,
    fmt,
    labelled,
    require,
    titled,
    wrap,
)
from tunebook.results import stats


# --- measured series ----------------------------------------------------------------------
def _aggregate(ok: pd.DataFrame, x: str, series: Mapping[str, str]) -> pd.DataFrame:
    """Long frame: one row per (engine_label, series, x) with mean, min, max, runs and the
    mean's 95% interval (ci_low, ci_high; NaN for a single run) over repeats; `samples`, the
    fewest samples a repeat's value rests on (a percentile's requests or gaps), and
    `too_few`, whether that is under what the percentile needs (stats.MIN_SAMPLES)."""
    extra = [c for c in (*_CONTEXT, *_knobs(ok)) if c in ok.columns and c != x]
    n_cols = {m: f"__samples_{m}" for m in series}
    ok = ok.assign(**{c: [stats.samples_of(m, r) for _, r in ok.iterrows()]
                      for m, c in n_cols.items()})
    long = ok.melt(id_vars=["engine_label", x, *extra], value_vars=list(series),
                   var_name="metric", value_name="value")
    long["samples"] = ok.melt(id_vars=["engine_label"], value_vars=list(n_cols.values()),
                              value_name="samples")["samples"].to_numpy()
    long["value"] = pd.to_numeric(long["value"], errors="coerce")
    long["samples"] = pd.to_numeric(long["samples"], errors="coerce")
    long = long.dropna(subset=["value", x])
    long["series"] = long["metric"].map(series)
    keys = ["engine_label", "series", x]
    cols = [*keys, "mean", "min", "max", "runs", "ci_low", "ci_high", *extra, "samples",
            "too_few"]
    if long.empty:
        return pd.DataFrame(columns=cols)
    grouped = long.groupby(keys, sort=True)
    out = grouped["value"].agg(mean="mean", min="min", max="max", runs="count")
    ci = stats.describe(long, keys, "value").set_index(keys)[["ci_low", "ci_high"]]
    out = out.join(ci).join(grouped["samples"].min())
    out = (out.join(grouped[extra].first()) if extra else out).reset_index()
    metric_of = {v: k for k, v in series.items()}
    out["too_few"] = [stats.too_few(metric_of[sr], None if pd.isna(n) else n)
                      for sr, n in zip(out["series"], out["samples"], strict=True)]
    return out[cols]


def _not_plotted(df: pd.DataFrame, x: str, columns: Iterable[str]) -> pd.DataFrame:
    """Rows that get no point: not ok, or ok without x or without any of the metrics."""
    columns = list(columns)
    values = df[columns].apply(pd.to_numeric, errors="coerce")
    ok = _is_ok(df)
    no_x, no_y = df[x].isna(), values.isna().all(axis=1)
    reason = df["status"].astype("string").fillna("no status").where(~ok, None)
    reason = reason.mask(ok & no_x, f"ok but no {x}")
    reason = reason.mask(ok & ~no_x & no_y, f"ok but no {', '.join(columns)}")
    keep = [c for c in ("engine_label", x, "repeat", "status", "error", "error_hint")
            if c in df.columns]
    out = df.loc[reason.notna(), keep].copy()
    out["reason"] = reason[reason.notna()].astype(str)
    return out


def _issue_note(issues: pd.DataFrame, x: str) -> str:
    lines = []
    for (reason, label), g in issues.groupby(["reason", "engine_label"], dropna=False):
        at = ", ".join(fmt(v) for v in sorted(g[x].dropna().unique()))
        lines.append(f"{reason}: {label}" + (f" ({x} {at})" if at else ""))
    return "\n".join(lines)


def _tooltip(frame: pd.DataFrame, x: str, first: Iterable[str]) -> list[alt.Tooltip]:
    fmt = {c: ".4~g" for c in ("mean", "min", "max", "ci_low", "ci_high", "y")}
    cols = [c for c in ("engine_label", x, *first) if c in frame.columns]
    cols += [c for c in frame.columns if c not in cols]
    return [alt.Tooltip(field=c, type=_vl_type(frame[c]), format=fmt.get(c, alt.Undefined))
            for c in cols]


@dataclass(frozen=True)
class Saturation:
    """Mark each curve's throughput peak and latency knee (rules:
    tunebook.results.stats.saturation): the columns they are found from and the knee's
    thresholds. The marks sit on every panel at the peak's and the knee's load point."""

    throughput: str = "output_tok_s"
    latency: str | None = "median_tpot_ms"
    min_marginal_fraction: float = stats.MIN_MARGINAL_FRACTION
    max_latency_multiple: float = stats.MAX_LATENCY_MULTIPLE

    def short_rule(self, x: str) -> str:
        one = "user" if x == "max_concurrency" else x
        lat = (f" or {_words(self.latency)} > {self.max_latency_multiple:g}× its "
               "lowest-load value" if self.latency else "")
        return (f"peak = highest mean {_words(self.throughput)}; knee = last load before one "
                f"more {one} adds < {self.min_marginal_fraction:.0%} of the lowest load's "
                f"per-{one} rate{lat}")


_MARK_SHAPES = {"peak": "diamond", "knee": "triangle-up", "peak = knee": "square"}


def _saturation_marks(ok: pd.DataFrame, agg: pd.DataFrame, x: str, series: str,
                      spec: Saturation) -> tuple[pd.DataFrame, list[str]]:
    """Where to mark the peak and the knee of each curve on the panel of ``series`` (at that
    panel's mean there), and subtitle lines: the rule, and curves whose knee was not found."""
    cols = ["engine_label", x, "mean", "mark", "throughput", "latency", "knee_reason", "rule"]
    # the rows: at most one mark per curve and load point ("peak = knee" when they coincide)
    if ok.empty:
        return pd.DataFrame(columns=cols), []
    sat = stats.saturation(ok, x, spec.throughput, spec.latency, "engine_label",
                           spec.min_marginal_fraction, spec.max_latency_multiple)
    here = agg[agg["series"] == series]
    keys = zip(here["engine_label"], pd.to_numeric(here[x]).astype(float), strict=True)
    means = dict(zip(keys, here["mean"], strict=True))
    rows, unfound = [], {}
    for r in sat.to_dict("records"):
        label, at = r["engine_label"], {}
        for name, px, y, lat in (("peak", r["peak_x"], r["peak_y"], r["peak_latency"]),
                                 ("knee", r["knee_x"], r["knee_y"], r["knee_latency"])):
            if pd.notna(px):
                at.setdefault(float(px), []).append((name, y, lat))
        for px, marks in at.items():
            mean = means.get((label, px))
            if mean is None or pd.isna(mean):
                continue
            rows.append({"engine_label": label, x: px, "mean": mean,
                         "mark": " = ".join(m[0] for m in marks),
                         "throughput": marks[0][1], "latency": marks[0][2],
                         "knee_reason": r["knee_reason"], "rule": r["rule"]})
        if r["knee_status"] != stats.KNEE_FOUND:
            unfound.setdefault(f"knee {r['knee_status']}", []).append(str(label))
        if r["peak_at_edge"] and r["points"] > 1:
            unfound.setdefault("peak at the largest load measured (it may lie beyond)",
                               []).append(str(label))
    notes = [spec.short_rule(x)] + [f"{what}: {', '.join(labels)}"
                                    for what, labels in unfound.items()]
    return pd.DataFrame(rows, columns=cols), [ln for n in notes for ln in wrap(n, 90)]


def _measured(df: pd.DataFrame, x: str, series: Mapping[str, str], y_title: str,
              title: str, dash_title: str | None = None,
              saturation: Saturation | None = None,
              colours: Mapping[str, str] | None = None) -> alt.LayerChart:
    """Mean line per engine_label (and series), 95% interval bars where a point has repeats,
    failures as crosses + a note; with ``saturation``, each curve's peak and knee marked (on
    the first series)."""
    require(df, "engine_label", "status", x, *series)
    if saturation is not None:
        require(df, saturation.throughput)
    df = labelled(df)
    ok = df[_is_ok(df)]
    agg = _aggregate(ok, x, series)
    issues = _not_plotted(df, x, series)
    domain = _labels(df)
    xenc, colour = _x(x, pd.concat([agg[x], issues[x]])), _colour(domain, colours)
    repeats = _repeats_text(agg)
    tips = ("series", "mean", "runs", "ci_low", "ci_high", "min", "max")
    enc = dict(x=xenc, color=colour, tooltip=_tooltip(agg, x, tips))
    base = alt.Chart(agg).encode(y=alt.Y("mean:Q", title=y_title), **enc)
    dash = (alt.StrokeDash("series:N", title=dash_title, sort=list(series.values()))
            if dash_title else alt.Undefined)  # only on the line, so the legend shows dashes
    layers = [base.mark_line().encode(strokeDash=dash),
              base.mark_point(filled=True, size=36, opacity=1)]
    thin = agg[agg["too_few"].astype(bool)] if len(agg) else agg
    if len(thin):  # a percentile from too few requests: hollow, and said under the title
        layers.append(alt.Chart(thin).mark_point(filled=True, size=36, opacity=1,
                                                 fill="white").encode(
            y=alt.Y("mean:Q", title=y_title), **enc))
    if repeats:
        bars = agg[(agg["runs"] >= 2) & agg["ci_low"].notna() & agg["ci_high"].notna()]
        layers.append(alt.Chart(bars).mark_errorbar(ticks=True).encode(
            y=alt.Y("ci_low:Q", title=y_title), y2="ci_high:Q", **enc))
    subtitle = _context(ok, repeats)
    if len(thin):
        subtitle.append(_thin_note(thin))
    if saturation is not None:
        marks, notes = _saturation_marks(ok, agg, x, next(iter(series.values())), saturation)
        subtitle += notes
        if len(marks):
            menc = dict(x=xenc, y=alt.Y("mean:Q", title=y_title), color=colour,
                        tooltip=_tooltip(marks, x, ("mark", "throughput", "latency")))
            shape = alt.Shape("mark:N", title="saturation",
                              scale=alt.Scale(domain=list(_MARK_SHAPES),
                                              range=list(_MARK_SHAPES.values())))
            layers.append(alt.Chart(marks).mark_point(
                size=190, filled=False, strokeWidth=2, opacity=1).encode(shape=shape, **menc))
            for i, (_, curve) in enumerate(marks.groupby("engine_label", sort=True)):
                # labels of curves marked at the same load point must not print over each
                # other: each curve's labels sit at their own height above the point
                layers.append(alt.Chart(curve).mark_text(
                    dy=-15 - 12 * (i % 3), fontSize=11, fontWeight="bold").encode(
                    text="mark:N", **menc))
    if len(issues):
        placed = issues.dropna(subset=[x])
        cross = alt.Chart(placed).mark_point(shape="cross", size=140, filled=True, opacity=1)
        layers.append(cross.encode(x=xenc, y=alt.value(HEIGHT - 8), color=colour,
                                   tooltip=_tooltip(placed, x, ("reason", "error", "error_hint"))))
        note = pd.DataFrame({"note": [_issue_note(issues, x)]})
        layers.append(alt.Chart(note).mark_text(
            align="left", baseline="top", lineBreak="\n", x=6, y=6, fontSize=11,
            color=FAILURE_COLOUR).encode(text="note:N"))
    return alt.layer(*layers).properties(
        width=WIDTH, height=HEIGHT, title=titled(title, subtitle))


def _thin_note(thin: pd.DataFrame) -> str:
    """Under the title: which percentiles rest on too few samples, and how few."""
    worst = thin.sort_values("samples").iloc[0]
    names = ", ".join(sorted(set(thin["series"].astype(str))))
    p = stats.percentile_of(str(worst["series"])) or "p99"
    return (f"hollow: {names} from fewer samples than a {p.upper()} needs "
            f"({stats.MIN_SAMPLES[p]}); the fewest: {fmt(worst['samples'])}")


def _saturation(option: bool | Saturation | None) -> Saturation | None:
    if isinstance(option, Saturation):
        return option
    return Saturation() if option else None


def scaling(df: pd.DataFrame, y: str = "output_tok_s", x: str = "max_concurrency",
            title: str | None = None, saturation: bool | Saturation = False,
            colours: Mapping[str, str] | None = None) -> alt.LayerChart:
    """A measured metric vs concurrent users, one line per engine config; ``saturation``
    (True or a :class:`Saturation`) marks each curve's throughput peak and latency knee;
    ``colours``: engine label → colour, where a config must keep its own."""
    return _measured(df, x, {y: y}, axis_title(y),
                     title or f"{axis_title(y)} vs {axis_title(x).split(' (')[0].lower()}",
                     saturation=_saturation(saturation), colours=colours)


def overlay(frames: Mapping[str, pd.DataFrame], y: str = "output_tok_s",
            x: str = "max_concurrency", title: str | None = None,
            saturation: bool | Saturation = False) -> alt.LayerChart:
    """Several experiments in one chart (CPU vs H200, vLLM 0.26 vs 0.32, yesterday vs today):
    one line per experiment × engine config, labelled "<experiment> · <engine config>"."""
    if not frames:
        raise ValueError("overlay needs at least one experiment")
    parts = []
    for name, df in frames.items():
        require(df, "engine_label", "status", x, y)
        parts.append(labelled(df).assign(
            engine_label=lambda d, n=name: n + " · " + d["engine_label"].astype(str)))
    names = " vs ".join(frames)
    return _measured(pd.concat(parts, ignore_index=True), x, {y: y}, axis_title(y),
                     title or f"{axis_title(y)}: {names}", saturation=_saturation(saturation))


def latency_percentiles(df: pd.DataFrame, metric: str = "tpot",
                        saturation: bool | Saturation = False) -> alt.LayerChart:
    """p50 / p90 / p99 of ttft, tpot, itl or e2el (ms) vs concurrent users; ``saturation``
    marks each curve's peak and knee on its p50 line."""
    if metric not in _METRIC_NAMES:
        raise ValueError(f"metric must be one of {list(_METRIC_NAMES)}, not {metric!r}")
    series = {f"{p}_{metric}_ms": p for p in PERCENTILES}
    name = f"{_METRIC_NAMES[metric]} ({metric.upper()}, ms)"
    return _measured(df, "max_concurrency", series, name,
                     f"{name}: p50 / p90 / p99 vs concurrent users", dash_title="percentile",
                     saturation=_saturation(saturation))


def scaling_ratios(df: pd.DataFrame, metric: str, lo_users: int,
                   hi_users: int) -> dict[str, float]:
    """{engine_label: mean(metric at hi_users) / mean(metric at lo_users)} over ok runs.

    NaN where either end has no ok run (or the low end is 0); never raises on missing data.
    """
    if df is None or "engine_label" not in df.columns:
        return {}
    out = {label: math.nan for label in _labels(df)}
    if not {"status", "max_concurrency", metric} <= set(df.columns):
        return out
    ok = df[_is_ok(df)].assign(_v=lambda d: pd.to_numeric(d[metric], errors="coerce"))
    means = ok.dropna(subset=["_v"]).groupby(["engine_label", "max_concurrency"])["_v"].mean()
    for label in out:
        lo, hi = means.get((label, lo_users), math.nan), means.get((label, hi_users), math.nan)
        out[label] = float(hi / lo) if lo and math.isfinite(lo) and math.isfinite(hi) else math.nan
    return out


# --- declarative curves -------------------------------------------------------------------
@dataclass(frozen=True)
class Curves:
    """A chart by declaration, in the manner of vLLM's ``benchmarks/sweep/plot.py``: ``y``
    against ``x``, one curve per value of ``curve_by``, rows kept by ``filter_by``. Several
    ``y`` give one panel each. Failed runs are drawn as crosses and listed, as everywhere.
    ``saturation=True`` (or a :class:`Saturation`) marks each curve's throughput peak and
    latency knee on every panel."""

    y: str | tuple[str, ...] = "output_tok_s"
    x: str = "max_concurrency"
    curve_by: str = "engine_label"
    filter_by: tuple[tuple[str, Any], ...] = ()  # (column, value or tuple of values)
    title: str | None = None
    saturation: bool | Saturation = False

    @property
    def ys(self) -> tuple[str, ...]:
        return (self.y,) if isinstance(self.y, str) else tuple(self.y)


def _filtered(df: pd.DataFrame, spec: Curves) -> pd.DataFrame:
    for col, want in spec.filter_by:
        if col not in df.columns:
            return df.iloc[0:0]
        values = want if isinstance(want, tuple | list) else (want,)
        df = df[df[col].astype("string").isin([str(v) for v in values]).fillna(False)]
    return df


def curves(df: pd.DataFrame, spec: Curves) -> alt.TopLevelMixin:
    """Draw ``spec`` from a results frame (any rows: only ok ones get a point)."""
    df = _filtered(df, spec)
    if spec.curve_by != "engine_label" and spec.curve_by in df.columns:
        df = df.assign(engine_label=spec.curve_by + "="
                       + df[spec.curve_by].astype("string").fillna("default"))
    panels = [_measured(df, spec.x, {y: y}, axis_title(y), spec.title if spec.title and
                        len(spec.ys) == 1 else
                        f"{axis_title(y)} vs {axis_title(spec.x).split(' (')[0].lower()}",
                        saturation=_saturation(spec.saturation))
              for y in spec.ys]
    return panels[0] if len(panels) == 1 else alt.hconcat(*panels).resolve_scale(
        color="shared")
