"""Altair charts of a results frame (schema.COLUMNS + engine-knob columns), and of the manual.

Conventions, shared by every chart of measured data:
- only ``status == "ok"`` rows are plotted; every other row (engine_failed, failed,
  interrupted, or ok without the metric) is drawn as a cross at its load point and listed in
  a note "engine_failed: <engine_label> …" — nothing is dropped silently;
- repeats are averaged; when a load point has more than one run, bars show min–max;
- x is concurrent users on a log2 axis; colour is ``engine_label``;
- the manual's numbers are drawn in grey with dashed outlines and titled "reference".
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import altair as alt
import pandas as pd

from tunebook import schema
from tunebook.manual import SOURCE, figure, reference_frame

WIDTH, HEIGHT = 380, 260
REFERENCE_FILL, REFERENCE_STROKE = "#e0e0e0", "#616161"
FAILURE_COLOUR = "#c2185b"
PALETTE = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2",
           "#ff9da6", "#9d755d", "#bab0ac")  # Vega's tableau10, the default scheme
PERCENTILES = ("p50", "p90", "p99")
STARTUP_FACTS = {  # column -> header (Fig 1.1)
    "vllm_version": "vLLM",
    "model_runner": "runner",
    "attention_backend": "attention",
    "weights_gib": "weights (GiB)",
    "kv_cache_gib": "KV cache (GiB)",
    "kv_pool_tokens": "KV pool (tokens)",
    "max_concurrency_x": "max concurrency (x)",
}
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
    "max_concurrency": "Concurrent users (max_concurrency, log2)",
    "request_rate": "Offered load (req/s, log2)",
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
    return f"{column} ({doc})" if doc else column


def _fmt(value, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    text = f"{round(float(value), 3):,}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return f"{text}×" if unit == "x" else f"{text} {unit}".strip()


def _title(text: str, subtitle: Iterable[str] = ()) -> alt.TitleParams:
    lines = [ln for ln in subtitle if ln]
    return alt.TitleParams(text, subtitle=lines or alt.Undefined, anchor="start",
                           subtitleColor="#555", fontSize=14)


def _wrap(text: str, width: int = 70) -> list[str]:
    return textwrap.wrap(text, width)


def _vl_type(column: pd.Series) -> str:
    numeric = pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
    return "quantitative" if numeric else "nominal"


def _knobs(df: pd.DataFrame) -> list[str]:
    """Engine-knob columns: anything a results frame has beyond the schema."""
    return [c for c in df.columns if c not in schema.COLUMN_NAMES and not c.startswith("_")]


def _require(df: pd.DataFrame, *columns: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"results frame lacks columns {missing}")


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    """engine_label as strings, never missing (a row without one must still be shown)."""
    return df.assign(engine_label=df["engine_label"].astype("string").fillna("(no label)"))


def _is_ok(df: pd.DataFrame) -> pd.Series:
    return df["status"].astype("string").eq(schema.STATUS_OK).fillna(False).astype(bool)


def _labels(df: pd.DataFrame) -> list[str]:
    return sorted(df["engine_label"].dropna().astype(str).unique())


def _colour(domain: list[str]) -> alt.Color:
    return alt.Color("engine_label:N", title="engine config", legend=alt.Legend(labelLimit=320),
                     scale=alt.Scale(domain=domain, range=list(PALETTE)))


def _x(x: str, values: pd.Series) -> alt.X:
    values = sorted({float(v) for v in values.dropna()})
    log = bool(values) and values[0] > 0
    scale = alt.Scale(type="log", base=2) if log else alt.Scale(zero=False)
    return alt.X(f"{x}:Q", title=axis_title(x), scale=scale,
                 axis=alt.Axis(values=values or alt.Undefined, format="~g", grid=True))


def _context(df: pd.DataFrame, repeats: bool) -> list[str]:
    """One subtitle line: what these runs have in common."""
    def one(col):
        vals = df[col].dropna().unique() if col in df else []
        return str(vals[0]) if len(vals) == 1 else None

    shape = (f"{one('dataset') or 'prompts'} {one('input_len')}→{one('output_len')} tokens"
             if one("input_len") and one("output_len") else None)
    parts = [one("hardware"), one("model"), shape,
             "mean of repeats, bars = min–max" if repeats else None]
    return [" · ".join(p for p in parts if p)]


# --- measured series ----------------------------------------------------------------------
def _aggregate(ok: pd.DataFrame, x: str, series: Mapping[str, str]) -> pd.DataFrame:
    """Long frame: one row per (engine_label, series, x) with mean/min/max over repeats."""
    extra = [c for c in (*_CONTEXT, *_knobs(ok)) if c in ok.columns and c != x]
    long = ok.melt(id_vars=["engine_label", x, *extra], value_vars=list(series),
                   var_name="metric", value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce")
    long = long.dropna(subset=["value", x])
    long["series"] = long["metric"].map(series)
    keys = ["engine_label", "series", x]
    if long.empty:
        return pd.DataFrame(columns=[*keys, "mean", "min", "max", "runs", *extra])
    grouped = long.groupby(keys, sort=True)
    stats = grouped["value"].agg(mean="mean", min="min", max="max", runs="count")
    return stats.join(grouped[extra].first()).reset_index() if extra else stats.reset_index()


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
        at = ", ".join(_fmt(v) for v in sorted(g[x].dropna().unique()))
        lines.append(f"{reason}: {label}" + (f" ({x} {at})" if at else ""))
    return "\n".join(lines)


def _tooltip(frame: pd.DataFrame, x: str, first: Iterable[str]) -> list[alt.Tooltip]:
    fmt = {"mean": ".4~g", "min": ".4~g", "max": ".4~g"}
    cols = [c for c in ("engine_label", x, *first) if c in frame.columns]
    cols += [c for c in frame.columns if c not in cols]
    return [alt.Tooltip(field=c, type=_vl_type(frame[c]), format=fmt.get(c, alt.Undefined))
            for c in cols]


def _measured(df: pd.DataFrame, x: str, series: Mapping[str, str], y_title: str,
              title: str, dash_title: str | None = None) -> alt.LayerChart:
    """Mean line per engine_label (and series), min–max bars, failures as crosses + a note."""
    _require(df, "engine_label", "status", x, *series)
    df = _labelled(df)
    ok = df[_is_ok(df)]
    agg = _aggregate(ok, x, series)
    issues = _not_plotted(df, x, series)
    domain = _labels(df)
    xenc, colour = _x(x, pd.concat([agg[x], issues[x]])), _colour(domain)
    repeats = bool(len(agg)) and int(agg["runs"].max()) > 1
    enc = dict(x=xenc, color=colour, tooltip=_tooltip(agg, x, ("series", "mean", "min", "max")))
    base = alt.Chart(agg).encode(y=alt.Y("mean:Q", title=y_title), **enc)
    dash = (alt.StrokeDash("series:N", title=dash_title, sort=list(series.values()))
            if dash_title else alt.Undefined)  # only on the line, so the legend shows dashes
    layers = [base.mark_line().encode(strokeDash=dash),
              base.mark_point(filled=True, size=36, opacity=1)]
    if repeats:
        layers.append(alt.Chart(agg).mark_errorbar(ticks=True).encode(
            y=alt.Y("min:Q", title=y_title), y2="max:Q", **enc))
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
        width=WIDTH, height=HEIGHT, title=_title(title, _context(ok, repeats)))


def scaling(df: pd.DataFrame, y: str = "output_tok_s", x: str = "max_concurrency",
            title: str | None = None) -> alt.LayerChart:
    """A measured metric vs concurrent users, one line per engine config."""
    return _measured(df, x, {y: y}, axis_title(y),
                     title or f"{axis_title(y)} vs {axis_title(x).split(' (')[0].lower()}")


def overlay(frames: Mapping[str, pd.DataFrame], y: str = "output_tok_s",
            x: str = "max_concurrency", title: str | None = None) -> alt.LayerChart:
    """Several experiments in one chart (CPU vs H200, vLLM 0.26 vs 0.32, yesterday vs today):
    one line per experiment × engine config, labelled "<experiment> · <engine config>"."""
    if not frames:
        raise ValueError("overlay needs at least one experiment")
    parts = []
    for name, df in frames.items():
        _require(df, "engine_label", "status", x, y)
        parts.append(_labelled(df).assign(
            engine_label=lambda d, n=name: n + " · " + d["engine_label"].astype(str)))
    names = " vs ".join(frames)
    return _measured(pd.concat(parts, ignore_index=True), x, {y: y}, axis_title(y),
                     title or f"{axis_title(y)}: {names}")


def latency_percentiles(df: pd.DataFrame, metric: str = "tpot") -> alt.LayerChart:
    """p50 / p90 / p99 of ttft, tpot, itl or e2el (ms) vs concurrent users."""
    if metric not in _METRIC_NAMES:
        raise ValueError(f"metric must be one of {list(_METRIC_NAMES)}, not {metric!r}")
    series = {f"{p}_{metric}_ms": p for p in PERCENTILES}
    name = f"{_METRIC_NAMES[metric]} ({metric.upper()}, ms)"
    return _measured(df, "max_concurrency", series, name,
                     f"{name}: p50 / p90 / p99 vs concurrent users", dash_title="percentile")


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


# --- the manual ---------------------------------------------------------------------------
def _reference_title(fig: str) -> str:
    f = figure(fig)
    return f"vLLM manual Fig {f.fig} — reference ({f.hardware or 'machine not named'}, {f.model})"


def manual_panel(fig: str) -> alt.LayerChart:
    """The manual's numbers for one figure as labelled rows; grey dashed bars compare the
    numbers that share a unit (bar length is relative within the unit, so no axis)."""
    f = figure(fig)
    data = reference_frame([f.fig])
    data["label"] = [
        ("setting: " if r.kind == "setting" else "")
        + _QUALIFIER[r.qualifier]
        + _fmt(r.value, r.unit)
        for r in data.itertuples()
    ]
    per_unit = data[data.kind == "result"].groupby("unit")["value"]
    count = per_unit.transform("count").reindex(data.index)  # NaN for settings
    share = (data["value"] / per_unit.transform("max")).reindex(data.index)
    data["bar"] = share.where(count > 1, 0.0)  # a bar only where two results share a unit
    if data.empty:
        data = pd.DataFrame({"ref": ["(no numbers)"], "label": ["this figure states no numbers"],
                             "bar": [0.0], "source": [SOURCE]})
    y = alt.Y("ref:N", sort=None, title=None, axis=alt.Axis(labelLimit=260))
    x = alt.X("bar:Q", axis=None, scale=alt.Scale(domain=[0, 1.8]))
    tips = [c for c in ("ref", "value", "unit", "qualifier", "kind", "meaning", "source")
            if c in data.columns]
    base = alt.Chart(data).encode(y=y, x=x, tooltip=tips)
    bars = base.mark_bar(fill=REFERENCE_FILL, stroke=REFERENCE_STROKE, strokeDash=[3, 2],
                         strokeWidth=1, height=14)
    text = base.mark_text(align="left", dx=5, fontStyle="italic", color=REFERENCE_STROKE
                          ).encode(text="label:N")
    subtitle = [*_wrap(f.claim), *(_wrap(f.note) if f.note else []), SOURCE]
    return alt.layer(bars, text).properties(
        width=260, height=alt.Step(24), title=_title(_reference_title(f.fig), subtitle))


def beside(measured: alt.TopLevelMixin, fig: str) -> alt.HConcatChart:
    """A measured chart with the manual's reference panel for ``fig`` on its right."""
    return alt.hconcat(measured, manual_panel(fig), spacing=40).resolve_scale(
        color="independent")


def ratio_vs_manual(measured: Mapping[str, float | Mapping[str, float]],
                    fig: str) -> alt.LayerChart:
    """Grouped bars: a ratio measured here beside the manual's, per ref of ``fig``.

    ``measured`` maps ref names of the figure (e.g. "output_ratio_64_vs_1") to a number, or
    to {engine_label: number} as ``scaling_ratios`` returns. Empty: the figure's ratio refs,
    nothing measured. NaN/None shows as "not measured".
    """
    f = figure(fig)
    if not measured:
        measured = {r.name: math.nan for r in f.results if r.unit == "x"}
    rows = []
    for name, value in measured.items():
        ref = f.ref(name)
        rows.append({"ref": name, "source": "manual (reference)", "value": ref.value,
                     "label": _QUALIFIER[ref.qualifier] + _fmt(ref.value, ref.unit),
                     "meaning": ref.meaning})
        per_engine = value if isinstance(value, Mapping) else {None: value}
        for label, v in sorted(per_engine.items(), key=lambda kv: str(kv[0])):
            v = float(v) if v is not None else math.nan
            rows.append({"ref": name, "value": v if math.isfinite(v) else None,
                         "source": "measured here" + (f" · {label}" if label else ""),
                         "label": _fmt(v, ref.unit) if math.isfinite(v) else "not measured",
                         "meaning": ref.meaning})
    data = pd.DataFrame(rows)
    data["label_y"] = data["value"].fillna(0.0)
    sources = list(dict.fromkeys(data["source"]))
    units = sorted({f.ref(n).unit for n in measured})
    colour = alt.Color("source:N", title=None, legend=alt.Legend(labelLimit=400), scale=alt.Scale(
        domain=sources, range=[REFERENCE_FILL, *PALETTE][: len(sources)]))
    enc = dict(x=alt.X("ref:N", title=None, axis=alt.Axis(labelAngle=0, labelLimit=220)),
               xOffset=alt.XOffset("source:N", sort=sources),
               tooltip=["ref", "source", "value", "meaning"])
    y_title = "ratio (×)" if units == ["x"] else f"value ({', '.join(units)})"
    bars = alt.Chart(data).mark_bar(stroke=REFERENCE_STROKE, strokeWidth=0.5).encode(
        y=alt.Y("value:Q", title=y_title), color=colour, **enc)
    text = alt.Chart(data).mark_text(dy=-5, fontSize=10).encode(
        y="label_y:Q", text="label:N", **enc)
    layers = [bars, text]
    if units == ["x"]:
        layers.append(alt.Chart(pd.DataFrame({"one": [1.0]})).mark_rule(
            strokeDash=[2, 2], color="#999").encode(y="one:Q"))
    return alt.layer(*layers).properties(
        width=alt.Step(60), height=HEIGHT,
        title=_title(f"Fig {f.fig}: measured here vs the manual's reference",
                     [*_wrap(f.claim), SOURCE]))


# --- start-up facts -----------------------------------------------------------------------
def _fact_text(column: str, value) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "—"
    if column == "kv_pool_tokens":
        return f"{int(value):,}"
    if column in ("weights_gib", "kv_cache_gib"):
        return f"{float(value):.2f}"
    if column == "max_concurrency_x":
        return f"{float(value):.2f}×"
    return str(value)


def startup_table(df: pd.DataFrame) -> alt.Chart:
    """Fig 1.1's six start-up facts (+ vLLM's max concurrency 'x') per engine config."""
    _require(df, "engine_label")
    facts = [c for c in STARTUP_FACTS if c in df.columns]
    rows = []
    for label, g in _labelled(df).groupby("engine_label", sort=True):
        firsts = {c: (g[c].dropna().iloc[0] if g[c].notna().any() else None) for c in facts}
        runs = g["status"].astype(str).value_counts() if "status" in g else pd.Series(dtype=int)
        cells = {STARTUP_FACTS[c]: _fact_text(c, v) for c, v in firsts.items()}
        cells["runs"] = ", ".join(f"{n} {s}" for s, n in runs.items()) or "—"
        rows += [{"engine_label": label, "fact": k, "text": v} for k, v in cells.items()]
    data = pd.DataFrame(rows, columns=["engine_label", "fact", "text"])
    order = [*(STARTUP_FACTS[c] for c in facts), "runs"]
    return alt.Chart(data).mark_text(align="center", fontSize=12).encode(
        x=alt.X("fact:N", sort=order, title=None,
                axis=alt.Axis(orient="top", labelAngle=0, labelLimit=160, ticks=False,
                              domain=False)),
        y=alt.Y("engine_label:N", title=None, axis=alt.Axis(labelLimit=300, ticks=False,
                                                            domain=False)),
        text="text:N",
        color=alt.condition(alt.datum.text == "—", alt.value("#aaa"), alt.value("#222")),
        tooltip=["engine_label", "fact", "text"],
    ).properties(
        width=alt.Step(125), height=alt.Step(24),
        title=_title("Engine start-up facts per engine config (Fig 1.1)",
                     ["first value over each config's runs, read from the engine log; "
                      "— = not in the log"]))


# --- chapters 1-2: processes, KV cache, memory -------------------------------------------
# The manual's palette (front matter): blue = vLLM server, violet = model, green = KV cache,
# rose = failure, grey = outside vLLM.
ROLE_COLOUR = {"API server": "#4c78a8", "engine core": "#2f5d8a", "worker": "#8e6bbf",
               "helper": "#9e9e9e", "other": "#bdbdbd"}


def process_tree(tree: list[dict], title_note: str = "") -> alt.LayerChart:
    """Fig 1.2: the engine's processes as a drawn tree (parent → child), one box each with
    role, pid and title; a thick outline marks the process that holds the GPU."""
    if not tree:
        return alt.Chart(pd.DataFrame({"t": ["no process tree recorded"]})).mark_text(
        ).encode(text="t:N").properties(width=WIDTH, height=60)
    by_pid = {p["pid"]: p for p in tree}
    depth: dict[int, int] = {}

    def d(pid: int) -> int:
        if pid not in depth:
            parent = by_pid[pid]["ppid"]
            depth[pid] = 0 if parent not in by_pid else d(parent) + 1
        return depth[pid]

    rows, row_of_depth = [], {}
    for p in tree:  # psutil lists parents before their children
        k = d(p["pid"])
        row_of_depth[k] = row_of_depth.get(k, -1) + 1
        rows.append({"pid": p["pid"], "ppid": p["ppid"], "x": k, "y": row_of_depth[k],
                     "role": p["role"], "title": str(p.get("title", ""))[:38],
                     "label": f"{p['role']} · pid {p['pid']}",
                     "gpu": "holds the GPU" if p.get("holds_gpu") else "",
                     "rss_gib": round(float(p.get("rss_gib") or 0), 2),
                     "threads": p.get("threads")})
    nodes = pd.DataFrame(rows)
    nodes["title"] = nodes["title"].map(lambda t: t.rsplit("/", 1)[-1][:30])
    nodes = nodes.assign(x0=nodes.x - 0.4, x1=nodes.x + 0.4, y0=nodes.y - 0.36,
                         y1=nodes.y + 0.36)
    pos = nodes.set_index("pid")[["x", "y"]]
    edges = pd.DataFrame([{"x": pos.loc[r.ppid, "x"] + 0.4, "y": pos.loc[r.ppid, "y"],
                           "x2": r.x - 0.4, "y2": r.y}
                          for r in nodes.itertuples() if r.ppid in pos.index])
    xs = alt.Scale(domain=[-0.5, nodes.x.max() + 0.5])
    ys = alt.Scale(domain=[nodes.y.max() + 0.5, -0.5])
    x = alt.X("x:Q", axis=None, scale=xs)
    y = alt.Y("y:Q", axis=None, scale=ys)
    layers = []
    if len(edges):
        layers.append(alt.Chart(edges).mark_rule(color="#888", strokeWidth=1.5).encode(
            x=x, y=y, x2="x2:Q", y2="y2:Q"))
    tips = ["role", "pid", "ppid", "title", "rss_gib", "threads", "gpu"]
    roles = list(dict.fromkeys(nodes.role))
    layers.append(alt.Chart(nodes).mark_rect(cornerRadius=6, opacity=0.92).encode(
        x=alt.X("x0:Q", axis=None, scale=xs), x2="x1:Q",
        y=alt.Y("y0:Q", axis=None, scale=ys), y2="y1:Q",
        color=alt.Color("role:N", title="role", scale=alt.Scale(
            domain=roles, range=[ROLE_COLOUR.get(r, "#bdbdbd") for r in roles])),
        strokeWidth=alt.condition(alt.datum.gpu != "", alt.value(4), alt.value(0)),
        stroke=alt.value(FAILURE_COLOUR), tooltip=tips))
    base = alt.Chart(nodes).encode(x=x, y=y, tooltip=tips)
    layers.append(base.mark_text(dy=-10, fontSize=12, fontWeight="bold", color="white"
                                 ).encode(text="label:N"))
    layers.append(base.mark_text(dy=6, fontSize=10, color="white").encode(text="title:N"))
    layers.append(base.mark_text(dy=20, fontSize=10, color="#ffe0ec", fontWeight="bold"
                                 ).encode(text="gpu:N"))
    sub = ["parent → child, left to right; outline = holds the GPU (nvidia-smi)"]
    return alt.layer(*layers).properties(
        width=250 * (int(nodes.x.max()) + 1), height=80 * (int(nodes.y.max()) + 1),
        title=_title("The engine's processes (Fig 1.2)", [*sub, *_wrap(title_note)]))


def _ref_bars(data: pd.DataFrame, x: str, y: str, colour: str, x_title: str,
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
                                            title=_title(title, subtitle))


def kv_bytes(table: pd.DataFrame) -> alt.LayerChart:
    """Fig 2.1: KiB of KV cache per token — config formula, the engine's own pool, the manual."""
    data = table.assign(row=lambda d: d["model"] + " · KV " + d["kv_cache_dtype"].astype(str)
                        + " · " + d["source"])
    return _ref_bars(data, "kib_per_token", "row", "source", "KiB of KV cache per token",
                     "KV cache per token (Fig 2.1)",
                     ["formula: 2 × layers × KV heads × head_dim × dtype bytes (config.json); "
                      "engine: KV GiB ÷ pool tokens", SOURCE], fmt=",.4~g")


def users_fit(table: pd.DataFrame) -> alt.LayerChart:
    """Fig 2.2: users that fit the measured pool, at the full context and at 640 tokens."""
    ref = figure("2.2")
    rows = [{"row": "manual · full context", "users": ref.ref("users_fit_full_context").value,
             "source": "manual (reference), pool 24,096 tokens"},
            {"row": "manual · 640 tokens each", "users": ref.ref("users_fit_640_tokens").value,
             "source": "manual (reference), pool 24,096 tokens"}]
    for r in table.itertuples():
        src = f"measured: {r.engine_label} (pool {r.kv_pool_tokens:,})"
        rows += [{"row": f"{r.engine_label} · full context ({r.max_model_len:,})",
                  "users": r.users_fit_full_context, "source": src},
                 {"row": f"{r.engine_label} · 640 tokens each", "users": r.users_fit_640_tokens,
                  "source": src}]
    return _ref_bars(pd.DataFrame(rows), "users", "row", "source", "users that fit the pool",
                     "Users that fit the KV pool (Fig 2.2)",
                     ["pool ÷ tokens per user (full context = max_model_len); log scale off",
                      SOURCE], fmt=",.2f")


PART_COLOUR = {"weights": "#8e6bbf", "activation peak": "#d4a6c8", "non-torch": "#9e9e9e",
               "CUDA graphs": "#b279a2", "KV cache": "#54a24b"}


def memory_budget(table: pd.DataFrame) -> alt.LayerChart:
    """Fig 2.4: what vLLM took, stacked by part, against total × gpu_memory_utilization."""
    if table.empty:
        return alt.Chart(pd.DataFrame({"t": ["no memory budget line in these logs"]})
                         ).mark_text().encode(text="t:N").properties(width=WIDTH, height=40)
    parts = list(PART_COLOUR)
    y = alt.Y("engine_label:N", title=None, axis=alt.Axis(labelLimit=300))
    bars = alt.Chart(table).mark_bar().encode(
        y=y, x=alt.X("sum(gib):Q", title="GiB"),
        color=alt.Color("part:N", sort=parts, scale=alt.Scale(
            domain=parts, range=list(PART_COLOUR.values())), legend=alt.Legend(orient="bottom")),
        order=alt.Order("part_order:Q"), tooltip=["engine_label", "part", "gib"]
    ).transform_calculate(part_order=f"indexof({parts!r}, datum.part)")
    lim = table.drop_duplicates("engine_label")
    budget = alt.Chart(lim).mark_tick(color="#111", thickness=3, size=30).encode(
        y=y, x="budget_gib:Q", tooltip=["budget_gib", "fraction"])
    total = alt.Chart(lim).mark_tick(color=FAILURE_COLOUR, thickness=2, size=30).encode(
        y=y, x="total_gib:Q", tooltip=["total_gib"])
    f = figure("2.4")
    return alt.layer(bars, budget, total).properties(
        width=WIDTH + 120, height=alt.Step(40),
        title=_title("Memory vLLM took, by part (Fig 2.4)",
                     ["black tick: total × gpu_memory_utilization (vLLM's budget); "
                      "red tick: the device's memory",
                      f"manual (reference): {f.ref('vllm_memory_gib').value} of "
                      f"{f.ref('unified_memory_gib').value} GiB at 0.75 on a DGX Spark", SOURCE]))


def tokens_per_gib(table: pd.DataFrame) -> alt.LayerChart:
    """Fig 2.5: KV tokens per GiB by KV cache dtype, measured pools beside the manual."""
    f = figure("2.5")
    rows = [{"row": "manual · KV BF16", "tokens_per_gib": f.ref("tokens_per_gib_bf16").value,
             "source": "manual (reference, Qwen3-8B)"},
            {"row": "manual · KV FP8", "tokens_per_gib": f.ref("tokens_per_gib_fp8").value,
             "source": "manual (reference, Qwen3-8B)"}]
    for r in table.itertuples():
        rows.append({"row": f"{r.engine_label}", "tokens_per_gib": r.tokens_per_gib,
                     "source": f"measured · KV {r.kv_cache_dtype}"})
    return _ref_bars(pd.DataFrame(rows), "tokens_per_gib", "row", "source",
                     "tokens per GiB of KV cache", "KV tokens per GiB (Fig 2.5)",
                     ["from the measured pool: tokens ÷ KV GiB", SOURCE])


def failed_starts(table: pd.DataFrame) -> alt.Chart:
    """Fig 2.3 as a table: config → what went wrong → what to change."""
    rows = []
    for r in table.itertuples():
        rows += [{"engine_label": r.engine_label, "col": "what went wrong", "text": r.error},
                 {"engine_label": r.engine_label, "col": "change", "text": r.error_hint}]
    data = pd.DataFrame(rows, columns=["engine_label", "col", "text"])
    data["text"] = data["text"].fillna("—").map(lambda t: _wrap(str(t), 60))
    return alt.Chart(data).mark_text(align="left", fontSize=11, lineBreak="\n").encode(
        x=alt.X("col:N", sort=["what went wrong", "change"], title=None,
                axis=alt.Axis(orient="top", labelAngle=0)),
        y=alt.Y("engine_label:N", title=None, axis=alt.Axis(labelLimit=320)),
        text="text:N", color=alt.value(FAILURE_COLOUR),
    ).properties(width=alt.Step(380), height=alt.Step(70),
                 title=_title("Failed starts, diagnosed (Fig 2.3)",
                              ["the engine log line that explains each is in the table below"]))


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
    "axis_title", "beside", "latency_percentiles", "manual_panel", "offline_html", "overlay",
    "ratio_vs_manual", "save_chart", "save_spec", "scaling", "scaling_ratios", "startup_table",
]
