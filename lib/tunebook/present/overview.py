"""`outputs/overview.html`: which of the manual's claims hold on our machines, in one page.

One row per figure of the manual's index (all of them, in its order, measured or not), one
column per machine (each folder under outputs/ that holds experiments: cpu, h200, …). A cell
is the verdict as a badge, what was measured in a few words, and a link to the figure in the
report of the experiment that judged it; the full reasoning is one click away. Written with
the index (`tunebook index`, and after every sweep) from the claims rows the index evaluates;
self-contained, no scripts, every link relative.

Where several experiments of one machine judge a figure (Fig 6.2 on the CPU: ch06 and
ch06-disagg), the cell shows the most decisive verdict (holds or differs, then within noise,
then cannot run here, then not measured; at a tie the figure's own chapter, ch06 for Fig 6.x,
then the first by name) and names the others in its details.

    overview.write(root, overview.gather(root, {exp: claims.evaluate([exp]) for exp in ...}))
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tunebook import figures
from tunebook.core import manual
from tunebook.present import claims, report
from tunebook.results.evidence import CANNOT, DIFFERS, HOLDS, NOISE, NOT_MEASURED, VERDICTS
from tunebook.results.machines import label_of
from tunebook.results.machines import name as this_machine
from tunebook.results.store import find_experiments, replace_atomic

OVERVIEW = "overview.html"
# Lower is more decisive: what a cell shows when several experiments judged its figure.
RANK = {HOLDS: 0, DIFFERS: 0, NOISE: 1, CANNOT: 2, NOT_MEASURED: 3}


def machine_of(path: str) -> str:
    """The machine of an experiment path relative to the outputs root: its first folder
    (``cpu/ch01`` -> ``cpu``); this box's name (tunebook.results.machines) for an experiment
    right under the root (an older tunebook's, or one run with ``--outputs``)."""
    parts = path.split("/")
    return parts[0] if len(parts) > 1 else this_machine()


def machines(root: Path | str) -> list[str]:
    """The machines under ``root``: each first-level folder that holds an experiment."""
    root = Path(root)
    return sorted({machine_of(e.relative_to(root).as_posix()) for e in find_experiments(root)})


def gather(root: Path | str, judged: Mapping[Path, pd.DataFrame | None]) -> pd.DataFrame:
    """The claims rows of each experiment (``claims.evaluate``) in one frame, each row with
    ``path``, its experiment's folder relative to ``root``."""
    root = Path(root)
    frames = [df.assign(path=Path(exp).relative_to(root).as_posix())
              for exp, df in judged.items() if df is not None and len(df)]
    cols = [*claims.COLUMNS, "path"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def claims_files(root: Path | str) -> pd.DataFrame:
    """The same rows from the claims tables that `tunebook claims` wrote
    (``<machine>/claims.json``), without evaluating anything again."""
    root = Path(root)
    rows = [{**r, "path": f"{f.parent.name}/{r['experiment']}"}
            for f in sorted(root.glob("*/claims.json"))
            for r in json.loads(f.read_text(encoding="utf-8"))]
    return pd.DataFrame(rows, columns=[*claims.COLUMNS, "path"])


@dataclass
class Judged:
    """One claims row where the overview shows it."""

    claim: claims.Claim
    path: str  # the experiment, relative to the outputs root
    href: str | None  # the figure in that experiment's report (relative), None: no report


@dataclass
class Cell:
    machine: str
    figure: str
    shown: Judged | None = None  # None: no experiment of this machine targets the figure
    others: list[Judged] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return self.shown.claim.verdict if self.shown else NOT_MEASURED


class _Links:
    """Relative links to a figure in an experiment's report, each report read once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pages: dict[str, str | None] = {}

    def href(self, path: str, fig: str) -> str | None:
        if path not in self.pages:
            page = self.root / path / report.REPORT
            self.pages[path] = (page.read_text(encoding="utf-8", errors="replace")
                                if page.is_file() else None)
        text = self.pages[path]
        if text is None:
            return None
        fragment = report.figure_fragment(text, fig)
        return f"{path}/{report.REPORT}" + (f"#{fragment}" if fragment else "")


def _chapter_first(fig: str, path: str) -> int:
    """0 when the experiment is the figure's own chapter's (ch06 or ch06-… for Fig 6.x)."""
    name = path.rsplit("/", 1)[-1]
    own = f"ch{manual.figure(fig).chapter:02d}" if fig in manual.FIGURES else None
    return 0 if own and (name == own or name.startswith(own + "-")) else 1


def cells(df: pd.DataFrame, root: Path | str,
          machine_names: list[str] | None = None) -> dict[tuple[str, str], Cell]:
    """{(figure, machine): Cell} for every figure of the manual's index and every machine
    (those under ``root`` when not given)."""
    root = Path(root)
    names = machine_names if machine_names is not None else machines(root)
    links = _Links(root)
    out = {(fig, m): Cell(m, fig) for fig in manual.FIGURES for m in names}
    found: dict[tuple[str, str], list[Judged]] = {}
    for row in df.to_dict("records"):
        c, path = claims.claim_of(row), str(row["path"])
        key = (str(c.figure), machine_of(path))
        if key in out:
            found.setdefault(key, []).append(Judged(c, path, links.href(path, c.figure)))
    for key, judged in found.items():
        judged.sort(key=lambda j: (RANK.get(j.claim.verdict, 3),
                                   _chapter_first(j.claim.figure, j.path), j.path))
        out[key].shown, out[key].others = judged[0], judged[1:]
    return out


def counts(grid: Mapping[tuple[str, str], Cell], machine: str) -> Counter[str]:
    """Figures per verdict on one machine (each figure once: the verdict its cell shows)."""
    return Counter(c.verdict for (_, m), c in grid.items() if m == machine)


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1500px}
h1{font-size:22px;margin-bottom:.2em} .muted{color:#666} a{color:#1f5fa8}
table{border-collapse:collapse}
th,td{border:1px solid #ddd;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}
table.grid{width:100%} table.grid thead th{position:sticky;top:0;z-index:1}
td.fig{width:38%} .fig b{white-space:nowrap} .claim{margin:2px 0}
.manual,.hw{color:#555;font-size:92%}
.short{margin:4px 0} td.none{background:#fafafa}
table.counts td{text-align:right;font-variant-numeric:tabular-nums}
table.counts td:first-child{text-align:left;font-weight:600}
dl{margin:4px 0} dt{font-weight:600;color:#444} dd{margin:0 0 6px 1em}
.rule{white-space:pre-line;font-size:92%;color:#333}
.legend span.tb-v{margin-right:.3em}
@media print{body{margin:0;font-size:11px} table.grid thead th{position:static}}
@page{size:A4 landscape;margin:12mm}
"""

_MEANING = {
    HOLDS: "measured here, and it says what the manual says",
    DIFFERS: "measured here, and it does not",
    NOISE: "the difference is smaller than the repeats' noise",
    CANNOT: "this machine lacks what the figure needs (a GPU, FP8 kernels, …)",
    NOT_MEASURED: "no experiment of this machine judged it yet",
}


def _judged_html(j: Judged, what: str) -> str:
    e = html.escape
    where = (f'<a href="{e(j.href)}">{e(j.path)}</a>' if j.href
             else f"{e(j.path)} <span class='muted'>(no report yet)</span>")
    return f"<p>{what} {where}</p>"


def _cell_html(cell: Cell) -> str:
    e = html.escape
    attrs = (f' data-machine="{e(cell.machine)}" data-figure="{e(cell.figure)}" '
             f'data-verdict="{e(cell.verdict)}"')
    j = cell.shown
    if j is None:
        return (f"<td class='none'{attrs}>{claims.badge(NOT_MEASURED)}"
                "<div class='short muted'>no experiment here targets it</div></td>")
    c = j.claim
    link = (f'<a href="{e(j.href)}">Fig {e(c.figure)} in {e(j.path)} ›</a>' if j.href
            else f"{e(j.path)} <span class='muted'>(no report yet)</span>")
    others = "".join(
        _judged_html(o, f"Also judged, {claims.badge(o.claim.verdict)} "
                        f"({e(claims.headline(o.claim))}), in") for o in cell.others)
    more = (f" · {len(cell.others)} more experiment{'s' if len(cell.others) > 1 else ''}"
            + ("" if all(o.claim.verdict == c.verdict for o in cell.others)
               else " (another verdict)")) if cell.others else ""
    extra = f"<p class='hw'>on {e(c.hardware)}</p>" if c.hardware else ""
    return (f"<td{attrs}>{claims.badge(c.verdict)}<div class='short'>"
            f"{e(claims.headline(c))}</div><div>{link}</div>"
            + claims.details(c, summary=f"why{more}", extra=extra + others) + "</td>")


def _figure_html(fig: str) -> str:
    e = html.escape
    seed = manual.figure(fig)
    unit = figures.REGISTRY.get(fig)
    title = f" — {e(unit.title)}" if unit and unit.title else ""
    nums = claims.manual_numbers(fig)
    rule = unit.rule_text() if unit else ""
    return (f"<td class='fig'><b>Fig {e(fig)}{title}</b><div class='claim'>{e(seed.claim)}</div>"
            + (f"<div class='manual'>manual: {e(nums)}</div>" if nums else "")
            + (f"<details><summary>the rule</summary><div class='rule'>{e(rule)}</div>"
               "</details>" if rule else "") + "</td>")


def vllm_versions(experiments: list[Path]) -> list[str]:
    """The vLLM releases that served these experiments (their rows' vllm_version, read alone
    from each results table): a column of the page names the releases it judged, so a
    folder of runs on another release (e.g. cpu-xeon-vllm0.31.0, made with
    `-p engine.vllm '"0.31.0"'`) reads as that release beside the machine's own."""
    import pyarrow.parquet as pq

    seen: set[str] = set()
    for exp in experiments:
        table = exp / "results.parquet"
        try:
            if table.is_file() and "vllm_version" in pq.read_schema(table).names:
                seen |= {v for v in pq.read_table(table, columns=["vllm_version"])
                         .column(0).to_pylist() if v}
        except (OSError, ValueError):
            continue
    return sorted(seen, key=lambda v: tuple(int(x) if x.isdigit() else 0
                                            for x in v.split(".")[:3]))


def to_html(df: pd.DataFrame, root: Path | str, machine_names: list[str] | None = None) -> str:
    """The page, for the claims rows ``df`` (``gather`` or ``claims_files``) of the
    experiments under ``root``."""
    e = html.escape
    root = Path(root)
    names = machine_names if machine_names is not None else machines(root)
    grid = cells(df, root, names)
    shown = [v for v in VERDICTS if v != NOISE
             or any(counts(grid, m)[NOISE] for m in names)]
    hardware = {m: sorted({c.shown.claim.hardware for (_, mm), c in grid.items()
                           if mm == m and c.shown and c.shown.claim.hardware})
                or [hw for hw in [label_of(root / m)] if hw] for m in names}
    count_rows = "".join(
        f"<tr><td>{e(m)}</td>"
        + "".join(f"<td data-machine='{e(m)}' data-verdict='{e(v)}'>{counts(grid, m)[v]}</td>"
                  for v in shown) + "</tr>" for m in names)
    counts_table = ("<table class='counts'><tr><th>machine</th>"
                    + "".join(f"<th>{claims.badge(v)}</th>" for v in shown)
                    + f"</tr>{count_rows}</table>")
    legend = "".join(f"<li>{claims.badge(v)} {e(_MEANING[v])}</li>" for v in shown)
    # the releases of the experiments whose verdicts a column shows
    releases = {m: vllm_versions(sorted({root / c.shown.path for (_, mm), c in grid.items()
                                         if mm == m and c.shown})) for m in names}
    head = "<tr><th>figure: the manual's claim</th>" + "".join(
        f"<th>{e(m)}<div class='hw'>{e('; '.join(hardware[m]))}</div>"
        + (f"<div class='hw'>vLLM {e(', '.join(releases[m]))}</div>" if releases[m] else "")
        + (f"<div class='hw'><a href='{e(m)}/claims.html'>its claims table ›</a></div>"
           if m and (root / m / "claims.html").is_file() else "") + "</th>"
        for m in names) + "</tr>"
    body = "".join(
        f"<tr id='{e(report.figure_id(fig))}'>{_figure_html(fig)}"
        + "".join(_cell_html(grid[(fig, m)]) for m in names) + "</tr>"
        for fig in manual.FIGURES)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<title>Which of the vLLM manual's claims hold here</title>"
        f"<style>{_STYLE}{claims.BADGE_CSS}</style></head><body>"
        "<h1>Which of the vLLM manual's claims hold on our machines</h1>"
        f"<p class='muted'>One row per figure of the manual's index ({len(manual.FIGURES)}, "
        f"{e(manual.EDITION.label)}, vLLM {e(manual.EDITION.vllm_version)}), one column per "
        "machine. Each verdict links to the figure in the report of the experiment that "
        "judged it; why is one click away. The manual's numbers are reference data, not "
        "measured here. Rebuilt with <a href='index.html'>the index of experiments</a> "
        "(<code>tunebook index</code>, and after every sweep).</p>"
        f"<h2>Figures per verdict, of {len(manual.FIGURES)}</h2>{counts_table}"
        f"<ul class='legend muted'>{legend}</ul>"
        f"<table class='grid'><thead>{head}</thead><tbody>{body}</tbody></table>"
        "</body></html>")


def write(root: Path | str, df: pd.DataFrame) -> Path:
    """``root``/overview.html for the claims rows ``df`` (replaced: derived, never edited)."""
    root = Path(root)
    return replace_atomic(root / OVERVIEW, to_html(df, root).encode())


__all__ = ["OVERVIEW", "RANK", "Cell", "Judged", "cells", "claims_files", "counts", "gather",
           "machine_of", "machines", "to_html", "write"]
