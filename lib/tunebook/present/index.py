"""`outputs/index.html`: every experiment under an outputs folder, with links and headline
numbers, rebuilt after each sweep (and by `tunebook index`). Self-contained: no scripts. Beside
it, from the same claims, `outputs/overview.html` (tunebook.present.overview): one row per
figure of the manual, one column per machine, linked from the top of the index.

Headline numbers per experiment (from its stored rows, latest attempt per run):
    best_output_tok_s   the highest total output tok/s of any ok run (users, engine config)
    tpot_at_1_user_ms   median TPOT at 1 user (the best case a user sees), lowest over configs
    runs_ok / runs_not_ok
and the verdict counts of its claims (tunebook.present.claims) when it targets figures.
"""

from __future__ import annotations

import html
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from tunebook.core import config
from tunebook.core.schema import SchemaVersionError
from tunebook.present import claims, overview
from tunebook.results.store import Store, find_experiments, ok_rows, replace_atomic, rows_to_frame

INDEX = "index.html"


def experiments(root: Path | str) -> list[Path]:
    """Experiment folders under ``root`` (store.find_experiments: the one discovery)."""
    return find_experiments(root)


def _first(df: pd.DataFrame, col: str) -> Any:
    vals = df[col].dropna() if col in df.columns else pd.Series(dtype=object)
    return vals.iloc[0] if len(vals) else None


def judge(exp: Path) -> pd.DataFrame:
    """The claims rows of one experiment (claims.evaluate); none when it cannot be judged (the
    claims are a bonus: such an experiment is still listed)."""
    try:
        return claims.evaluate([exp])
    except Exception:  # noqa: BLE001
        return pd.DataFrame(columns=list(claims.COLUMNS))


def summary(exp: Path, root: Path, judged: pd.DataFrame | None = None) -> dict[str, Any]:
    """One index row for an experiment folder (``judged``: its claims rows, when the caller
    has them already)."""
    unread = ""
    try:
        df = Store(exp).table()
    except SchemaVersionError:  # still listed, saying why its numbers are not shown
        df, unread = rows_to_frame([]), "not read: rows of a newer result schema; update tunebook"
    ok = ok_rows(df)
    row: dict[str, Any] = {
        "experiment": exp.relative_to(root).as_posix(),
        "model": ", ".join(sorted(df["model"].dropna().astype(str).unique())) if len(df) else "",
        "hardware": _first(df, "hardware"), "vllm_version": _first(df, "vllm_version"),
        "engine_configs": int(df["engine_config_id"].nunique()) if len(df) else 0,
        "runs_ok": int(len(ok)), "runs_not_ok": int(len(df) - len(ok)),
        "last_run": str(df["finished_at"].max()) if len(df) else "",
        "best_output_tok_s": None, "best_at": "", "tpot_at_1_user_ms": None,
        "report": None, "claims": "",
    }
    if len(ok) and ok["output_tok_s"].notna().any():
        best = ok.loc[ok["output_tok_s"].idxmax()]
        row["best_output_tok_s"] = float(best["output_tok_s"])
        speed = best.get("replay_speed")
        load = (f"{best['workload_file']} at {float(speed):g}×" if pd.notna(speed)
                else f"{int(best['max_concurrency'])} users"
                if pd.notna(best.get("max_concurrency")) else "unbounded users")
        row["best_at"] = f"{load}, {best['engine_label']}"
        one = ok[ok["max_concurrency"] == 1]["median_tpot_ms"].dropna()
        row["tpot_at_1_user_ms"] = float(one.min()) if len(one) else None
    report = exp / "report.html"
    if report.is_file():
        row["report"] = report.relative_to(root).as_posix()
    if unread:
        row["claims"] = unread
        return row
    table = judge(exp) if judged is None else judged
    if len(table):
        counts = table["verdict"].value_counts()
        row["claims"] = ", ".join(f"{n} {v}" for v, n in counts.items())
    return row


def table(root: Path | str) -> pd.DataFrame:
    """The index as a DataFrame (what index.html shows)."""
    root = Path(root)
    return pd.DataFrame([summary(e, root) for e in experiments(root)])


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:14px}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#777}
p.overview{font-size:16px;background:#eef4fb;border:1px solid #c6d9ee;border-radius:4px;
padding:10px 14px;max-width:60em}
"""


def _num(v: Any, fmt: str) -> str:
    return "—" if v is None or (isinstance(v, float) and pd.isna(v)) else format(v, fmt)


def to_html(rows: list[dict[str, Any]], root: Path, overview_page: str | None = None) -> str:
    """The index page; ``overview_page``: the overview's relative link, shown at the top."""
    head = ("experiment", "model", "hardware", "vLLM", "runs ok / not ok",
            "best output tok/s", "median TPOT at 1 user (ms)", "claims", "last run")
    body = []
    for r in rows:
        name = html.escape(r["experiment"])
        link = (f'<a href="{html.escape(r["report"])}">{name}</a>' if r["report"]
                else f'{name} <span class="muted">(no report yet)</span>')
        best = _num(r["best_output_tok_s"], ",.1f")
        if r["best_at"]:
            best += f' <span class="muted">({html.escape(r["best_at"])})</span>'
        cells = [link, html.escape(r["model"]), html.escape(str(r["hardware"] or "")),
                 html.escape(str(r["vllm_version"] or "")),
                 f'{r["runs_ok"]} / {r["runs_not_ok"]}', best,
                 _num(r["tpot_at_1_user_ms"], ",.2f"), html.escape(r["claims"]),
                 html.escape(r["last_run"][:19].replace("T", " "))]
        classes = ["", "", "", "", "num", "num", "num", "", ""]
        body.append("<tr>" + "".join(f'<td class="{c}">{v}</td>' if c else f"<td>{v}</td>"
                                     for c, v in zip(classes, cells, strict=True)) + "</tr>")
    claims_files = sorted(p.relative_to(root).as_posix() for p in root.glob("*/claims.html"))
    extra = "".join(f'<li><a href="{html.escape(c)}">{html.escape(c)}</a></li>'
                    for c in claims_files)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>tunebook experiments</title>"
        f"<style>{_STYLE}</style></head><body><h1>tunebook experiments</h1>"
        + (f"<p class='overview'><a href='{html.escape(overview_page)}'><b>Which of the "
           "manual's claims hold on our machines</b></a> — one row per figure of the manual, "
           "one column per machine, each verdict linked to the report that judged it.</p>"
           if overview_page else "")
        + f"<p class='muted'>{len(rows)} experiment(s) under {html.escape(root.name)}/ — "
        "rebuilt after every sweep (<code>tunebook index</code> rebuilds it by hand).</p>"
        f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{''.join(body)}</table>"
        + (f"<h2>Claims tables</h2><ul>{extra}</ul>" if extra else "")
        + "</body></html>"
    )


def index_root(outputs: Path | str) -> Path:
    """Where the index goes: the repository's outputs/ when ``outputs`` lies inside it (so
    outputs/cpu/ and outputs/h200/ appear in one index), else ``outputs`` itself."""
    outputs = Path(outputs).resolve()
    top = config.outputs_dir()
    return top if outputs == top or top in outputs.parents else outputs


def write(outputs: Path | str) -> Path:
    """index.html and overview.html under the index root, from one evaluation of the claims
    of each experiment; returns the index's path."""
    root = index_root(outputs)
    judged = {e: judge(e) for e in experiments(root)}
    rows = [summary(e, root, table) for e, table in judged.items()]
    overview.write(root, overview.gather(root, judged))
    return replace_atomic(root / INDEX, to_html(rows, root, overview.OVERVIEW).encode())


def rebuild(outputs: Store | Path | str) -> Path | None:
    """`write`, for after a sweep or a run: the index is a convenience, so a failure is
    reported on stderr and never costs the run its exit code or a result. Given a Store (as
    `SweepOptions(on_finish=index.rebuild)` does), the index of the folder holding it."""
    if isinstance(outputs, Store):
        outputs = outputs.root.parent
    try:
        return write(outputs)
    except Exception as e:  # noqa: BLE001
        print(f"tunebook: index.html not rebuilt: {type(e).__name__}: {e}", file=sys.stderr)
        return None


__all__ = ["experiments", "summary", "table", "to_html", "write", "rebuild", "index_root",
           "INDEX"]
