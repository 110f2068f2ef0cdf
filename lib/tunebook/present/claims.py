"""The claims table: for each figure an experiment targets, the manual's claim, what was measured
here, where, and a verdict (holds / differs / within noise / cannot run here / not measured)
with its reason.

    claims.evaluate(["outputs/h200/ch01", "outputs/h200/ch02"])   # -> DataFrame, one row a claim
    claims.write(df, "outputs/h200")                              # claims.csv / .md / .html

The rules live with their figures (``tunebook.figures``: one unit per figure, its docstring
states the rule); this module only runs them over experiments and writes the table.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from tunebook import figures
from tunebook.core import manual
from tunebook.results.evidence import (  # noqa: F401  (re-exported: the claims vocabulary)
    CANNOT,
    COLUMNS,
    DIFFERS,
    HOLDS,
    NOISE,
    NOT_MEASURED,
    RATIO_TOLERANCE,
    VERDICTS,
    Claim,
    Evidence,
    load_evidence,
)
from tunebook.results.store import find_experiments, replace_atomic


def evaluate(roots: Iterable[str | Path], only: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per (experiment, figure it targets). A figure without a rule yet is listed as
    'not measured' so nothing an experiment promised goes missing silently."""
    rows = []
    wanted = set(only) if only is not None else None
    for root in roots:
        ev = load_evidence(root)
        for fig in ev.figures:
            if wanted is not None and fig not in wanted:
                continue
            rows.append(asdict(figures.verdict(ev, fig)))
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    return df.sort_values(["figure", "experiment"], key=lambda s: s.map(manual.fig_key)
                          if s.name == "figure" else s).reset_index(drop=True)


def experiments_under(root: str | Path) -> list[Path]:
    """Experiment folders (those with a runs/ folder) directly under ``root``."""
    return find_experiments(root, max_depth=1)


# Each verdict's badge: its colour, and a symbol and a fill that still tell it apart printed in
# greyscale (holds solid dark, differs light with a heavy border, within noise light blue,
# cannot run here dashed, not measured dotted); the word itself is always written out.
_VERDICT_COLOUR = {HOLDS: "#1b7837", DIFFERS: "#b2182b", NOISE: "#2166ac", CANNOT: "#616161",
                   NOT_MEASURED: "#9e9e9e"}
_VERDICT_SYMBOL = {HOLDS: "✓", DIFFERS: "✗", NOISE: "~", CANNOT: "⊘", NOT_MEASURED: "…"}
_VERDICT_CLASS = {HOLDS: "holds", DIFFERS: "differs", NOISE: "noise", CANNOT: "cannot",
                  NOT_MEASURED: "unmeasured"}
BADGE_CSS = (
    ".tb-v{display:inline-block;padding:1px 7px;border-radius:3px;white-space:nowrap;"
    "font-weight:600;border:2px solid}"
    f".tb-v.holds{{background:{_VERDICT_COLOUR[HOLDS]};border-color:{_VERDICT_COLOUR[HOLDS]};"
    "color:#fff}"
    f".tb-v.differs{{background:#fddbc7;border-color:{_VERDICT_COLOUR[DIFFERS]};"
    f"color:{_VERDICT_COLOUR[DIFFERS]}}}"
    f".tb-v.noise{{background:#d1e5f0;border-color:{_VERDICT_COLOUR[NOISE]};"
    f"color:{_VERDICT_COLOUR[NOISE]}}}"
    f".tb-v.cannot{{background:#fff;border:2px dashed {_VERDICT_COLOUR[CANNOT]};"
    f"color:{_VERDICT_COLOUR[CANNOT]}}}"
    f".tb-v.unmeasured{{background:#fff;border:2px dotted {_VERDICT_COLOUR[NOT_MEASURED]};"
    "color:#666;font-weight:400;font-style:italic}"
    "details>summary{cursor:pointer;color:#555}"
    "details[open]>summary{margin-bottom:4px}"
)


def badge(verdict: str) -> str:
    """The verdict as a badge: its symbol and its word, coloured (see BADGE_CSS)."""
    cls = _VERDICT_CLASS.get(verdict, "unmeasured")
    return (f'<span class="tb-v {cls}">{_VERDICT_SYMBOL.get(verdict, "")} '
            f"{html.escape(verdict)}</span>")


def _unit(fig: str) -> figures.FigureUnit | None:
    return figures.REGISTRY.get(str(fig))


def headline(c: Claim) -> str:
    """What was measured, in a few words (FigureUnit.headline)."""
    unit = _unit(c.figure)
    return unit.headline(c) if unit else figures.short_text(c.measured)


def manual_numbers(fig: str) -> str:
    """The manual's numbers of a figure in a few words; "" when it states none."""
    unit = _unit(fig)
    return unit.manual_numbers() if unit else ""


def details(c: Claim, summary: str = "the manual, the measurement and why",
            extra: str = "") -> str:
    """The whole reasoning of a verdict, one click away: a ``<details>`` block with the
    manual's numbers, what was measured and why, in full (``extra``: more HTML after)."""
    e = html.escape
    rows = "".join(f"<dt>{k}</dt><dd>{e(str(v))}</dd>" for k, v in (
        ("manual (reference)", c.manual), ("measured here", c.measured), ("why", c.why))
        if str(v).strip())
    return (f"<details><summary>{e(summary)}</summary><dl>{rows}</dl>{extra}</details>")


def claim_of(row: dict) -> Claim:
    """A Claim from a row of a claims table (csv/json: values may be NaN)."""
    return Claim(**{k: ("" if k not in ("measured_value", "manual_value")
                        and not isinstance(row.get(k), str) else row.get(k))
                    for k in COLUMNS})


def to_markdown(df: pd.DataFrame) -> str:
    cols = ["figure", "claim", "manual", "measured", "hardware", "verdict", "why",
            "experiment"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df[cols].itertuples(index=False):
        out.append("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")
                                     for v in r) + " |")
    return "\n".join(out) + "\n"


_TABLE_CSS = (
    ".tb-claims table{border-collapse:collapse;width:100%;max-width:1400px}"
    ".tb-claims td,.tb-claims th{border:1px solid #ddd;padding:6px 8px;vertical-align:top;"
    "text-align:left}.tb-claims th{background:#f5f5f5}"
    ".tb-claims td.fig{white-space:nowrap;font-weight:600}"
    ".tb-claims td.claim{width:34%;min-width:16em}"
    ".tb-claims td.verdict{min-width:20em}"
    ".tb-claims .lead{margin:4px 0}.tb-claims .manual{color:#555;font-size:92%}"
    ".tb-claims dl{margin:4px 0}.tb-claims dt{font-weight:600;color:#444}"
    ".tb-claims dd{margin:0 0 6px 1em}"
)


def to_html(df: pd.DataFrame, title: str = "Claims of the vLLM manual, checked",
            fragment: bool = False) -> str:
    """A table a person reads: per claim the figure, the manual's words, and the verdict led
    by a line of at most ~30 words (where it was measured, what, the manual's numbers); the
    full measured text and the reason one click away."""
    e = html.escape
    body = []
    for row in df.to_dict("records"):
        c = claim_of(row)
        nums = manual_numbers(c.figure)
        verdict = (f"{badge(c.verdict)} on {e(c.hardware or 'this machine')}"
                   f"<div class='lead'>{e(headline(c))}</div>"
                   + (f"<div class='manual'>manual: {e(nums)}</div>" if nums else "")
                   + details(c))
        body.append(f"<tr><td class='fig'>Fig {e(c.figure)}</td><td class='claim'>"
                    f"{e(c.claim)}</td><td class='verdict'>{verdict}</td>"
                    f"<td>{e(c.experiment)}</td></tr>")
    counts = df["verdict"].value_counts().to_dict() if len(df) else {}
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
    head = "".join(f"<th>{h}</th>" for h in ("figure", "the manual's claim", "verdict here",
                                             "experiment"))
    table = (f"<div class='tb-claims'><style>{_TABLE_CSS}{BADGE_CSS}</style>"
             f"<h2>{e(title)}</h2><p>{summary}. The manual's numbers "
             f"are reference data ({e(manual.SOURCE)}); "
             "'measured' is what tunebook measured here. Each verdict's full reasoning is "
             "one click away.</p>"
             f"<table><tr>{head}</tr>{''.join(body)}</table></div>")
    if fragment:
        return table
    return (f"<!doctype html><meta charset='utf-8'><title>{e(title)}</title>"
            f"<body style='font:14px system-ui,sans-serif;margin:2em'>{table}</body>")


def write(df: pd.DataFrame, out_dir: str | Path, stem: str = "claims") -> list[Path]:
    """claims.csv, claims.md, claims.html and claims.json under ``out_dir`` (replaced: the
    table is derived from the run files, which are never touched)."""
    out = Path(out_dir)
    paths = []
    for ext, data in (("csv", df.to_csv(index=False)), ("md", to_markdown(df)),
                      ("html", to_html(df)),
                      ("json", json.dumps(df.to_dict("records"), indent=1, default=str))):
        paths.append(replace_atomic(out / f"{stem}.{ext}", data.encode()))
    return paths
