"""What every chart of tunebook.charts shares: sizes, colours, the titles of result columns,
the small helpers, and engine labels as a chart shows them (``display_label``).

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

import json
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import altair as alt
import pandas as pd

from tunebook.core import schema
from tunebook.core.knobs import KNOBS
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
