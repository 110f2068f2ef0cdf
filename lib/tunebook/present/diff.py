"""`tunebook diff OLD NEW`: what changed between two sets of runs, beyond noise.

A side is an experiment folder, narrowed if asked to one vLLM version (`--old-version 0.31.0`),
one engine config (`--old-config LABEL`) or a time window (`--old-since/--old-until`, UTC ISO
dates): two experiments, two vLLM versions or two dates of one experiment. Per load point and
metric: the ratio new ÷ old of the repeats' means with its Welch interval
(tunebook.results.stats.ratio, delta method: Welch–Satterthwaite degrees of freedom) and a
verdict: better or worse beyond noise (the interval excludes 1, the metric's good direction
says which), within noise (it includes 1), or not comparable (the load point only on one side,
another machine, fewer than MIN_REPEATS ok runs on a side). The intervals are family-wise: with
m comparisons in one diff each is taken at 1 − 0.05/m (Bonferroni), so a diff of two runs of
the same config says "beyond noise" somewhere with at most a 5 % chance, not 5 % per metric.
Then per manual figure the two sides target, each side's verdict (holds / differs / …) and
whether it changed.

Exit codes (a scheduled job acts on them): 0 nothing worse beyond noise by more than
`--worse-than` percent (default 0: any), 1 something is, 2 bad input or nothing comparable.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tunebook import figures
from tunebook.core import schema
from tunebook.results import measurements, stats
from tunebook.results.evidence import Evidence, load_evidence
from tunebook.results.store import ok_rows, rows_to_frame

# metric -> +1 when higher is better, -1 when lower is
METRICS: dict[str, int] = {
    "output_tok_s": +1, "request_throughput_req_s": +1, "request_goodput_req_s": +1,
    "median_ttft_ms": -1, "p99_ttft_ms": -1, "median_tpot_ms": -1, "p99_tpot_ms": -1,
    "p99_itl_ms": -1, "energy_per_output_tok_j": -1, "usd_per_m_output_tok": -1,
}
LOAD = ("dataset", "max_concurrency", "request_rate", "input_len", "output_len", "prefix_len",
        "replay_speed")
MIN_REPEATS = 2  # ok runs a side needs at a load point for an interval
BETTER, WORSE, NOISE, NOT_COMPARABLE = ("better beyond noise", "worse beyond noise",
                                        "within noise", "not comparable")
EXIT_SAME, EXIT_WORSE, EXIT_BAD = 0, 1, 2


class DiffError(ValueError):
    pass


@dataclass(frozen=True)
class Side:
    """One set of runs: an experiment folder, narrowed."""

    root: Path
    version: str | None = None  # vLLM version of the server (vllm_version_of)
    config: str | None = None  # an engine_label or engine_config_id
    since: str | None = None  # UTC ISO start, inclusive
    until: str | None = None  # UTC ISO start, exclusive

    @property
    def name(self) -> str:
        bits = [self.root.name]
        bits += [f"vLLM {self.version}"] if self.version else []
        bits += [self.config] if self.config else []
        bits += [f"from {self.since}"] if self.since else []
        bits += [f"until {self.until}"] if self.until else []
        return ", ".join(bits)

    def evidence(self) -> Evidence:
        """The side's runs: every stored attempt (a date window may hold an older attempt of a
        run measured again since), narrowed, then one attempt per run as tables take it (an
        ok one over later failures, else the latest)."""
        ev = load_evidence(self.root)
        if not ev.records:
            raise DiffError(f"{self.root}: no stored run")

        def keep(row: dict[str, Any]) -> bool:
            return ((not self.version or schema.vllm_version_of(row) == self.version)
                    and (not self.config or self.config in (row.get("engine_label"),
                                                            row.get("engine_config_id")))
                    and measurements.inside(row, self.since or None, self.until or None))

        records = [r for r in ev.records if keep(r.get("row") or {})]
        if not records:
            raise DiffError(f"{self.name}: no run matches")
        return Evidence(ev.root, rows_to_frame([r["row"] for r in records]), records,
                        ev.params, ev.machine)


def load_key(row: Mapping[str, Any]) -> tuple:
    """A row's load point (LOAD's columns): what diff and the history compare runs within."""
    return tuple(None if pd.isna(row.get(k)) else row.get(k) for k in LOAD)


def load_text(key: tuple) -> str:
    """A load point in words: '8 users at 2 req/s, random 64 in / 24 out'."""
    d = dict(zip(LOAD, key, strict=True))
    if d.get("replay_speed") is not None:
        return f"{d['dataset']} at {d['replay_speed']:g}×"
    rate = "" if d.get("request_rate") is None else f" at {d['request_rate']:g} req/s"
    return (f"{d['max_concurrency']} users{rate}, {d['dataset']} {d['input_len']} in / "
            f"{d['output_len']} out" + (f", prefix {d['prefix_len']}" if d.get("prefix_len")
                                         else ""))


def verdict(ratio: stats.Interval, direction: int) -> str:
    if not ratio.known:
        return NOT_COMPARABLE
    if ratio.low > 1:
        return BETTER if direction > 0 else WORSE
    if ratio.high < 1:
        return WORSE if direction > 0 else BETTER
    return NOISE


def compare(old: pd.DataFrame, new: pd.DataFrame,
            metrics: Mapping[str, int] = METRICS) -> pd.DataFrame:
    """One row per (load point, metric): old and new means with their intervals, new ÷ old
    with its Welch interval, and the verdict (with why, when not comparable)."""
    old, new = ok_rows(old), ok_rows(new)
    rows = []
    machines = {s: set(df["hardware"].dropna()) if "hardware" in df else set()
                for s, df in (("old", old), ("new", new))}
    other_machine = bool(machines["old"] and machines["new"]
                         and machines["old"] != machines["new"])
    keys = sorted({load_key(r) for _, r in pd.concat([old, new]).iterrows()},
                  key=lambda k: tuple((x is None, str(x) if not isinstance(x, int | float)
                                       else x) for x in k))
    pairs = []
    for key in keys:
        o = old[[load_key(r) == key for _, r in old.iterrows()]]
        n = new[[load_key(r) == key for _, r in new.iterrows()]]
        for metric, direction in metrics.items():
            a = [v for v in (n[metric] if metric in n else []) if pd.notna(v)]
            b = [v for v in (o[metric] if metric in o else []) if pd.notna(v)]
            if a or b:
                pairs.append((key, metric, direction, a, b))
    family = sum(min(len(a), len(b)) >= MIN_REPEATS for *_, a, b in pairs) or 1
    confidence = 1 - (1 - stats.CONFIDENCE) / family
    for key, metric, direction, new_values, old_values in pairs:
        a = stats.Interval.of(new_values, confidence)
        b = stats.Interval.of(old_values, confidence)
        why = None
        if other_machine:
            why = (f"other machine ({', '.join(sorted(machines['old']))} against "
                   f"{', '.join(sorted(machines['new']))})")
        elif a.n == 0 or b.n == 0:
            why = f"this load point only on the {'old' if a.n == 0 else 'new'} side"
        elif min(a.n, b.n) < MIN_REPEATS:
            why = f"too few repeats ({b.n} old, {a.n} new; {MIN_REPEATS} needed each)"
        r = stats.ratio(a, b, method="delta") if a.n and b.n \
            else stats.Interval(math.nan, confidence=confidence)
        v = NOT_COMPARABLE if why else verdict(r, direction)
        if v == NOT_COMPARABLE and why is None:
            why = "no interval (a side's runs do not vary, or a mean is 0)"
        rows.append({"load": load_text(key), "metric": metric,
                     "old": b.text(), "new": a.text(), "old_n": b.n, "new_n": a.n,
                     "ratio": r.mean, "ratio_low": r.low if r.known else math.nan,
                     "ratio_high": r.high if r.known else math.nan,
                     "verdict": v, "why": why or "", "confidence": confidence})
    return pd.DataFrame(rows, columns=["load", "metric", "old", "new", "old_n", "new_n",
                                       "ratio", "ratio_low", "ratio_high", "verdict", "why",
                                       "confidence"])


def figure_verdicts(old: Evidence, new: Evidence) -> pd.DataFrame:
    """Per manual figure either side targets: each side's verdict and whether it changed."""
    rows = []
    for fig in sorted(set(old.figures) | set(new.figures)):
        a = figures.verdict(old, fig).verdict if fig in old.figures else "not targeted"
        b = figures.verdict(new, fig).verdict if fig in new.figures else "not targeted"
        rows.append({"figure": fig, "old": a, "new": b, "changed": a != b})
    return pd.DataFrame(rows, columns=["figure", "old", "new", "changed"])


def worst(table: pd.DataFrame, worse_than_pct: float = 0.0) -> pd.DataFrame:
    """The rows worse beyond noise by more than `worse_than_pct` percent."""
    bad = table[table["verdict"] == WORSE]
    change = (bad["ratio"] - 1).abs() * 100
    return bad[change > worse_than_pct]


def summary(table: pd.DataFrame, figs: pd.DataFrame, worse_than_pct: float = 0.0
            ) -> dict[str, Any]:
    """What a scheduler acts on, as JSON: the exit code, the verdict counts, what got worse
    beyond `worse_than_pct` (with its interval) and the figures whose verdict changed."""
    worse = worst(table, worse_than_pct)
    return {"exit_code": exit_code(table, worse_than_pct),
            "counts": table["verdict"].value_counts().to_dict(),
            "worse": worse[["load", "metric", "ratio", "ratio_low", "ratio_high"]]
            .to_dict("records"),
            "figures_changed": figs[figs["changed"]].to_dict("records")}


def exit_code(table: pd.DataFrame, worse_than_pct: float = 0.0) -> int:
    if table.empty or (table["verdict"] == NOT_COMPARABLE).all():
        return EXIT_BAD
    return EXIT_WORSE if len(worst(table, worse_than_pct)) else EXIT_SAME


def text(table: pd.DataFrame, figs: pd.DataFrame, old: str, new: str) -> str:
    """The terminal table: per load point, each metric's ratio and verdict."""
    lines = [f"old: {old}", f"new: {new}", ""]
    counts = table["verdict"].value_counts()
    lines.append(", ".join(f"{counts.get(v, 0)} {v}" for v in (WORSE, BETTER, NOISE,
                                                              NOT_COMPARABLE)))
    for load, part in table.groupby("load", sort=False):
        lines.append(f"\n{load}")
        for _, r in part.iterrows():
            ratio = ("" if pd.isna(r["ratio"]) else f"{r['ratio']:.3f}×" + (
                "" if pd.isna(r["ratio_low"]) else
                f" ({r['ratio_low']:.3f}–{r['ratio_high']:.3f})"))
            lines.append(f"  {r['metric']:<24} {ratio:<26} {r['verdict']}"
                         + (f": {r['why']}" if r["why"] else ""))
    changed = figs[figs["changed"]]
    if len(figs):
        lines.append(f"\nfigures: {len(changed)} of {len(figs)} verdicts changed"
                     + "".join(f"\n  Fig {r.figure}: {r.old} -> {r.new}"
                               for r in changed.itertuples()))
    return "\n".join(lines)


_COLOURS = {WORSE: "#c2185b", BETTER: "#2e7d32", NOISE: "#555", NOT_COMPARABLE: "#999"}


def to_html(table: pd.DataFrame, figs: pd.DataFrame, old: str, new: str) -> str:
    """A self-contained page in the report style: the verdict counts, then the table."""
    def cell(v: Any) -> str:
        return html.escape("" if v is None or (isinstance(v, float) and math.isnan(v))
                           else f"{v:.3f}" if isinstance(v, float) else str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in ("load point", "metric", "old", "new",
                                                          "new ÷ old (95% CI)", "verdict"))
    body = []
    for _, r in table.iterrows():
        ratio = "" if pd.isna(r["ratio"]) else f"{r['ratio']:.3f}×" + (
            "" if pd.isna(r["ratio_low"]) else f" ({r['ratio_low']:.3f}–{r['ratio_high']:.3f})")
        colour = _COLOURS.get(r["verdict"], "#555")
        verdict_text = r["verdict"] + (f": {r['why']}" if r["why"] else "")
        body.append(f"<tr><td>{cell(r['load'])}</td><td>{cell(r['metric'])}</td>"
                    f"<td>{cell(r['old'])}</td><td>{cell(r['new'])}</td><td>{cell(ratio)}</td>"
                    f"<td style='color:{colour}'>{cell(verdict_text)}</td></tr>")
    fig_rows = "".join(f"<tr><td>Fig {cell(r.figure)}</td><td>{cell(r.old)}</td>"
                       f"<td>{cell(r.new)}</td><td>{'changed' if r.changed else ''}</td></tr>"
                       for r in figs.itertuples())
    counts = table["verdict"].value_counts()
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in (WORSE, BETTER, NOISE,
                                                           NOT_COMPARABLE))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>tunebook diff</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
            "table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:4px 8px;"
            "text-align:left;vertical-align:top}</style></head><body>"
            f"<h1>What changed</h1><p>old: {cell(old)}<br>new: {cell(new)}</p>"
            f"<p>{cell(summary)}</p><table><tr>{head}</tr>{''.join(body)}</table>"
            + (f"<h2>The manual's figures</h2><table><tr><th>figure</th><th>old</th>"
               f"<th>new</th><th></th></tr>{fig_rows}</table>" if fig_rows else "")
            + "</body></html>")


def run(old: Side, new: Side, metrics: Sequence[str] | None = None
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
    a, b = old.evidence(), new.evidence()
    wanted = {m: METRICS[m] for m in metrics} if metrics else METRICS
    return compare(a.df, b.df, wanted), figure_verdicts(a, b)
