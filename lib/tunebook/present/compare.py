"""Comparing experiments: two (or more) result folders overlaid in one chart per metric.

    tunebook compare outputs/cpu/ch01 outputs/h200/ch01 --out outputs/compare-cpu-h200.html

Labels default to the folder path relative to their common parent (e.g. ``cpu/ch01``), so
a CPU-vs-H200 or a before-vs-after overlay reads without a legend lookup.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.results.store import Store, replace_atomic

# The metrics a comparison shows, in order: throughput first, then what a user feels.
METRICS = ("output_tok_s", "median_tpot_ms", "median_ttft_ms", "p99_itl_ms")


def labels_for(roots: Sequence[Path]) -> list[str]:
    roots = [Path(r).resolve() for r in roots]
    if len(roots) == 1:
        return [roots[0].name]
    common = Path(os.path.commonpath(roots))
    names = [r.relative_to(common).as_posix() or r.name for r in roots]
    return names if len(set(names)) == len(names) else [str(r) for r in roots]


def frames(roots: Sequence[Path | str], labels: Sequence[str] | None = None,
           ) -> dict[str, pd.DataFrame]:
    """{label: results table} for each experiment folder; a folder with no runs is an error."""
    roots = [Path(r) for r in roots]
    labels = list(labels) if labels else labels_for(roots)
    if len(labels) != len(roots):
        raise ValueError(f"{len(roots)} experiments but {len(labels)} labels")
    out: dict[str, pd.DataFrame] = {}
    for label, root in zip(labels, roots, strict=True):
        df = Store(root).table()
        if df.empty:
            raise FileNotFoundError(f"no runs under {root}/runs: not an experiment folder?")
        out[label] = df
    return out


def overlay_charts(tables: dict[str, pd.DataFrame],
                   metrics: Sequence[str] = METRICS) -> list[alt.LayerChart]:
    """One overlay per metric that at least one experiment measured."""
    return [charts.overlay(tables, y=m) for m in metrics
            if any(m in df.columns and df[m].notna().any() for df in tables.values())]


def to_html(tables: dict[str, pd.DataFrame], metrics: Sequence[str] = METRICS) -> str:
    """An offline page: the overlays (vega inlined, no network) and what each experiment was."""
    cs = overlay_charts(tables, metrics)
    page = charts.offline_html(alt.vconcat(*cs)) if cs else "<html><body></body></html>"
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(_one(df, 'hardware'))}</td>"
        f"<td>{html.escape(_one(df, 'vllm_version'))}</td><td>{html.escape(_one(df, 'model'))}"
        f"</td><td>{len(df)}</td></tr>" for k, df in tables.items())
    about = ("<h2>Experiments</h2><table><tr><th>label</th><th>hardware</th><th>vLLM</th>"
             f"<th>model</th><th>runs</th></tr>{rows}</table>")
    return page.replace("</body>", about + "</body>", 1)


def _one(df: pd.DataFrame, col: str) -> str:
    vals = df[col].dropna().astype(str).unique() if col in df.columns else []
    return ", ".join(sorted(vals))


def write(roots: Sequence[Path | str], out: Path | str,
          labels: Sequence[str] | None = None) -> Path:
    return replace_atomic(Path(out), to_html(frames(roots, labels)).encode())
