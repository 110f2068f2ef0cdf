"""What a figure is judged on (an experiment's stored rows) and what it returns (a Claim).

    ev = load_evidence("outputs/h200/ch02")   # rows, run records and the params that ran
    ev.ok                                     # the ok rows (store.ok_rows)

Data flows one way: store → evidence → figures (the registry and chapter modules) → claims.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import yaml

from tunebook.core import schema
from tunebook.results.stats import Interval, within_noise
from tunebook.results.store import Store, find_experiments, ok_rows, rows_to_frame

HOLDS = "holds"
DIFFERS = "differs"
CANNOT = "cannot run here"
NOT_MEASURED = "not measured"
# The difference that decides the verdict is smaller than the repeats' 95% intervals: the
# measurement cannot tell holds from differs (more repeats may).
NOISE = "within noise"
VERDICTS = (HOLDS, DIFFERS, NOISE, CANNOT, NOT_MEASURED)
VERDICT_ICON = {HOLDS: "✅", DIFFERS: "⚠️", NOISE: "〰️", CANNOT: "⛔", NOT_MEASURED: "…"}

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
    # the run JSON files, without their per-request arrays (most figures never look at them):
    # `requests(rec)` reads a run's arrays when a figure needs them
    records: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)  # the last params the sweep ran
    # where the last sweep ran (inputs/machine__*.json: tunebook.core.hardware.machine() and the
    # GPU topology); what an experiment without rows (figures only) knows of its machine
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def experiment(self) -> str:
        return self.root.name

    @property
    def machine_root(self) -> Path:
        """outputs/<machine>/: the folder that holds this experiment beside the other
        experiments of the same machine."""
        return self.root.parent

    def machine_experiments(self) -> list[Evidence]:
        """Every experiment stored in this machine's outputs root, this one included, loaded
        afresh (Fig 7.1 reads them all)."""
        return load_machine(self.machine_root)

    @property
    def figures(self) -> tuple[str, ...]:
        return tuple(str(f) for f in self.params.get("figures") or ())

    @property
    def ok(self) -> pd.DataFrame:
        return ok_rows(self.df)

    @property
    def hardware(self) -> str:
        hw = self.df.get("hardware", pd.Series(dtype=str)).dropna()
        return str(hw.iloc[0]) if len(hw) else str(self.machine.get("hardware") or "")

    @property
    def on_gpu(self) -> bool:
        """The rows ran on a GPU; without rows, the recorded machine has one."""
        if self.df.empty:
            return bool(self.machine.get("gpu_name"))
        return bool(self.df.get("gpu_name", pd.Series(dtype=str)).notna().any())

    def sibling(self, experiment: str) -> Evidence | None:
        """Another experiment of the same outputs root (e.g. chapter 2's starts for chapter
        6), or None when that folder holds no runs."""
        other = self.root.parent / experiment
        return load_evidence(other) if (other / "runs").is_dir() else None

    def parts_for(self, fig: str) -> set[str] | None:
        """The params parts whose rows stand for Fig ``fig`` (a part that lists no figures
        stands for all); None when the experiment has no parts."""
        parts = [p for p in self.params.get("parts") or () if isinstance(p, dict)]
        if not parts:
            return None
        return {str(p.get("name")) for p in parts if not p.get("figures")
                or fig in [str(f) for f in p["figures"]]}

    def planned_runs(self, names: set[str]) -> set[str]:
        """Run ids the named parts plan. A load point two parts share (same engine config,
        same load) is run once and its row names the first part, so the row column alone would
        hide it from the second part's figures. Read from the stored plan (plan.json names
        every part of each run); an experiment stored before it did is planned again from its
        params (empty when they no longer parse)."""
        stored = self._stored_plan_parts()
        if stored is not None:
            return {rid for rid, parts in stored.items() if names & set(parts)}
        from dataclasses import replace

        from tunebook.inputs.params import ParamsError, parse
        from tunebook.inputs.plan import make_plan

        try:
            p = parse(self.params)
        except (ParamsError, ValueError, TypeError, KeyError):
            return set()
        return {r.run_id for part in p.parts if part.name in names
                for r in make_plan(replace(p, parts=(part,))).runs}

    def _stored_plan_parts(self) -> dict[str, list[str]] | None:
        """run_id -> every part that planned it, from plan.json; None where it does not say."""
        try:
            runs = json.loads((self.root / "plan.json").read_text())["runs"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not runs or not all(isinstance(r, dict) and "parts" in r for r in runs):
            return None
        return {r["run_id"]: list(r["parts"]) for r in runs}

    def for_figure(self, fig: str) -> Evidence:
        """This evidence narrowed to the rows of the parts that stand for ``fig``."""
        names = self.parts_for(fig)
        if names is None or self.df.empty or "part" not in self.df.columns:
            return self
        keep = self.df["part"].astype("string").isin(sorted(names)).fillna(False)
        keep |= self.df["run_id"].isin(self.planned_runs(names))
        ids = set(self.df.loc[keep, "run_id"])
        return Evidence(self.root, self.df[keep], [r for r in self.records
                                                   if r.get("row", {}).get("run_id") in ids],
                        self.params, self.machine)

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

    def requests(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A run's per-request arrays (vLLM's client's: ttfts, itls, …), read now from its
        file(s); {} when it has none. One whose Parquet file cannot be read warns (its record
        says why: tunebook.results.compact)."""
        if isinstance(rec.get("requests"), dict):
            return rec["requests"]
        full = Store(self.root).record_of(rec.get("row") or {})
        arrays = (full or {}).get("requests")
        return arrays if isinstance(arrays, dict) else {}

    def knob(self, row: pd.Series, name: str, default: Any = None) -> Any:
        v = row.get(name, default)
        return default if missing(v) else v


def load_evidence(root: str | Path, requests: bool = False) -> Evidence:
    """An experiment's rows, records and params; the records without their per-request
    arrays unless `requests` (`Evidence.requests` reads a run's when a figure needs them)."""
    store = Store(Path(root))
    inputs = sorted((store.root / "inputs").glob("params__*.yaml"))
    params = yaml.safe_load(inputs[-1].read_text()) if inputs else {}
    facts = sorted((store.root / "inputs").glob("machine__*.json"))
    machine = json.loads(facts[-1].read_text()) if facts else {}
    records = list(store.records(requests))
    table = rows_to_frame([r["row"] for r in records if isinstance(r, dict) and "row" in r])
    return Evidence(store.root, table, records, params or {},  # Store.table(), files read once
                    machine if isinstance(machine, dict) else {})


def load_machine(root: str | Path) -> list[Evidence]:
    """The experiments directly under one machine's outputs root (outputs/<machine>/), in
    name order."""
    return [load_evidence(p) for p in find_experiments(root, max_depth=1)]


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


# --- verdicts that respect noise ------------------------------------------------------------
class Decision(NamedTuple):
    """A verdict word (one of VERDICTS) and the reason, ready for a Claim."""

    verdict: str
    why: str


def noise_verdict(holds: bool, noisy: bool) -> str:
    """HOLDS or DIFFERS by ``holds``, unless the deciding difference is ``noisy``: NOISE."""
    return NOISE if noisy else HOLDS if holds else DIFFERS


_EXPECT = {">": "higher than", "<": "lower than", "=": "the same as"}


def compare(a: Interval, b: Interval, expect: str, names: tuple[str, str] = ("A", "B"),
            unit: str = "", tolerance: float | None = None) -> Decision:
    """A claim about two measured means: ``a`` is higher (``expect=">"``), lower (``"<"``)
    or the same (``"="``) as ``b``.

    ">"/"<" with intervals on both sides (2+ repeats each): overlapping intervals
    (``stats.within_noise``) give NOISE — the claimed difference is smaller than the noise;
    apart, the means decide HOLDS or DIFFERS.

    "=" with intervals: when the means are within ``tolerance`` (a fraction: 0.15 = 15%) of
    each other it HOLDS (the same for practical purposes, whatever the noise); otherwise
    overlapping intervals give HOLDS without a tolerance ("the same within noise") and NOISE
    with one (they look apart, but the repeats cannot tell), and apart intervals DIFFERS. Few
    repeats make wide intervals, so "the same within noise" is weak evidence: the reason
    prints the intervals.

    With one run on either side noise is unmeasured: ">"/"<" go by the means; "=" by
    ``tolerance`` (NOT_MEASURED without one). The reason says which case applied. A side with
    no ok run is NOT_MEASURED."""
    if expect not in _EXPECT:
        raise ValueError(f"expect must be one of {list(_EXPECT)}, not {expect!r}")
    na, nb = names
    said = f"{na} {a.text(unit)} vs {nb} {b.text(unit)}"
    if a.n == 0 or b.n == 0:
        return Decision(NOT_MEASURED, f"{said}: no ok run on "
                                      f"{'both sides' if a.n == b.n else na if a.n == 0 else nb}")
    claim = f"the claim: {na} {_EXPECT[expect]} {nb}"
    gap = abs(a.mean / b.mean - 1) if b.mean else math.inf
    bar = f"{gap:.0%} apart, the bar is {tolerance:.0%}" if tolerance is not None else ""
    if a.known and b.known:
        overlap = within_noise(a, b)
        if expect == "=":
            if tolerance is not None and gap <= tolerance:
                return Decision(HOLDS, f"{said}: {bar}")
            if overlap:
                return (Decision(HOLDS, f"{said}: the intervals overlap, the same within noise")
                        if tolerance is None else
                        Decision(NOISE, f"{said}: {bar}, but the intervals overlap, so the "
                                        "difference is within noise"))
            return Decision(DIFFERS, f"{said}: the intervals do not overlap"
                                     + (f" ({bar})" if bar else ""))
        if overlap:
            return Decision(NOISE, f"{said}: the intervals overlap, so the difference is "
                                   f"within noise ({claim})")
        holds = a.mean > b.mean if expect == ">" else a.mean < b.mean
        return Decision(HOLDS if holds else DIFFERS,
                        f"{said}: the intervals do not overlap ({claim})")
    unmeasured = "one run, noise not measured"
    if expect == "=":
        if tolerance is None:
            return Decision(NOT_MEASURED, f"{said}: {unmeasured}; repeats are needed to tell "
                                          "a match from noise")
        return Decision(HOLDS if gap <= tolerance else DIFFERS, f"{said}: {bar} ({unmeasured})")
    holds = a.mean > b.mean if expect == ">" else a.mean < b.mean
    return Decision(HOLDS if holds else DIFFERS, f"{said}: by the means ({unmeasured}; "
                                                 f"{claim})")


def against_reference(measured: Interval, reference: float, factor: float = RATIO_TOLERANCE,
                      name: str = "measured", unit: str = "x") -> Decision:
    """A measured value (a ratio, usually) against the manual's: HOLDS when it lies within
    ``factor`` of the reference either way (``within``).

    With an interval: HOLDS when the whole interval lies inside [reference / factor,
    reference × factor], DIFFERS when it lies wholly outside, NOISE when it straddles an
    edge — the verdict would hinge on noise. With one run the mean decides, and the reason
    says noise was not measured."""
    ref = f"the manual's {reference:.3g}{'×' if unit == 'x' else ' ' + unit}"
    band_lo, band_hi = reference / factor, reference * factor
    said = f"{name} {measured.text(unit)} vs {ref} (holds within {factor:g}× either way)"
    if measured.n == 0 or not math.isfinite(measured.mean):
        return Decision(NOT_MEASURED, f"{name}: no ok run")
    if not measured.known:
        ok = within(measured.mean, reference, factor)
        return Decision(HOLDS if ok else DIFFERS, f"{said}; one run, noise not measured")
    if band_lo <= measured.low and measured.high <= band_hi:
        return Decision(HOLDS, f"{said}: the whole interval is within")
    if measured.high < band_lo or measured.low > band_hi:
        return Decision(DIFFERS, f"{said}: the whole interval is outside")
    return Decision(NOISE, f"{said}: the interval straddles the {factor:g}× bar, so the "
                           "verdict is within noise")
