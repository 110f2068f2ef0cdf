"""`tunebook history EXPERIMENT`: each metric at each load point over the experiment's dated
measurements (`--again`, tunebook.results.measurements), asv-style: one chart per metric, a
line per load point, each measurement's mean with its interval from the repeats, and the steps
marked — a change beyond noise from one measurement to the next, family-wise over every step
of the page, with what else changed at that step (vLLM version, tunebook commit, machine,
engine knobs).

The unit of noise depends on what tunebook recorded. Where something recorded changed (a
version, the machine, an engine config), the repeats judge the step: new ÷ old with its Welch
interval excluding 1, the rule of tunebook diff. Where nothing recorded changed, the
measurements judge it: the runs of one measurement share the box's state of those minutes, so
their spread is not the box's noise (benchmarks/box_noise.py, 2 CPU cores: seven measurements
of one config on one warm engine, the lowest mean 0.53x and 0.56x of the highest in two runs,
the means' spread 1.5x what the runs predict). There a step is judged by the measurements'
means, their spread pooled over both sides (a new one against the earlier ones' spread: two
at least before it) — asv's unit, a commit's result. `verdict_since` is the same choice for
one dated measurement against the one before it (--again's exit code, the report's first
section).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from tunebook.charts.base import HEIGHT, WIDTH, axis_title, titled
from tunebook.charts.export import offline_html
from tunebook.core.knobs import KNOBS
from tunebook.present import diff
from tunebook.results import measurements, stats
from tunebook.results.store import Store, ok_rows, rows_to_frame

METRICS = ("output_tok_s", "median_tpot_ms", "p99_ttft_ms", "request_goodput_req_s")
NOTHING_RECORDED = "nothing tunebook records (the box, the driver, the load?)"


@dataclass(frozen=True)
class Step:
    metric: str
    load: str
    at: str  # the measurement it steps into (its start)
    ratio: float
    low: float
    high: float
    verdict: str  # better / worse beyond noise
    what_changed: str


def series(root: Path, metrics: tuple[str, ...] = METRICS) -> pd.DataFrame:
    """One row per (measurement, load point, metric): the mean of its repeats and their
    values (every stored attempt inside the measurement's window; one per run)."""
    ms = measurements.read(root)
    records = list(Store(root).records(requests=False))
    rows = []
    for m in ms:
        start, end = measurements.window(root, m.started)
        inside = [r["row"] for r in records if measurements.inside(r["row"], start, end)]
        if not inside:
            continue
        df = ok_rows(rows_to_frame(inside))
        for _, r in df.iterrows():
            for metric in metrics:
                v = r.get(metric)
                if v is not None and not pd.isna(v):
                    rows.append({"measurement": m.started, "load": diff.load_text(
                        diff.load_key(r.to_dict())), "metric": metric, "value": float(v),
                        "engine_label": r.get("engine_label"),
                        "engine_config_id": r.get("engine_config_id"),
                        "knobs": _knobs_of(r)})
    return pd.DataFrame(rows, columns=["measurement", "load", "metric", "value",
                                       "engine_label", "engine_config_id", "knobs"])


# a row's own column of a knob's name that is not that knob: `seed` is the dataset's, fresh
# per run (core.schema), not the engine's --seed
_NOT_KNOB_COLUMNS = {"seed"}


def _knobs_of(row: pd.Series) -> str:
    """The engine knobs a row was measured with (core.knobs' names among its columns), as
    sorted JSON: what a step names when a config changed behind its label."""
    out = {}
    for name in KNOBS.keys() - _NOT_KNOB_COLUMNS:
        v = row.get(name)
        if v is None or (not isinstance(v, str) and pd.isna(v)):
            continue
        v = v.item() if hasattr(v, "item") else v  # numpy scalars
        out[name] = int(v) if isinstance(v, float) and v.is_integer() else v
    return json.dumps(out, sort_keys=True, default=str)


def _knob_change(a: set[str], b: set[str]) -> str | None:
    """'max_num_seqs default → 1' from one measurement's knobs to the next's, each of one
    engine config (None: several configs a side, or no knob differs)."""
    if len(a) != 1 or len(b) != 1:
        return None
    ka, kb = json.loads(next(iter(a))), json.loads(next(iter(b)))
    said = [f"{k} {ka.get(k, 'default')} → {kb.get(k, 'default')}"
            for k in sorted(ka.keys() | kb.keys()) if ka.get(k) != kb.get(k)]
    return ", ".join(said) or None


def _recorded(ms: dict[str, measurements.Measurement], data: pd.DataFrame, a: str, b: str
              ) -> list[str]:
    """What tunebook recorded as changed from the measurement started at a to the one at b
    (empty: nothing): its vLLM, tunebook commit and machine (`ms`, by start), and its engine
    configs with the knobs behind them (`data`, series())."""
    parts = [data[data["measurement"] == s] for s in (a, b)]
    labels, knobs = [_configs(p) for p in parts], [_knob_sets(p) for p in parts]
    ma, mb = ms[a], ms[b]
    said = [f"{name} {x} → {y}" for name, x, y in (
        ("vLLM", ma.vllm, mb.vllm), ("tunebook", ma.tunebook_commit, mb.tunebook_commit),
        ("machine", ma.machine, mb.machine)) if x != y]
    if labels[0] != labels[1]:  # a knob, the model or engine_env: the config's id changed
        which = _knob_change(*knobs)
        said.append(f"engine configs {', '.join(sorted(labels[0]))} → "
                    f"{', '.join(sorted(labels[1]))}" + (f" ({which})" if which else ""))
    return said


def _changes(root: Path, data: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The measurements with data, in order, and what tunebook recorded as changed into each
    (the first: nothing)."""
    ms = {m.started: m for m in measurements.read(root)}
    order = [s for s in ms if s in set(data["measurement"])]
    return order, [[]] + [_recorded(ms, data, order[k - 1], order[k])
                          for k in range(1, len(order))]


def recorded(root: Path, a: str, b: str, data: pd.DataFrame | None = None) -> list[str]:
    """What tunebook recorded as changed between the measurements started at a and b."""
    data = series(root) if data is None else data
    return _recorded({m.started: m for m in measurements.read(root)}, data, a, b)


def _knob_sets(part: pd.DataFrame) -> set[str]:
    return set(part["knobs"].dropna()) if "knobs" in part else set()


def _split(groups: list[list[float]], confidence: float, explained: list[bool]
           ) -> tuple[int, stats.Interval] | None:
    """The most significant split of a series into before / after, and the after ÷ before
    interval there, when it excludes 1 (None: no step). explained[k]: something recorded
    changed into measurement k — the repeats of each side pooled judge it; else the
    measurements' means do (their spreads pooled: three measurements at least)."""
    best = None
    for k in range(1, len(groups)):
        if explained[k]:
            before = [v for g in groups[:k] for v in g]
            after = [v for g in groups[k:] for v in g]
            if min(len(before), len(after)) < diff.MIN_REPEATS:
                continue
            r = stats.ratio(stats.Interval.of(after, confidence),
                            stats.Interval.of(before, confidence), method="delta", dof="hsu")
        else:  # one box either side under the hypothesis: the means' spreads pooled, of
            # the measurements since the last recorded change and before the next (a config
            # change taken for the box's drift once made two alike measurements a step)
            first = max((j for j in range(k) if explained[j]), default=0)
            end = next((j for j in range(k + 1, len(groups)) if explained[j]), len(groups))
            r = stats.pooled_ratio([math.fsum(g) / len(g) for g in groups[k:end] if g],
                                   [math.fsum(g) / len(g) for g in groups[first:k] if g],
                                   confidence)
        if not r.known or r.low <= 1 <= r.high:
            continue
        score = abs(math.log(r.mean)) / max(r.high - r.low, 1e-12)
        if best is None or score > best[0]:
            best = (score, k, r)
    return None if best is None else (best[1], best[2])


def _segment(groups: list[list[float]], confidence: float, explained: list[bool],
             offset: int = 0) -> list[tuple[int, stats.Interval]]:
    """Binary segmentation: the step of the whole series, then of each side of it."""
    if len(groups) < 2:
        return []
    found = _split(groups, confidence, explained)
    if found is None:
        return []
    k, r = found
    return [*_segment(groups[:k], confidence, explained[:k], offset), (offset + k, r),
            *_segment(groups[k:], confidence, explained[k:], offset + k)]


def _configs(part: pd.DataFrame) -> set[str]:
    """The engine configs of a measurement, as `label [id]` (an engine_env change keeps the
    label and changes the id)."""
    ids = part["engine_config_id"] if "engine_config_id" in part else [None] * len(part)
    return {f"{label} [{cid}]" if cid else str(label)
            for label, cid in zip(part["engine_label"], ids, strict=True) if label}


def steps(root: Path, data: pd.DataFrame | None = None) -> list[Step]:
    """Steps beyond noise in each (load point, metric) series over the measurements: the
    data before and after a candidate point pooled (asv's habit of judging a step by the
    whole series, not by two neighbours), the most significant split taken, then each side
    searched again; a split is judged by the repeats where something recorded changed there,
    else by the measurements (the module's docstring). Family-wise: every split tried on the
    page shares 5 %."""
    data = series(root) if data is None else data
    order, changes = _changes(root, data)
    explained = [bool(c) for c in changes]
    grouped = [(load, metric, [part[part["measurement"] == s]["value"].tolist()
                               for s in order])
               for (load, metric), part in data.groupby(["load", "metric"], sort=False)]
    tries = sum(max(0, len(order) - 1) for _ in grouped)
    confidence = 1 - (1 - stats.CONFIDENCE) / max(1, tries)
    found = []
    for load, metric, groups in grouped:
        direction = diff.METRICS.get(metric, +1)
        for k, r in _segment(groups, confidence, explained):
            found.append(Step(metric, load, order[k], r.mean, r.low, r.high,
                              diff.verdict(r, direction),
                              "; ".join(changes[k]) or NOTHING_RECORDED))
    return found


def verdict_since(root: Path, prev: str, this: str, table: pd.DataFrame,
                  worse_than_pct: float = 0.0, data: pd.DataFrame | None = None,
                  found: list[Step] | None = None) -> dict[str, Any]:
    """A dated measurement's verdict against the one before it (started at prev and this):
    where something recorded changed, the repeats' (`table`: tunebook diff of the two
    windows); else the history's steps into it (the module's docstring). The keys of
    changes__*.json: recorded_changes, judged_by, alike_before (earlier measurements since
    the last recorded change: the spread between measurements rests on them), worse (what got
    worse beyond noise by more than worse_than_pct percent, as diff's rows) and exit_code
    (diff's codes)."""
    data = series(root) if data is None else data
    found = steps(root, data) if found is None else found
    changed = recorded(root, prev, this, data)
    order, changes = _changes(root, data)
    alike = 0  # measurements before this one since the last recorded change
    for k in range(order.index(this) if this in order else 0, 0, -1):
        if changes[k]:
            break
        alike += 1
    if not changed:  # the history's steps into it, as rows of diff's table
        table = pd.DataFrame([{"load": s.load, "metric": s.metric, "ratio": s.ratio,
                               "ratio_low": s.low, "ratio_high": s.high, "verdict": s.verdict}
                              for s in found if s.at == this],
                             columns=["load", "metric", "ratio", "ratio_low", "ratio_high",
                                      "verdict"])
    worse = diff.worst(table, worse_than_pct)[
        ["load", "metric", "ratio", "ratio_low", "ratio_high"]].to_dict("records")
    return {"recorded_changes": changed, "judged_by": "repeats" if changed else "measurements",
            "alike_before": alike, "worse": worse,
            "exit_code": diff.EXIT_WORSE if worse else diff.EXIT_SAME}


def verdict_words(v: dict[str, Any]) -> str:
    """The verdict in a line, for the terminal and the report."""
    worse = f"{len(v['worse'])} worse" if v["worse"] else "nothing worse"
    if v["judged_by"] == "repeats":
        return (f"what changed since then: {'; '.join(v['recorded_changes'])}; judged by the "
                f"repeats: {worse} beyond noise")
    said = ("nothing tunebook records changed since then, so the verdict is the history's "
            f"(each measurement one sample of the box's noise): {worse} beyond the noise "
            "between measurements")
    if v["alike_before"] < 2:  # no spread between measurements to judge by yet
        said += (f" — with {v['alike_before']} earlier measurement(s) since the last recorded "
                 "change, too few to tell a step from the box's drift (two give a first spread)")
    return said


def chart(data: pd.DataFrame, metric: str, found: list[Step]) -> alt.LayerChart | None:
    part = data[data["metric"] == metric]
    if part.empty:
        return None
    agg = (part.groupby(["measurement", "load"])["value"]
           .apply(lambda v: stats.Interval.of(v)).reset_index(name="iv"))
    agg["mean"] = [i.mean for i in agg["iv"]]
    agg["low"] = [i.low if i.known else i.mean for i in agg["iv"]]
    agg["high"] = [i.high if i.known else i.mean for i in agg["iv"]]
    agg["runs"] = [i.n for i in agg["iv"]]
    agg = agg.drop(columns="iv")
    x = alt.X("measurement:N", title="measurement (UTC start)", sort=None)
    colour = alt.Color("load:N", title="load point")
    y_title = axis_title(metric)
    layers = [alt.Chart(agg).mark_line(point=True).encode(
                  x=x, y=alt.Y("mean:Q", title=y_title, scale=alt.Scale(zero=False)),
                  color=colour, tooltip=["measurement", "load", alt.Tooltip("mean:Q",
                                                                           format=",.4~g"),
                                         "runs"]),
              alt.Chart(agg).mark_errorbar(ticks={"size": 10}).encode(
                  x=x, y=alt.Y("low:Q", title=y_title), y2="high:Q", color=colour)]
    marks = [s for s in found if s.metric == metric]
    if marks:
        steps_df = pd.DataFrame([{"measurement": s.at, "step": f"{s.ratio:.2f}× "
                                  f"({s.verdict.split()[0]})", "what": s.what_changed,
                                  "load": s.load} for s in marks])
        layers.append(alt.Chart(steps_df).mark_rule(strokeDash=[4, 3], color="#c2185b")
                      .encode(x=x, tooltip=["load", "step", "what"]))
        layers.append(alt.Chart(steps_df).mark_text(dy=-HEIGHT / 2 + 8, color="#c2185b",
                                                    fontSize=11)
                      .encode(x=x, text="step:N"))
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title=titled(
        f"{y_title} over the measurements",
        ["mean of each measurement's repeats, bars = 95% CI; dashed: a step beyond noise"]))


def page(root: Path, metrics: tuple[str, ...] = METRICS, data: pd.DataFrame | None = None,
         found: list[Step] | None = None) -> tuple[str, list[Step]]:
    """The history page (self-contained HTML) and the steps it marks (`data` and `found`:
    series(root, metrics) and its steps, when the caller has them)."""
    data = series(root, metrics) if data is None else data
    found = steps(root, data) if found is None else found
    ms = measurements.read(root)
    parts = [f"<h1>History of {html.escape(root.name)}</h1>",
             f"<p>{len(ms)} measurement(s); {len(found)} step(s) beyond noise "
             "(family-wise 95%).</p>"]
    if found:
        parts.append("<h2>Steps</h2><ul>" + "".join(
            f"<li><b>{html.escape(s.metric)}</b> at {html.escape(s.load)}, into "
            f"{html.escape(s.at)}: {s.ratio:.3f}× ({s.low:.3f}–{s.high:.3f}), "
            f"{html.escape(s.verdict)}; what changed: {html.escape(s.what_changed)}</li>"
            for s in found) + "</ul>")
    charts = [c for m in metrics if (c := chart(data, m, found)) is not None]
    header = "".join(parts)
    if not charts:
        return (f"<!doctype html><html><head><meta charset='utf-8'></head><body>{header}"
                "<p>No measurement with ok runs yet.</p></body></html>", found)
    body = offline_html(alt.vconcat(*charts))  # vega inlined once: works offline
    # the page's own <body> is the last one: the inlined scripts before it spell "<body>" too
    at = body.rindex("<body>") + len("<body>")
    return (body[:at] + "<div style='font-family:system-ui,sans-serif'>" + header + "</div>"
            + body[at:]), found
