"""An SLO and a search space as a params file states them (`slo:` and `search:`), checked.

- `Bound`: one bound of the SLO (`p99_tpot_ms <= 50`), met or not by a result row, with slack.
- `SearchSpec`: the knobs to search, load levels, budget, sampler, seed (`parse_search`).
- `point_key`: one point of the space (an engine config at a load level) as a stable string.

tunebook.search.adaptive searches a space; tunebook.search.tune runs it on real engines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tunebook.core import knobs as knob_table
from tunebook.core import schema
from tunebook.core.sections import SECTIONS, Checker, Section

Row = Mapping[str, Any]
Evaluate = Callable[[dict[str, Any], int], Row]

OBJECTIVES = ("output_tok_s", "total_tok_s", "request_throughput_req_s",
              "request_goodput_req_s", "output_tok_per_usd")  # the last needs params cost:
# What a search's load levels are: concurrent users, or a trace's replay speeds
LEVELS = ("users", "speed")
_BOUND = re.compile(r"^\s*([a-z0-9_]+)\s*(<=|>=|<|>)\s*([0-9][0-9_.eE+-]*)\s*$")
SAMPLERS = ("tpe", "grid")


class SearchSpecError(ValueError):
    """Problems with an `slo:` or `search:` section: (key, message) pairs, like ParamsError."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{k}: {m}" for k, m in problems))


@dataclass(frozen=True)
class Bound:
    """One SLO bound on a result column, e.g. ``p99_tpot_ms <= 50``."""

    metric: str
    op: str  # "<=", "<", ">=", ">"
    value: float

    @classmethod
    def parse(cls, text: str) -> Bound:
        m = _BOUND.match(str(text))
        if not m:
            raise ValueError(f"{text!r} is not '<metric> <= <number>' (or <, >=, >), e.g. "
                             "'p99_tpot_ms <= 50'")
        metric, op, raw = m.groups()
        if metric not in schema.COLUMN_NAMES:
            raise ValueError(f"{metric!r} is not a result column"
                             f"{knob_table.did_you_mean(metric, schema.COLUMN_NAMES)} (e.g. "
                             "p99_tpot_ms, p99_ttft_ms, median_itl_ms, output_tok_s_per_user)")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{raw!r} in {text!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{text!r}: the bound must be a finite number")
        return cls(metric, op, value)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"

    def _value(self, row: Row) -> float | None:
        v = row.get(self.metric)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
            return None
        return float(v)

    def met(self, row: Row) -> bool:
        v = self._value(row)
        if v is None:
            return False
        return {"<=": v <= self.value, "<": v < self.value,
                ">=": v >= self.value, ">": v > self.value}[self.op]

    def slack(self, row: Row) -> float | None:
        """How far inside the bound the row is, as a fraction of the bound (negative: by how
        much it misses); None when the row lacks the metric."""
        v = self._value(row)
        if v is None:
            return None
        d = (self.value - v) if self.op in ("<=", "<") else (v - self.value)
        return d / (abs(self.value) or 1.0)


@dataclass(frozen=True)
class SearchSpec:
    """The `search:` section: the knobs and their values, the load levels, the objective, the
    sampler and the budget (engine configs started, or minutes; None: no limit)."""

    knobs: Mapping[str, tuple[Any, ...]]
    users: tuple[float, ...]  # the load levels: users, or a trace's replay speeds (`level`)
    objective: str = "output_tok_s"
    sampler: str = "tpe"
    max_configs: int | None = None
    max_minutes: float | None = None
    patience: int | None = None  # stop after this many proposed configs in a row that beat no
    # best (counted once TPE models the space, after its random start)
    min_gain: float = 1.0  # a config "beats the best" for patience only by this factor: a
    # smaller gain is within the run-to-run noise and would keep a search going on noise
    baseline: Mapping[str, Any] | None = None  # the config to beat (vLLM's defaults): tried first
    seed: int = 0
    level: str = "users"  # what `users` holds: concurrent users, or a trace's replay speeds
    gain: float = 1.05  # a level must beat the one below by this factor to count as a gain
    confirm: int | None = None  # re-measure the answer and the runner-up this many times each

    @property
    def startup(self) -> int:
        """Configs TPE draws at random before it models the rest: about one in five of the
        space, 2 to 10 (Optuna's default of 10 would spend a small space on random draws)."""
        return max(2, min(10, len(self.grid()) // 5))

    def level_text(self, level: float) -> str:
        """One load level in words: '16 users', '2× the trace's rate'."""
        return f"{level:g}× the trace's rate" if self.level == "speed" else f"{level} users"

    def grid(self) -> list[dict[str, Any]]:
        """Every engine config of the space (the full grid), in a stable order."""
        configs: list[dict[str, Any]] = [{}]
        for name, values in self.knobs.items():
            configs = [{**c, name: v} for c in configs for v in values]
        return configs

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"knobs": {k: list(v) for k, v in self.knobs.items()},
                               "speeds" if self.level == "speed" else "users": list(self.users),
                               "objective": self.objective,
                               "sampler": self.sampler, "seed": self.seed, "gain": self.gain}
        budget = {k: v for k, v in (("engine_configs", self.max_configs),
                                    ("minutes", self.max_minutes),
                                    ("patience", self.patience),
                                    ("min_gain", self.min_gain if self.min_gain != 1.0
                                     else None)) if v is not None}
        if budget:
            out["budget"] = budget
        if self.baseline:
            out["baseline"] = dict(self.baseline)
        if self.confirm:
            out["confirm"] = self.confirm
        return out


def parse_slo(raw: Any) -> tuple[Bound, ...]:
    """`slo:` — a list of bounds (strings), at least one."""
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise SearchSpecError([("slo", "must be a list of bounds like 'p99_tpot_ms <= 50'")])
    bounds, problems = [], []
    for i, text in enumerate(raw):
        try:
            bounds.append(Bound.parse(text))
        except ValueError as e:
            problems.append((f"slo[{i}]", str(e)))
    if problems:
        raise SearchSpecError(problems)
    return tuple(bounds)


def parse_search(raw: Any, users_default: Sequence[float] = (),
                 level: str = "users") -> SearchSpec:
    """`search:` — {knobs: {name: [values]}, users: [levels], objective, sampler, seed,
    budget: {engine_configs: N, minutes: M, patience: P, min_gain: G}, gain, baseline,
    confirm}. On a trace (`level` speed) the load levels are `speeds: [replay speeds]`."""
    p: list[tuple[str, str]] = []
    if not isinstance(raw, dict):
        raise SearchSpecError([("search", "must be a mapping: knobs, users, objective, budget")])
    allowed = {"knobs", "speeds" if level == "speed" else "users", "objective", "sampler",
               "seed", "budget", "gain", "baseline", "confirm"}
    if level == "speed" and "users" in raw:
        p.append(("search.users", "a trace's load levels are its replay speeds: search.speeds "
                                  "(× the trace's own rate), not users"))
    for k in raw:
        if k not in allowed:
            p.append((f"search.{k}", f"unknown key{knob_table.did_you_mean(k, allowed)}; "
                                     f"allowed: {sorted(allowed)}"))
    space: dict[str, tuple[Any, ...]] = {}
    kn = raw.get("knobs")
    if not isinstance(kn, dict) or not kn:
        p.append(("search.knobs", "must map engine knobs to the values to try, e.g. "
                                  "{max_num_seqs: [8, 16, 32]}"))
    else:
        searchable = [n for n, k in knob_table.KNOBS.items() if k.flag]
        for name, values in kn.items():
            key = f"search.knobs.{name}"
            knob = knob_table.KNOBS.get(name)
            if knob is None or not knob.flag:
                p.append((key, "is not an engine knob"
                                f"{knob_table.did_you_mean(name, searchable)} "
                                "(see tunebook.core.knobs)"))
                continue
            if not isinstance(values, list) or not values:
                p.append((key, "must be a non-empty list of values"))
                continue
            bad = [v for v in values if not knob.accepts(v)]
            if bad:
                p.append((key, f"{bad[0]!r} is not {knob.allowed}"))
            elif len({repr(v) for v in values}) != len(values):
                p.append((key, "lists a value twice"))
            else:
                space[name] = tuple(values)
    if level == "speed":
        users = raw.get("speeds", list(users_default))
        if (not isinstance(users, list) or not users
                or not all(isinstance(u, int | float) and not isinstance(u, bool)
                           and math.isfinite(u) and u > 0 for u in users)):
            p.append(("search.speeds", "must be a list of replay speeds > 0 (× the trace's "
                                       "own rate): the load levels to bisect"))
            users = []
        elif sorted(set(users)) != users:
            p.append(("search.speeds", "must be increasing, without repeats"))
        users = [float(u) for u in users]
    else:
        users = raw.get("users", list(users_default))
        if (not isinstance(users, list) or not users
                or not all(isinstance(u, int) and not isinstance(u, bool) and u > 0
                           for u in users)):
            p.append(("search.users", "must be a list of positive integers: the load levels "
                                      "(concurrent users) to bisect"))
            users = []
        elif sorted(set(users)) != users:
            p.append(("search.users", "must be increasing, without repeats"))
    objective = raw.get("objective", "output_tok_s")
    if objective not in OBJECTIVES:
        p.append(("search.objective", f"must be one of {OBJECTIVES}"))
    sampler = raw.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        p.append(("search.sampler", f"must be one of {SAMPLERS} (grid: the full grid)"))
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        p.append(("search.seed", "must be a non-negative integer"))
    gain = raw.get("gain", 1.05)
    if not isinstance(gain, int | float) or isinstance(gain, bool) or not 1 <= gain <= 2:
        p.append(("search.gain", "must be a number in [1, 2] (1.05: a level must serve 5% "
                                 "more than the one below to count as a gain)"))
    budget = raw.get("budget", {})
    max_configs = max_minutes = patience = None
    min_gain: Any = 1.0
    if not isinstance(budget, dict):
        p.append(("search.budget", "must be a mapping: {engine_configs: N}, {minutes: M} "
                                   "and/or {patience: P, min_gain: G}"))
    else:
        for k in budget:
            if k not in ("engine_configs", "minutes", "patience", "min_gain"):
                p.append((f"search.budget.{k}", "unknown; allowed: engine_configs, minutes, "
                                                "patience, min_gain"))
        min_gain = budget.get("min_gain", 1.0)
        if (not isinstance(min_gain, int | float) or isinstance(min_gain, bool)
                or not 1 <= min_gain <= 2):
            p.append(("search.budget.min_gain", "must be a number in [1, 2] (1.05: a config "
                                                "resets patience only by serving 5% more than "
                                                "the best so far)"))
        elif "min_gain" in budget and budget.get("patience") is None:
            p.append(("search.budget.min_gain", "needs budget.patience: it says what counts "
                                                "as beating the best for patience"))
        patience = budget.get("patience")
        if patience is not None and (not isinstance(patience, int)
                                     or isinstance(patience, bool) or patience < 1):
            p.append(("search.budget.patience", "must be a positive integer: stop after this "
                                                "many configs in a row that beat no best"))
        max_configs = budget.get("engine_configs")
        if max_configs is not None and (not isinstance(max_configs, int)
                                        or isinstance(max_configs, bool) or max_configs < 1):
            p.append(("search.budget.engine_configs", "must be a positive integer"))
        max_minutes = budget.get("minutes")
        if max_minutes is not None and (not isinstance(max_minutes, int | float)
                                        or isinstance(max_minutes, bool) or max_minutes <= 0):
            p.append(("search.budget.minutes", "must be a positive number"))
    baseline = raw.get("baseline")
    if baseline is not None:
        if not isinstance(baseline, dict) or set(baseline) != set(space):
            p.append(("search.baseline", "must give a value for every searched knob "
                                         f"({sorted(space)}): the config to beat, e.g. "
                                         "vLLM's defaults on this machine"))
        else:
            for name, v in baseline.items():
                if not any(v == x and type(v) is type(x) for x in space[name]):
                    p.append((f"search.baseline.{name}", f"{v!r} is not one of the values "
                                                         f"searched: {list(space[name])}"))
    confirm = raw.get("confirm")
    if confirm is not None and (not isinstance(confirm, int) or isinstance(confirm, bool)
                                or confirm < 2):
        p.append(("search.confirm", "must be an integer ≥ 2: repeats of the answer and the "
                                    "runner-up (one engine start each) before it is trusted"))
    if p:
        raise SearchSpecError(p)
    return SearchSpec(knobs=space, users=tuple(users), objective=objective, sampler=sampler,
                      confirm=confirm,
                      max_configs=max_configs,
                      max_minutes=float(max_minutes) if max_minutes is not None else None,
                      patience=patience, baseline=dict(baseline) if baseline else None,
                      min_gain=float(min_gain),
                      seed=seed, gain=float(gain), level=level)


def point_key(knobs: Mapping[str, Any], users: int) -> str:
    """One point of the space (an engine config at a load level) as a stable string."""
    return f"{sorted(knobs.items())!r}@{users}"


# -- the params sections `slo:` and `search:` ----------------------------------------------------

PAIRED = "slo and search go together: the bounds to meet and the space to search"


def _said(v: Checker, e: SearchSpecError) -> None:
    for key, msg in e.problems:
        v.err(key, msg)


class SloSection(Section[tuple[str, ...]]):
    """`slo:` — the bounds `tunebook tune` must meet, kept as written (the search parses them
    again), checked so a bad bound is an error before any engine starts."""

    key = "slo"
    default: tuple[str, ...] = ()

    def read(self, v: Checker, raw: Any) -> tuple[str, ...]:
        try:
            return tuple(str(b) for b in parse_slo(raw))
        except SearchSpecError as e:
            _said(v, e)
            return ()

    def dump(self, value: tuple[str, ...]) -> Any:
        return list(value)

    def cross_check(self, v: Checker, data: dict[str, Any], given: bool) -> None:
        if given != ("search" in data):
            v.err("search" if given else "slo", PAIRED)


class SearchSection(Section[dict[str, Any]]):
    """`search:` — the space `tunebook tune` searches, kept as written; its load levels default
    to the load's (users, or a trace's speeds), so it is checked once the load is parsed."""

    key = "search"
    default: dict[str, Any] = {}

    def read(self, v: Checker, raw: Any) -> dict[str, Any]:
        if isinstance(raw, dict) and raw:
            return dict(raw)
        try:  # not a mapping, or an empty one: what is wrong needs no load levels
            parse_search(raw)
        except SearchSpecError as e:
            _said(v, e)
        return {}

    def dump(self, value: dict[str, Any]) -> Any:
        return dict(value)

    def check_with_load(self, v: Checker, value: dict[str, Any], load: Any) -> None:
        if value:
            try:
                parse_search(value, *(load.search_levels() if load else ((), "users")))
            except SearchSpecError as e:
                _said(v, e)


SLO = SECTIONS.add(SloSection.key, SloSection())
SEARCH = SECTIONS.add(SearchSection.key, SearchSection())
