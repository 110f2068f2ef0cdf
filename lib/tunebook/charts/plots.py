"""Altair charts of a results frame (schema.COLUMNS + engine-knob columns), and of the manual.

Conventions, shared by every chart of measured data:
- only ``status == "ok"`` rows are plotted; every other row (engine_failed, failed,
  interrupted, or ok without the metric) is drawn as a cross at its load point and listed in
  a note "engine_failed: <engine_label> …" — nothing is dropped silently;
- repeats are averaged; where a load point has two or more runs, bars show the mean's 95%
  Student-t interval (tunebook.results.stats; one run draws no bar: it measures no noise);
- on concurrency charts, ``saturation`` marks each curve's throughput peak and latency knee
  (tunebook.results.stats.saturation states both rules);
- x is concurrent users on a log2 axis; colour is ``engine_label``;
- the manual's numbers are shown in words, one line per number with its unit, in grey and
  titled "reference" (never bars: one figure's numbers carry different units).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from tunebook.core import schema
from tunebook.core.knobs import KNOBS
from tunebook.core.manual import RESULT, SETTING, SOURCE, Ref
from tunebook.inputs import slo
from tunebook.results import stats
from tunebook.results.store import ok_rows

WIDTH, HEIGHT = 380, 260
REFERENCE_FILL, REFERENCE_STROKE = "#e0e0e0", "#616161"
FAILURE_COLOUR = "#c2185b"
PALETTE = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2",
           "#ff9da6", "#9d755d", "#bab0ac")  # Vega's tableau10, the default scheme
PERCENTILES = ("p50", "p90", "p99")
_CONTEXT = ("hardware", "model", "dataset", "input_len", "output_len", "prefix_len",
            "request_rate")
_METRIC_NAMES = {"ttft": "Time to first token", "tpot": "Time per output token",
                 "itl": "Inter-token latency", "e2el": "End-to-end latency"}
_TITLES = {
    "output_tok_s": "Output throughput, all users (tok/s)",
    "total_tok_s": "Input + output throughput (tok/s)",
    "output_tok_s_per_user": "Output throughput per user (tok/s)",
    "max_output_tok_s": "Peak 1-s output throughput (tok/s)",
    "request_throughput_req_s": "Completed requests (req/s)",
    "max_concurrency": "Concurrent users (log2)",
    "prefix_len": "Shared prefix (tokens)",
    "request_rate": "Offered load (req/s, log2)",
    "replay_speed": "Replay speed (× the trace's own request rate, log2)",
    "request_goodput_req_s": "Goodput: requests that met every bound (req/s)",
    "slo_attainment": "Requests that met every bound (share of those sent)",
    "usd_per_m_output_tok": "USD per million output tokens (your price)",
    "energy_per_output_tok_j": "Energy per output token (J)",
    "mean_power_w": "Mean GPU power (W)",
}
_QUALIFIER = {"=": "", "≈": "≈ ", ">": "> ", "≤": "≤ "}
_VL_VERSION = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])


# --- small helpers ------------------------------------------------------------------------
def axis_title(column: str) -> str:
    """A readable axis title with the unit, from a result column's name."""
    if column in _TITLES:
        return _TITLES[column]
    m = re.fullmatch(r"(mean|median|std|p\d+)_(ttft|tpot|itl|e2el)_ms", column)
    if m:
        return f"{m[1].upper() if m[1][0] == 'p' else m[1].capitalize()} {m[2].upper()} (ms)"
    doc = {c.name: c.doc for c in schema.COLUMNS}.get(column)
    name = column if column in KNOBS else column.replace("_", " ")  # vLLM's knobs by name
    return f"{name} ({doc})" if doc else name


def _words(column: str) -> str:
    """A result column named in a sentence: its axis title, lower case, without the unit
    ("median TPOT", "output throughput, all users")."""
    title = axis_title(column).split(" (")[0]
    return title[0].lower() + title[1:] if title[:2] != title[:2].upper() else title


def fmt(value, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    text = f"{round(float(value), 3):,}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return f"{text}×" if unit == "x" else f"{text} {unit}".strip()


def titled(text: str, subtitle: Iterable[str] = ()) -> alt.TitleParams:
    lines = [ln for ln in subtitle if ln]
    return alt.TitleParams(text, subtitle=lines or alt.Undefined, anchor="start",
                           subtitleColor="#555", fontSize=14)


def wrap(text: str, width: int = 70) -> list[str]:
    return textwrap.wrap(text, width)


def _vl_type(column: pd.Series) -> str:
    numeric = pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
    return "quantitative" if numeric else "nominal"


def _knobs(df: pd.DataFrame) -> list[str]:
    """Engine-knob columns: anything a results frame has beyond the schema."""
    return [c for c in df.columns if c not in schema.COLUMN_NAMES and not c.startswith("_")]


def require(df: pd.DataFrame, *columns: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"results frame lacks columns {missing}")


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """engine_label as a chart shows it (display_label), never missing (a row without one
    must still be shown)."""
    labels = df["engine_label"].astype("string").fillna("(no label)")
    return df.assign(engine_label=labels.map(display_label).astype("string"))


def _is_ok(df: pd.DataFrame) -> pd.Series:
    return pd.Series(df.index.isin(ok_rows(df).index), index=df.index)


def _labels(df: pd.DataFrame) -> list[str]:
    return sorted(df["engine_label"].dropna().astype(str).unique())


def _colour(domain: list[str], colours: Mapping[str, str] | None = None) -> alt.Color:
    """The engine config's colour: by its place in `domain`, or `colours[label]` where given
    (a config keeps its colour while others are dropped: the tuning panel)."""
    palette = [colours.get(d, PALETTE[i % len(PALETTE)]) for i, d in enumerate(domain)] \
        if colours else list(PALETTE)
    return alt.Color("engine_label:N", title="engine config", legend=alt.Legend(labelLimit=320),
                     scale=alt.Scale(domain=domain, range=palette))


def _x(x: str, values: pd.Series) -> alt.X:
    values = sorted({float(v) for v in values.dropna()})
    log = bool(values) and values[0] > 0
    scale = alt.Scale(type="log", base=2) if log else alt.Scale(zero=False)
    return alt.X(f"{x}:Q", title=axis_title(x), scale=scale,
                 axis=alt.Axis(values=values or alt.Undefined, format="~g", grid=True))


def _repeats_text(agg: pd.DataFrame) -> str | None:
    """"mean of 3 repeats, bars = 95% CI" when some load point has repeats, else None."""
    runs = agg["runs"] if len(agg) else pd.Series(dtype=int)
    if runs.empty or int(runs.max()) < 2:
        return None
    lo, hi = int(runs.min()), int(runs.max())
    n = str(hi) if lo == hi else f"{lo}–{hi}"
    where = "" if lo >= 2 else " where ≥ 2"
    return f"mean of {n} repeats, bars = {stats.CONFIDENCE:.0%} CI{where}"


def _context(df: pd.DataFrame, repeats: str | None) -> list[str]:
    """One subtitle line: what these runs have in common."""
    def one(col):
        vals = df[col].dropna().unique() if col in df else []
        return str(vals[0]) if len(vals) == 1 else None

    dataset = (one("dataset") or "prompts").replace("_", " ")  # vLLM's name, in words
    shape = (f"{dataset} {one('input_len')}→{one('output_len')} tokens"
             if one("input_len") and one("output_len") else None)
    parts = [one("hardware"), one("model"), shape, repeats]
    return [" · ".join(p for p in parts if p)]


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


# --- display labels -----------------------------------------------------------------------
def _gib(v: Any) -> str:
    return f"{float(v) / 2**30:.4g} GiB"


def _spec(v: Any) -> str:
    d = json.loads(v) if isinstance(v, str) else v
    if not isinstance(d, dict):
        return str(v)
    depth = d.get("num_speculative_tokens")
    method = d.get("method", "?")
    if method == "draft_model" and d.get("model"):  # which draft: a path shows its last part
        method = f"draft {str(d['model']).rstrip('/').rsplit('/', 1)[-1]}"
    return f"spec {method}" + (f" ×{depth}" if depth is not None else "")


# knob -> how a label shows it where the raw value is unreadable (bytes, a JSON mapping); the
# stored label keeps vLLM's names and raw values, and other knobs show as name=value.
_HUMAN: dict[str, Callable[[Any], str]] = {
    "kv_cache_memory_bytes": lambda v: f"KV pool {_gib(v)}",
    "speculative_config": _spec,
}
_LABEL_PART = re.compile(r"(?:^|, )([a-z_]+)=")


def display_label(label: str) -> str:
    """An engine label as a chart shows it: ``kv_cache_memory_bytes=21474836480`` →
    ``KV pool 20 GiB``; knobs without a rule keep ``name=value``."""
    label = str(label)
    marks = list(_LABEL_PART.finditer(label))
    if not marks:
        return label
    parts = []
    for m, nxt in zip(marks, [*marks[1:], None], strict=True):
        value = label[m.end(): nxt.start() if nxt else len(label)]
        fmt = _HUMAN.get(m[1])
        try:
            parts.append(fmt(value) if fmt else f"{m[1]}={value}")
        except (TypeError, ValueError):
            parts.append(f"{m[1]}={value}")
    return ", ".join(parts)


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


# --- engine starts ------------------------------------------------------------------------
PHASE_COLOURS = ("#9ecae9", "#4c78a8", "#bab0ac", "#54a24b", "#e45756", "#eeca3b", "#b279a2",
                 "#f58518", "#72b7b2")  # one per start_phases.PHASES, in start order
# each phase as the chart's legend names it (start_phases.PHASES are identifiers)
PHASE_WORDS = {"api_import": "vLLM import", "engine_core": "engine core start",
               "worker_init": "device setup", "weights": "weights", "compile": "compile",
               "profile_kv": "KV cache sizing", "cuda_graphs": "CUDA graphs",
               "warmup": "warm-up", "api_ready": "API server ready"}


def start_phases(frame: pd.DataFrame, title: str = "Where each engine start's time went"
                 ) -> alt.LayerChart | None:
    """Stacked bars, one per engine start (start_phases.phases_frame), phases in start order;
    the total (spawn → /health) and the compile cache's state at the end of each bar."""
    from tunebook.servers.start_phases import PHASES, long_form

    data = long_form(frame)
    if data.empty:
        return None
    shown = [PHASE_WORDS.get(p, p) for p in PHASES]
    data["phase"] = data["phase"].map(lambda p: PHASE_WORDS.get(p, p))
    starts = frame.reset_index(drop=True)
    names = [f"{i + 1}. {display_label(str(r['engine_label']))}"
             for i, r in starts.iterrows()]
    data["engine start"] = [names[i] for i in data["start"]]
    y = alt.Y("engine start:N", title=None, sort=names, axis=alt.Axis(labelLimit=320))
    bars = alt.Chart(data).mark_bar(stroke="white", strokeWidth=0.5).encode(
        y=y, x=alt.X("sum(seconds):Q", title="seconds from spawn to /health answering"),
        color=alt.Color("phase:N", sort=shown, title="phase",
                        scale=alt.Scale(domain=shown, range=list(PHASE_COLOURS)),
                        legend=alt.Legend(orient="bottom", columns=5)),
        order=alt.Order("order:Q"),
        tooltip=["engine start", "phase", alt.Tooltip("seconds:Q", format=".1f"),
                 alt.Tooltip("startup_s:Q", format=".1f", title="start total (s)"),
                 "compile_cache"])
    totals = pd.DataFrame({
        "engine start": names, "startup_s": starts["startup_s"].astype(float),
        "label": [f"{float(r['startup_s']):.0f} s" + (
            f" · compile cache {r['compile_cache']}" if isinstance(r.get("compile_cache"), str)
            else "") for _, r in starts.iterrows()]})
    text = alt.Chart(totals).mark_text(align="left", dx=4, fontSize=10).encode(
        y=y, x="startup_s:Q", text="label:N")
    together = starts.get("engines_started_together")
    note = ("engines started together: those starts were timed under contention"
            if together is not None and (pd.to_numeric(together, errors="coerce") > 1).any()
            else None)
    return alt.layer(bars, text).properties(
        width=WIDTH + 120, height=alt.Step(22),
        title=titled(title, ["phases cut at vLLM's own log lines (± 1 s); hover for seconds",
                             note or ""]))


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


# --- export -------------------------------------------------------------------------------
def _vlc():  # imported when exporting: a machine without vl-convert can still draw charts
    import vl_convert

    return vl_convert


_EXPORTERS = {
    "png": lambda spec: _vlc().vegalite_to_png(spec, _VL_VERSION, scale=2),
    "svg": lambda spec: _vlc().vegalite_to_svg(spec, _VL_VERSION).encode("utf-8"),
    "pdf": lambda spec: _vlc().vegalite_to_pdf(spec, _VL_VERSION),
}


def save_chart(chart: alt.TopLevelMixin, path_stem: Path,
               formats: Iterable[str] = ("png", "svg")) -> list[Path]:
    """Write ``<path_stem>.<fmt>`` for each format (png, svg, pdf, html) with vl-convert."""
    formats, path_stem = list(formats), Path(path_stem)
    unknown = [f for f in formats if f != "html" and f not in _EXPORTERS]
    if unknown:
        raise ValueError(f"unknown formats {unknown}; use png, svg, pdf or html")
    written = save_spec(chart.to_json(), path_stem, [f for f in formats if f != "html"])
    if "html" in formats:
        path = path_stem.parent / f"{path_stem.name}.html"
        path.write_text(offline_html(chart), encoding="utf-8")
        written.append(path)
    return written


def save_spec(spec: str | dict, path_stem: Path, formats: Iterable[str] = ("png", "svg"),
              ) -> list[Path]:
    """Write a Vega-Lite spec (a chart's JSON) as ``<path_stem>.<fmt>`` for png/svg/pdf."""
    path_stem = Path(path_stem)
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        if fmt not in _EXPORTERS:
            raise ValueError(f"unknown format {fmt!r}; use png, svg or pdf")
        path = path_stem.parent / f"{path_stem.name}.{fmt}"
        path.write_bytes(_EXPORTERS[fmt](spec))
        written.append(path)
    return written


def offline_html(chart: alt.TopLevelMixin) -> str:
    """A standalone HTML page with vega, vega-lite and vega-embed inlined (no network)."""
    return chart.to_html(inline=True)


__all__ = [
    "Curves", "Ratio", "Saturation", "axis_title", "beside", "curves", "display_label",
    "latency_percentiles", "manual_panel", "offline_html", "overlay", "ratio_bars",
    "ratio_first", "ref_bars", "ref_text", "reference_lines", "save_chart", "save_spec",
    "scaling", "scaling_ratios", "wrapped_labels",
]


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
