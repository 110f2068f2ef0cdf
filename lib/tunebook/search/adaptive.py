"""From an SLO to the best engine config: adaptive search over engine knobs and load.

The question users ask: "which config serves the most output tok/s while p99 TPOT ≤ X ms and
p99 TTFT ≤ Y ms on this machine?" — answered here without running the whole grid:

- **Within one engine config**, `best_load` bisects the load levels (concurrent users) for the
  highest one that meets every bound, and stops climbing past saturation: when a level meets
  the SLO but serves less than `gain` × the throughput of the feasible level below it, more
  users only queue (the knee of tunebook.results.stats.saturation, as a stopping rule).
- **Across engine configs**, `search` lets Optuna's sampler (TPE, or a grid) propose configs and
  prunes a config as soon as it cannot beat the best so far. The bound that makes this sound:
  throughput does not fall as users are added (until saturation), so a config that misses the
  SLO at `u` users scores at most its throughput at `u`; when that is ≤ the best score, no
  lower load of it can win, and the rest of its bisection is skipped.

The evaluator is any `(knobs, users) -> row` callable that returns a result row (schema
columns): `tunebook.search.tune.SweepEvaluator` runs real engines through tunebook.measure (every
point an ordinary stored run: resume, failures and the lock unchanged); tests pass a simulated
engine with a known answer. This module never starts anything itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tunebook.core import schema
from tunebook.inputs.slo import (
    Bound,
    SearchSpec,
    point_key,
)
from tunebook.servers import kinds as server_kinds

Row = Mapping[str, Any]
Evaluate = Callable[[dict[str, Any], int], Row]


class Replay:
    """An evaluator that answers from points measured before (a full grid's summary), and
    charges each point what it cost then: its runs' seconds, plus its config's engine start
    the first time the config is touched (tunebook.search.tune.point_cost). Replaying a
    search on a measured grid (a tabular benchmark, as HPOBench does) compares search methods
    on the same measurements, free of the run-to-run noise two live runs would add; its engine
    time is what that search would have spent on that machine."""

    def __init__(self, grid_summary: Mapping[str, Any], objective: str = "output_tok_s"):
        self.rows: dict[str, dict[str, Any]] = {}
        self.point_s: dict[str, float] = {}
        self.start_s: dict[str, float] = {}
        for c in grid_summary["configs"]:
            for p in c["points"]:
                k = point_key(c["knobs"], p["users"])
                ok = p.get("value") is not None
                self.rows[k] = {**{m: v for m, v in p.items() if m not in ("users", "meets")},
                                "status": schema.STATUS_OK if ok else schema.STATUS_FAILED,
                                objective: p.get("value")}
                self.point_s[k] = float(p.get("seconds") or 0.0)
                if p.get("start_s"):
                    self.start_s[repr(sorted(c["knobs"].items()))] = float(p["start_s"])
        self.engine_s = 0.0
        self.touched: set[str] = set()

    @property
    def engine_starts(self) -> int:
        """Configs touched that the grid measured (a config it lacks starts nothing)."""
        return sum(1 for c in self.touched if c in self.start_s)

    def __call__(self, knobs: dict[str, Any], users: int) -> Row:
        k = point_key(knobs, users)
        if k not in self.rows:
            raise KeyError(f"the grid has no point {k}")
        config = repr(sorted(knobs.items()))
        if config not in self.touched:
            self.touched.add(config)
            self.engine_s += self.start_s.get(config, 0.0)
        self.engine_s += self.point_s[k]
        return self.rows[k]


# --- within one engine config ----------------------------------------------------------------
@dataclass
class Point:
    knobs: dict[str, Any]
    users: float  # the load level: concurrent users, or a trace's replay speed
    row: Row
    meets: bool
    value: float | None  # the objective; None when the run gave none (failed)


@dataclass
class ConfigOutcome:
    """One engine config's search: every point it ran and its score (the objective at its
    best point that meets the SLO)."""

    knobs: dict[str, Any]
    points: list[Point] = field(default_factory=list)
    pruned: bool = False
    why: str = ""  # how its search ended, one line

    @property
    def best(self) -> Point | None:
        ok = [p for p in self.points if p.meets and p.value is not None]
        return max(ok, key=lambda p: (p.value, -p.users)) if ok else None

    @property
    def score(self) -> float | None:
        b = self.best
        return b.value if b else None


def _objective(row: Row, objective: str) -> float | None:
    v = row.get(objective)
    ok = row.get("status", schema.STATUS_OK) == schema.STATUS_OK
    return float(v) if ok and isinstance(v, int | float) and math.isfinite(float(v)) else None


# Objectives that can fall as load grows past what an engine serves well: goodput counts only
# the requests that met their bounds. A level below a missed one may serve more of it, so the
# missed level's goodput bounds nothing; its completed requests per second do (goodput ≤
# throughput, and throughput does not fall as load grows), and stand in for it in pruning.
CEILINGS = {"request_goodput_req_s": "request_throughput_req_s"}


def _ceiling(row: Row, objective: str) -> float | None:
    """What any lower load level of this config can serve at most, as seen from this row."""
    return _objective(row, CEILINGS.get(objective, objective))


def meets(row: Row, bounds: Sequence[Bound]) -> bool:
    """Every bound met by an ok run."""
    if row.get("status", schema.STATUS_OK) != schema.STATUS_OK:
        return False
    return all(b.met(row) for b in bounds)


def _users(level: float) -> str:
    return f"{level} users"


def best_load(evaluate: Evaluate, knobs: dict[str, Any], levels: Sequence[float],
              bounds: Sequence[Bound], objective: str = "output_tok_s",
              beat: float | None = None, gain: float = 1.05,
              first: int | None = None,
              say: Callable[[float], str] = _users) -> ConfigOutcome:
    """Bisect `levels` for the highest load of this config that meets every bound.

    `beat`: the best score so far; the config is pruned as soon as a point that misses the SLO
    serves no more than it (its score cannot exceed that point's throughput). A feasible level
    that serves less than `gain` × the feasible level below it ends the climb (saturation).
    `first`: the level to try first (the search passes the best config's level: a config that
    misses the SLO there and serves no more than the best is done after one point). `say`:
    a level in words (SearchSpec.level_text: users, or a trace's replay speed)."""
    out = ConfigOutcome(dict(knobs))
    lo, hi = -1, len(levels)  # highest index known to meet, lowest index known to miss
    while hi - lo > 1:
        if first is not None and not out.points and 0 <= first < len(levels):
            mid = first
        else:
            mid = (lo + hi + 1) // 2 if lo >= 0 else (hi - 1) // 2
        row = evaluate(dict(knobs), levels[mid])
        value = _objective(row, objective)
        point = Point(dict(knobs), levels[mid], row, meets(row, bounds), value)
        out.points.append(point)
        if point.meets:
            below = next((p for p in reversed(out.points[:-1])
                          if p.meets and p.users < point.users and p.value is not None), None)
            lo = mid
            if below is not None and value is not None and value < gain * below.value:
                out.why = (f"saturated at {say(point.users)}: {value:,.1f} < {gain:g} × "
                           f"{below.value:,.1f} at {say(below.users)}")
                return out
        else:
            hi = mid
            own = out.score
            # the levels left (between lo and mid) serve at most `ceiling` (the objective
            # itself, or for goodput the throughput: CEILINGS): when that is no more than the
            # best so far, none of them can win — the best of another config (pruned) or this
            # config's own (its search is done)
            ceiling = _ceiling(row, objective)
            if beat is not None and (own is None or own <= beat) and (
                    ceiling is None or ceiling <= beat):
                out.pruned = True
                out.why = (f"pruned at {say(point.users)}: misses the SLO and serves "
                           f"{'nothing' if ceiling is None else f'{ceiling:,.1f}'} ≤ the best "
                           f"{beat:,.1f}")
                return out
            if own is not None and (ceiling is None or ceiling <= own) and out.best is not None:
                out.why = (f"best {say(out.best.users)}: {say(point.users)} misses and "
                           "serves no more than it")
                return out
    if out.best is None:
        out.why = f"no load level meets the SLO (lowest tried: {say(levels[0])})"
    else:
        top = "the highest level" if lo == len(levels) - 1 else f"{say(levels[lo + 1])} misses"
        out.why = f"best {say(out.best.users)} ({top})"
    return out


# --- across engine configs -------------------------------------------------------------------
@dataclass
class SearchResult:
    spec: SearchSpec
    bounds: tuple[Bound, ...]
    outcomes: list[ConfigOutcome]
    wall_s: float
    stopped: str = ""  # why the search ended

    @property
    def points(self) -> list[Point]:
        return [p for o in self.outcomes for p in o.points]

    @property
    def best(self) -> ConfigOutcome | None:
        scored = [o for o in self.outcomes if o.score is not None]
        return max(scored, key=lambda o: o.score) if scored else None  # type: ignore[arg-type]

    @property
    def baseline(self) -> ConfigOutcome | None:
        """The baseline config's outcome, when the spec names one and it was tried."""
        b = self.spec.baseline
        return next((o for o in self.outcomes if b and o.knobs == dict(b)), None)

    def closest(self) -> Point | None:
        """When nothing meets the SLO: the point that misses it by the least (its worst
        bound's shortfall, as a fraction of the bound)."""
        def worst(p: Point) -> float:
            s = [b.slack(p.row) for b in self.bounds]
            return min((x for x in s if x is not None), default=-math.inf)
        pts = [p for p in self.points if p.row.get("status", schema.STATUS_OK)
               == schema.STATUS_OK]
        return max(pts, key=worst) if pts else None


def _ordinal(values: Sequence[Any]) -> list[Any] | None:
    """The values in order when they are all numbers (Optuna then models them as an ordered
    index, so TPE learns "more seqs helped" instead of treating each value as a label)."""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return None


def search(evaluate: Evaluate, spec: SearchSpec, bounds: Sequence[Bound],
           on_config: Callable[[ConfigOutcome], None] | None = None) -> SearchResult:
    """Optuna proposes engine configs (spec.sampler), each is bisected by `best_load` with the
    best score so far as the bar to beat, starting at the best's load level; ends when every
    config of the space was tried or the budget (configs, minutes, patience: configs in a row
    that beat no best by `min_gain`) is spent. A config within min_gain of the best still
    becomes the best (the answer is the highest measured), but does not reset patience."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    grid = spec.grid()
    if spec.sampler == "grid":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.GridSampler(
            {k: list(v) for k, v in spec.knobs.items()}, seed=spec.seed)
        ordered: dict[str, list[Any] | None] = {k: None for k in spec.knobs}
    else:
        sampler = optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=spec.startup,
                                             multivariate=True)
        ordered = {k: _ordinal(v) for k, v in spec.knobs.items()}
    study = optuna.create_study(direction="maximize", sampler=sampler)
    if spec.baseline and spec.sampler != "grid":  # where a user starts: vLLM's defaults
        first_trial = {}
        for k, v in spec.baseline.items():
            order = ordered[k]
            first_trial[k] = order.index(v) if order else v
        study.enqueue_trial(first_trial)
    outcomes: dict[str, ConfigOutcome] = {}
    t0 = time.monotonic()
    stopped = ""
    since_best = 0  # configs tried in a row that beat no best

    def key(k: Mapping[str, Any]) -> str:
        return repr(sorted(k.items()))

    def leader() -> ConfigOutcome | None:
        scored = [o for o in outcomes.values() if o.score is not None]
        return max(scored, key=lambda o: o.score) if scored else None  # type: ignore[arg-type]

    def objective(trial: optuna.Trial) -> float:
        nonlocal since_best
        knobs = {}
        for name, values in spec.knobs.items():
            order = ordered[name]
            knobs[name] = (order[trial.suggest_int(name, 0, len(order) - 1)] if order
                           else trial.suggest_categorical(name, list(values)))
        done = outcomes.get(key(knobs))
        if done is None:  # a config proposed again costs nothing
            lead = leader()
            first = (spec.users.index(lead.best.users)
                     if lead is not None and lead.best is not None else None)
            done = best_load(evaluate, knobs, spec.users, bounds, spec.objective,
                             beat=lead.score if lead else None, gain=spec.gain, first=first,
                             say=spec.level_text)
            outcomes[key(knobs)] = done
            # beating the best by less than min_gain is noise: it moves the answer, not patience
            beat = done.score is not None and (
                lead is None or done.score > (lead.score or 0) * spec.min_gain)
            # patience counts the sampler's own proposals, not the random draws it starts with
            modelled = len(outcomes) > spec.startup + (1 if spec.baseline else 0)
            since_best = 0 if beat else since_best + (1 if modelled else 0)
            if on_config:
                on_config(done)
        score = done.score if done.score is not None else 0.0
        if done.pruned:
            trial.report(score, 0)  # TPE ranks a pruned config by what it did serve
            raise optuna.TrialPruned(done.why)
        return score

    # TPE may propose a config again; cap the trials so a small space still ends
    for _ in range(max(len(grid) * 20, 50)):
        if len(outcomes) == len(grid):
            stopped = f"every one of the {len(grid)} engine configs was tried"
            break
        if spec.max_configs is not None and len(outcomes) >= spec.max_configs:
            stopped = f"budget: {spec.max_configs} engine configs"
            break
        if spec.patience is not None and since_best >= spec.patience:
            by = f" by {spec.min_gain:g}×" if spec.min_gain != 1.0 else ""
            stopped = (f"patience: {since_best} engine configs in a row beat no best{by} "
                       f"({len(outcomes)} of {len(grid)} tried)")
            break
        if spec.max_minutes is not None and time.monotonic() - t0 > 60 * spec.max_minutes:
            stopped = f"budget: {spec.max_minutes:g} minutes"
            break
        study.optimize(objective, n_trials=1)
    else:
        stopped = f"the sampler kept proposing tried configs ({len(outcomes)} of {len(grid)})"
    return SearchResult(spec, tuple(bounds), list(outcomes.values()),
                        time.monotonic() - t0, stopped)


def full_grid(evaluate: Evaluate, spec: SearchSpec, bounds: Sequence[Bound]) -> SearchResult:
    """The brute-force answer the search is checked against: every config at every level,
    the baseline first (a grid cut short by a budget still has what the answer is measured
    against; the H200's first grid lost exactly that config, measured last)."""
    t0 = time.monotonic()
    outcomes = []
    grid = spec.grid()
    if spec.baseline:
        grid.sort(key=lambda k: k != dict(spec.baseline))  # stable: the rest keep their order
    for knobs in grid:
        o = ConfigOutcome(dict(knobs), why="full grid")
        for u in spec.users:
            row = evaluate(dict(knobs), u)
            o.points.append(Point(dict(knobs), u, row, meets(row, bounds),
                                  _objective(row, spec.objective)))
        outcomes.append(o)
    return SearchResult(spec, tuple(bounds), outcomes, time.monotonic() - t0,
                        "the full grid")


def serve_command(model: str, base: Mapping[str, Any], knobs: Mapping[str, Any]) -> str:
    """The config as a command line (what to run in production), as its server kind writes
    it: `vllm serve …`, or SGLang's when the search's space holds engine_kind."""
    cfg = {**base, **knobs}
    return "\n".join(server_kinds.kind_of(cfg).serve_lines(model, cfg))
