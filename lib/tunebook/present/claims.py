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


_VERDICT_COLOUR = {HOLDS: "#54a24b", DIFFERS: "#e45756", NOISE: "#7b93b0", CANNOT: "#9e9e9e",
                   NOT_MEASURED: "#bdbdbd"}


def to_markdown(df: pd.DataFrame) -> str:
    cols = ["figure", "claim", "manual", "measured", "hardware", "verdict", "why",
            "experiment"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df[cols].itertuples(index=False):
        out.append("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")
                                     for v in r) + " |")
    return "\n".join(out) + "\n"


def to_html(df: pd.DataFrame, title: str = "Claims of the vLLM manual, checked",
            fragment: bool = False) -> str:
    cols = ["figure", "verdict", "claim", "manual", "measured", "hardware", "why", "experiment"]
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = []
    for r in df[cols].itertuples(index=False):
        cells = []
        for c, v in zip(cols, r, strict=True):
            s = html.escape(str(v))
            if c == "verdict":
                s = (f'<span style="background:{_VERDICT_COLOUR.get(v, "#ccc")};color:white;'
                     f'padding:1px 6px;border-radius:3px;white-space:nowrap">{s}</span>')
            cells.append(f"<td>{s}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    counts = df["verdict"].value_counts().to_dict() if len(df) else {}
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
    table = (f"<div class='tb-claims'><style>.tb-claims table{{border-collapse:collapse}}"
             ".tb-claims td,.tb-claims th{border:1px solid #ddd;padding:4px 8px;"
             "vertical-align:top;text-align:left}.tb-claims th{background:#f5f5f5}</style>"
             f"<h2>{html.escape(title)}</h2><p>{summary}. The manual's numbers "
             f"are reference data ({html.escape(manual.SOURCE)}); "
             "'measured' is what tunebook measured here.</p>"
             f"<table><tr>{head}</tr>{''.join(body)}</table></div>")
    if fragment:
        return table
    return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
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
