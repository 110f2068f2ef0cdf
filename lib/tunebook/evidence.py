"""What a figure is judged on (an experiment's stored rows) and what it returns (a Claim).

    ev = load_evidence("outputs/h200/ch02")   # rows, run records and the params that ran
    ev.ok                                     # the ok rows (store.ok_rows)

Data flows one way: store → evidence → figures (the registry and chapter modules) → claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from tunebook import schema
from tunebook.store import Store, ok_rows

HOLDS = "holds"
DIFFERS = "differs"
CANNOT = "cannot run here"
NOT_MEASURED = "not measured"
VERDICTS = (HOLDS, DIFFERS, CANNOT, NOT_MEASURED)
VERDICT_ICON = {HOLDS: "✅", DIFFERS: "⚠️", CANNOT: "⛔", NOT_MEASURED: "…"}

# A ratio "holds" when it is within this factor of the manual's (either way). Different
# machines give different absolute numbers; a ratio within 25% says the same thing.
RATIO_TOLERANCE = 1.25


@dataclass(frozen=True)
class Claim:
    figure: str
    claim: str  # the manual's words (index of figures)
    manual: str  # the manual's number(s), with the machine they came from
    measured: str  # what was measured here
    verdict: str  # one of VERDICTS
    why: str  # the rule applied, or why it could not run
    hardware: str = ""  # where it was measured
    experiment: str = ""
    measured_value: float | None = None  # the one number that stands for the measurement
    manual_value: float | None = None


COLUMNS = tuple(Claim.__dataclass_fields__)


@dataclass
class Evidence:
    """What one experiment folder holds."""

    root: Path
    df: pd.DataFrame  # latest attempt per run (Store.table())
    records: list[dict[str, Any]]  # the run JSON files
    params: dict[str, Any] = field(default_factory=dict)  # the last params the sweep ran

    @property
    def experiment(self) -> str:
        return self.root.name

    @property
    def figures(self) -> tuple[str, ...]:
        return tuple(str(f) for f in self.params.get("figures") or ())

    @property
    def ok(self) -> pd.DataFrame:
        return ok_rows(self.df)

    @property
    def hardware(self) -> str:
        hw = self.df.get("hardware", pd.Series(dtype=str)).dropna()
        return str(hw.iloc[0]) if len(hw) else ""

    @property
    def on_gpu(self) -> bool:
        return bool(self.df.get("gpu_name", pd.Series(dtype=str)).notna().any())

    def parts_for(self, fig: str) -> set[str] | None:
        """The params parts whose rows stand for Fig ``fig`` (a part that lists no figures
        stands for all); None when the experiment has no parts."""
        parts = [p for p in self.params.get("parts") or () if isinstance(p, dict)]
        if not parts:
            return None
        return {str(p.get("name")) for p in parts if not p.get("figures")
                or fig in [str(f) for f in p["figures"]]}

    def for_figure(self, fig: str) -> Evidence:
        """This evidence narrowed to the rows of the parts that stand for ``fig``."""
        names = self.parts_for(fig)
        if names is None or self.df.empty or "part" not in self.df.columns:
            return self
        keep = self.df["part"].astype("string").isin(sorted(names)).fillna(False)
        ids = set(self.df.loc[keep, "run_id"])
        return Evidence(self.root, self.df[keep], [r for r in self.records
                                                   if r.get("row", {}).get("run_id") in ids],
                        self.params)

    def engines(self) -> pd.DataFrame:
        """One ok row per engine config (the start-up facts are per engine)."""
        ok = self.ok
        return ok.drop_duplicates("engine_config_id") if len(ok) else ok

    def failed_engines(self) -> pd.DataFrame:
        """One row per engine config that never started."""
        if self.df.empty or "status" not in self.df.columns:
            return self.df
        bad = self.df[self.df["status"] == schema.STATUS_ENGINE_FAILED]
        return bad.drop_duplicates("engine_config_id")

    def knob(self, row: pd.Series, name: str, default: Any = None) -> Any:
        v = row.get(name, default)
        return default if missing(v) else v


def load_evidence(root: str | Path) -> Evidence:
    store = Store(Path(root))
    inputs = sorted((store.root / "inputs").glob("params__*.yaml"))
    params = yaml.safe_load(inputs[-1].read_text()) if inputs else {}
    return Evidence(store.root, store.table(), list(store.records()), params or {})


def missing(v: Any) -> bool:
    """None or NaN/NA (a cell with nothing in it)."""
    if v is None:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # lists, dicts
        return False


def within(measured: float, reference: float, factor: float = RATIO_TOLERANCE) -> bool:
    """Both positive and within ``factor`` of each other, either way."""
    return (measured > 0 and reference > 0
            and max(measured / reference, reference / measured) <= factor)


def times(v: float) -> str:
    """A ratio as text: 1.25×."""
    return f"{v:.2f}×" if math.isfinite(v) else "n/a"
