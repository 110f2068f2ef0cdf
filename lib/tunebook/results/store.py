"""Results on disk: one immutable JSON file per run attempt, a Parquet table derived from them.

Layout of `outputs/<experiment>/`::

    runs/<run_id>__<utc stamp>.json   one attempt of one run; written once, never overwritten
    runs/<run_id>__<utc stamp>.requests.parquet   its per-request arrays, when stored compact
                                     (tunebook.results.compact; written before the JSON)
    engines/<engine_config_id>__<utc stamp>.log   the whole engine log of each start (or
                                     .log.gz: tunebook.core.files reads either)
    results.parquet                  rebuilt from runs/ (derived: safe to delete)
    params.yaml, plan.json           what was asked for
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from tunebook.core import schema
from tunebook.core.files import replace_atomic as replace_atomic  # re-exported: long imported
from tunebook.core.files import shared_mode as shared_mode  # from here
from tunebook.core.files import write_new as write_new
from tunebook.results import compact

RUNS = "runs"
ENGINES = "engines"
TABLE = "results.parquet"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stamp() -> str:
    """A filename-safe UTC timestamp that sorts in time order."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


class Store:
    """One experiment's folder."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    @property
    def runs_dir(self) -> Path:
        return self.root / RUNS

    def engine_log_path(self, engine_config_id: str) -> Path:
        return self.root / ENGINES / f"{engine_config_id}__{stamp()}.log"

    def check_writable(self) -> None:
        """Fail before any engine starts if results could not be saved."""
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        probe = self.runs_dir / f".probe-{os.getpid()}"
        try:
            probe.write_bytes(b"x" * 65536)  # a full disk fails here, not after an hour
            os.fsync(os.open(probe, os.O_RDONLY))
        except OSError as e:
            raise OSError(f"cannot write results to {self.runs_dir}: {e.strerror or e}") from e
        finally:
            probe.unlink(missing_ok=True)

    def save_run(self, record: dict[str, Any]) -> Path:
        """Save one run attempt. `record` = {'row': {...}, 'requests': {...}, ...}. Its
        per-request arrays go to a Parquet file beside the JSON where that is lossless and
        smaller (tunebook.results.compact), written first: the JSON names it."""
        row = record["row"]
        assert row.get("run_id"), "a run record needs row.run_id"
        row.setdefault("schema_version", schema.SCHEMA_VERSION)
        name = f"{row['run_id']}__{stamp()}.json"
        enc = compact.encode(record, name)
        if enc.requests is not None and enc.requests_name is not None:
            write_new(self.runs_dir / enc.requests_name, enc.requests)
        return write_new(self.runs_dir / name, enc.text)

    def records(self, requests: bool = True) -> Iterable[dict[str, Any]]:
        """Every attempt on disk, oldest first, its row read as this code's schema version
        (older rows migrated; a newer one raises schema.SchemaVersionError), its per-request
        arrays under "requests" whether the JSON or a Parquet file holds them (one that cannot
        be read: "requests_error" says why). `requests=False`: without the arrays, no Parquet
        file read (rows, engines, logs: what tables and most figures need). Unreadable files
        are skipped, not fatal."""
        if not self.runs_dir.is_dir():
            return
        for p in sorted(self.runs_dir.glob("*.json")):
            record = compact.read_record(p, requests)
            if record is not None:
                yield record

    def rows(self) -> list[dict[str, Any]]:
        return [r["row"] for r in self.records(requests=False)
                if isinstance(r, dict) and "row" in r]

    def latest_rows(self, run_ids: Iterable[str]) -> list[dict[str, Any]]:
        """The row `table()` keeps for each of these runs (latest_attempts), read from those
        runs' files only: a search asks after each point."""
        out = []
        for rid in run_ids:
            rows = []
            for p in sorted(self.runs_dir.glob(f"{glob.escape(rid)}__*.json")):
                record = compact.read_record(p, requests=False)
                if isinstance(record, dict) and isinstance(record.get("row"), dict):
                    rows.append(record["row"])
            out += latest_attempts(rows)
        return out

    def record_of(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The whole record (per-request arrays included) of the attempt a table row came
        from: the run's file whose row finished when this one did."""
        for p in sorted(self.runs_dir.glob(f"{glob.escape(str(row.get('run_id')))}__*.json")):
            try:
                record = json.loads(p.read_bytes())
            except (OSError, ValueError):
                continue
            if not (isinstance(record, dict) and isinstance(record.get("row"), dict)):
                continue
            upgraded = schema.upgrade(record["row"], source=str(p))  # once: finish's work
            if upgraded.get("finished_at") == row.get("finished_at"):
                return compact.join({**record, "row": upgraded}, p.parent)
        return None

    def finished_run_ids(self) -> set[str]:
        """Runs with an `ok` attempt, whatever vLLM made it (resume asks
        tunebook.inputs.plan.Resume, which also weighs the vLLM version)."""
        return {r["run_id"] for r in self.rows() if r.get("status") == schema.STATUS_OK}

    def table(self, latest_only: bool = True) -> pd.DataFrame:
        """All rows as a typed DataFrame (schema columns first, then engine knobs)."""
        return rows_to_frame(self.rows(), latest_only=latest_only)

    def rebuild_table(self) -> Path:
        df = self.table(latest_only=False)
        path = self.root / TABLE
        return replace_atomic(path, df.to_parquet(index=False))


def latest_attempts(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run id, the one `table()` keeps: its latest ok attempt, else its latest
    attempt (in the order the run ids first appear)."""
    best: dict[Any, dict[str, Any]] = {}
    key = lambda r: (r.get("status") == schema.STATUS_OK,  # noqa: E731
                     str(r.get("finished_at") or ""))
    for r in rows:
        rid = r.get("run_id")
        if rid not in best or key(r) >= key(best[rid]):
            best[rid] = r
    return list(best.values())


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows whose run finished ``ok``: the one filter every table, chart and rule uses."""
    if df.empty or "status" not in df.columns:
        return df.iloc[0:0]
    return df[df["status"].astype("string").eq(schema.STATUS_OK).fillna(False).astype(bool)]


def not_ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty or "status" not in df.columns:
        return df.iloc[0:0]
    return df.drop(ok_rows(df).index)


MAX_DEPTH = 3  # outputs/<machine>/<experiment>: deep enough, and cheap on a big outputs/


def find_experiments(root: Path | str, max_depth: int = MAX_DEPTH) -> list[Path]:
    """Experiment folders (those holding ``runs/``, or the params of a figures-only sweep in
    ``inputs/``: git keeps no empty runs/) under ``root``, at most ``max_depth`` levels down,
    sorted. An experiment's own subfolders are not searched."""
    root = Path(root)
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        if (d / RUNS).is_dir() or any((d / "inputs").glob("params__*.yaml")):
            found.append(d)
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for c in children:
            walk(c, depth + 1)

    walk(root, 0)
    return found


def rows_to_frame(rows: list[dict[str, Any]], latest_only: bool = True) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for col in schema.COLUMNS:
        if col.name not in df.columns:
            df[col.name] = pd.Series([None] * len(df), dtype="object")
        df[col.name] = _as_dtype(df[col.name], col.dtype)
    extra = [c for c in df.columns if c not in schema.COLUMN_NAMES]
    for c in extra:  # engine knobs: keep scalars, serialise dicts for Parquet
        if df[c].map(lambda v: isinstance(v, dict | list)).any():
            df[c] = df[c].map(lambda v: json.dumps(v, sort_keys=True) if v is not None else None)
    df = df[list(schema.COLUMN_NAMES) + sorted(extra)]
    if latest_only and len(df):
        # An ok attempt wins over later failures of the same run; else the latest attempt.
        order = df["status"].eq(schema.STATUS_OK).astype(int)
        df = (df.assign(_ok=order).sort_values(["_ok", "finished_at"])
                .drop_duplicates("run_id", keep="last").drop(columns="_ok"))
    if len(df):
        df = df.sort_values(["engine_config_id", "max_concurrency", "request_rate", "repeat",
                             "run_id", "finished_at"], na_position="last")
    return df.reset_index(drop=True)


def _as_dtype(s: pd.Series, dtype: str) -> pd.Series:
    if dtype == "string":
        return s.map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v))
                     else str(v)).astype("string")
    if dtype == "Int64":
        return pd.to_numeric(s, errors="coerce").round().astype("Int64")
    if dtype == "float64":
        return pd.to_numeric(s, errors="coerce").astype("float64")
    return s.astype(dtype)
