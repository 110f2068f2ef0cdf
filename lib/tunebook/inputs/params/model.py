"""The params model: the keys a params file may hold and their limits, and the frozen
dataclasses a file becomes (SweepParams, its load, its parts), written back as YAML."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from tunebook.core.files import FOLDER_NAME
from tunebook.core.sections import SECTIONS, Section

# the owners of params sections register them when imported (tunebook.core.sections)
from tunebook.inputs import (  # noqa: F401
    cost,  # cost:
    datasets,  # (a load's family: used here)
    executor,  # executor: (where engine configs run)
    slo,  # slo:, search: (`tunebook tune`'s bounds and space)
)
from tunebook.inputs.load import WorkloadRef
from tunebook.inputs.workloads.replay import Replay
from tunebook.models import layout  # noqa: F401 - layout: (Fig 6.1's inputs)
from tunebook.servers import launcher  # noqa: F401 - fast_start: (the start method)

# The largest plan we accept without `max_runs` / `max_prompts` being raised explicitly: a typo
# such as users: [1..1000000] or users: [100000000] should fail here, not after a week of
# benchmarking. The shipped params send at most ~600 prompts; a big GPU sweep a few 10,000s.
DEFAULT_MAX_RUNS = 500
DEFAULT_MAX_PROMPTS = 100_000
# the notebook that renders a sweep, unless its params name one: a trace replayed on its own
# clock (load.dataset: file, a timed format) is drawn against replay speed, not users
DEFAULT_NOTEBOOK, TRACE_NOTEBOOK = "00_quickstart", "30_traces"

# A params file is a few KiB; these limits stop runaway or hostile files before they cost time.
MAX_FILE_BYTES = 64 * 1024
MAX_NESTING = 20  # YAML levels; real params use at most 6
MAX_VALUES = 100_000  # values once YAML aliases are expanded (the "billion laughs" guard)
MAX_PROBLEMS = 20  # problems listed in one ParamsError; the rest are counted

EXPERIMENT_RE = FOLDER_NAME  # an experiment is a folder under outputs/
ENV_NAME_RE = re.compile(r"^VLLM_[A-Z0-9_]+$")
# Environment variables that could carry secrets never go through params.
SECRET_ENV_RE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)

# DATASETS (tunebook.inputs.load): random, random_prefix, prefix_repetition and PROMPT_DATASETS
# (vLLM's client), file, block_reuse; each family of them checks its own keys and rules
# (tunebook.inputs.datasets).
# Engine knobs, their types and allowed values: tunebook.core.knobs (one table).

LOAD_KEYS = (
    "dataset", "users", "request_rates", "input_len", "output_len", "prefix_len",
    "num_prefixes", "prompts_per_user", "min_prompts", "num_prompts", "num_warmups",
    "reset_prefix_cache", "seed", "ignore_eos",
    *datasets.OWN_KEYS,  # a family's own (dataset: file's: tunebook.inputs.datasets)
    "goodput",
)
# vLLM's --goodput names: per-request bounds in ms (TPOT per request, not every ITL gap)
GOODPUT_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}
TOP_KEYS = (
    "experiment", "notebook", "model", "description", "engine", "engine_grid", "engine_env",
    "load", "repeats", "max_runs", "max_prompts", "startup_timeout_s", "run_timeout_s", "figures",
    "parts", "start_together", "figures_only",
    *SECTIONS.names(),
)
# Keys that plan engines: a figures_only file has none of them.
ENGINE_KEYS = ("engine", "engine_grid", "engine_env", "load", "parts", "start_together",
               "repeats")
PART_KEYS = ("name", "engine_grid", "load", "figures", "run_timeout_s")

T = TypeVar("T")


class ParamsError(ValueError):
    """Bad params: every line names the file and the dotted key."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: {key}: {msg}" if key else f"{source}: {msg}"
                 for key, msg in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            lines.append(f"{source}: ... and {len(problems) - MAX_PROBLEMS} more problems")
        super().__init__("invalid params\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class LoadParams:
    dataset: str = "random"
    users: tuple[int, ...] = (1, 2, 4, 8)  # vLLM --max-concurrency values
    request_rates: tuple[float | None, ...] = (None,)  # req/s; None = all at once
    input_len: int = 128
    output_len: int = 32
    # shared prefix tokens (random_prefix, prefix_repetition; block_reuse: tokens the second
    # prompt shares with the first); several values = one load point each
    prefix_len: tuple[int, ...] = (0,)
    num_prefixes: int = 1  # distinct prefixes (prefix_repetition)
    prompts_per_user: int = 4  # num_prompts = max(min_prompts, users * prompts_per_user)
    min_prompts: int = 4
    num_prompts: int | None = None  # fixed count; overrides prompts_per_user
    num_warmups: int = 1
    reset_prefix_cache: bool = True  # POST /reset_prefix_cache before each load point
    seed: int | None = None  # dataset seed of every run; None = a fresh one per run
    # True: every request writes output_len tokens (fixed lengths, as the manual's runs); a
    # real model's answers end at their EOS with false (chapter 4)
    ignore_eos: bool = True
    replay: Replay | None = None  # dataset: file — which file, what of it, how scaled
    speeds: tuple[float, ...] = (1.0,)  # a timed file: replay speeds (× the trace's own rate)
    goodput: dict[str, float] = field(default_factory=dict)  # GOODPUT_KEYS -> ms

    @property
    def timed(self) -> bool:
        """A trace replayed on its own clock: the speeds are the load axis, not users."""
        return self.replay is not None and datasets.workload(self.replay).timed

    def search_levels(self) -> tuple[tuple[float, ...], str]:
        """The load levels a search bisects, and what they are (`tunebook tune`'s LEVELS):
        a trace's replay speeds, else concurrent users."""
        if self.timed:
            return self.speeds, "speed"
        return tuple(self.users), "users"

    def at_level(self, level: float) -> LoadParams:
        """This load at one level of a search: one replay speed, or one number of users."""
        if self.timed:
            return replace(self, speeds=(float(level),))
        return replace(self, users=(int(level),))

    def workload(self) -> WorkloadRef | None:
        """The prepared workload file (read once per process and file state)."""
        return None if self.replay is None else datasets.workload(self.replay)

    def goodput_arg(self) -> str | None:
        """vLLM's --goodput value, e.g. 'ttft:2000 tpot:100'."""
        return " ".join(f"{GOODPUT_KEYS[k]}:{v:g}" for k, v in self.goodput.items()) or None

    @property
    def family(self) -> datasets.Family | None:
        return datasets.family_of(self.dataset)

    def prompts(self, users: int) -> int:
        """Measured prompts of the load point at ``users`` concurrent users."""
        if self.family is not None and self.family.prompts_per_point is not None:
            return self.family.prompts_per_point
        if self.replay is not None and self.timed:  # (replay: for the type checker)
            return datasets.workload(self.replay).requests
        return self.num_prompts or max(self.min_prompts, users * self.prompts_per_user)

    def warmups(self) -> int:
        # a replay's warm-ups (its first request, num_warmups times) end before vLLM's client
        # starts the trace's clock: they warm the engine without shifting an arrival
        return self.num_warmups if self.family is None or self.family.warms_up else 0

    def prompts_sent(self) -> int:
        """Prompts one pass over ``users`` x ``request_rates`` x ``prefix_len`` sends, warm-ups
        included (a replay: one pass per speed)."""
        if self.timed:
            return (self.prompts(0) + self.warmups()) * len(self.speeds)
        per_rate = sum(self.prompts(u) + self.warmups() for u in self.users)
        return per_rate * len(self.request_rates) * len(self.prefix_len)


@dataclass(frozen=True)
class Part:
    """One load shape of an experiment with the engine configs that run it (a chapter needs
    several: a concurrency sweep, a shared-prefix sweep, a request rate). Engine configs that
    several parts share start once."""

    name: str
    engine_grid: tuple[dict[str, Any], ...]
    load: LoadParams
    figures: tuple[str, ...] = ()  # the figures drawn from this part's rows (empty: any)
    # this part's load points time out after this many seconds (None: the file's run_timeout_s);
    # chapter 7 induces a timed-out run with a short one
    run_timeout_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "engine_grid": [dict(g) for g in self.engine_grid],
               "load": load_dict(self.load), "figures": list(self.figures)}
        if self.run_timeout_s is not None:
            out["run_timeout_s"] = self.run_timeout_s
        return out


def load_dict(load: LoadParams) -> dict[str, Any]:
    """The load as params YAML: the shared keys but those its dataset's family refuses (the
    block-reuse probe's counts), then what the family adds (a workload file's keys)."""
    family = load.family
    skip = family.refuses if family else ()
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in load.__dict__.items()
           if k not in (*skip, "replay", "speeds", "goodput")}
    if len(load.prefix_len) == 1:  # a scalar stays a scalar (the panel edits it as one)
        out["prefix_len"] = load.prefix_len[0]
    if family is not None:
        out.update(family.dump(datasets.Extra(load.replay, load.speeds)))
    if load.goodput:
        out["goodput"] = dict(load.goodput)
    return out


@dataclass(frozen=True)
class SweepParams:
    experiment: str
    model: str
    notebook: str = DEFAULT_NOTEBOOK
    description: str = ""
    engine: dict[str, Any] = field(default_factory=dict)
    engine_grid: tuple[dict[str, Any], ...] = ({},)
    engine_env: dict[str, str] = field(default_factory=dict)
    load: LoadParams = field(default_factory=LoadParams)
    repeats: int = 1
    max_runs: int = DEFAULT_MAX_RUNS
    max_prompts: int = DEFAULT_MAX_PROMPTS
    startup_timeout_s: float = 900.0
    run_timeout_s: float = 1800.0
    figures: tuple[str, ...] = ()
    parts: tuple[Part, ...] = ()  # several load shapes; empty: engine_grid × load
    # Engine configs started at once, then measured one at a time (tunebook.measure.sweep).
    start_together: int = 1
    # True: the figures need no engine (chapter 6's layout helper): nothing is planned
    figures_only: bool = False
    # the sections their mechanisms own (tunebook.core.sections): key -> value, set ones only
    sections: dict[str, Any] = field(default_factory=dict)
    source: str = "<params>"

    def section(self, sec: Section[T]) -> T:
        """The value of a registered section (its default when the file leaves it out)."""
        return self.sections.get(sec.key, sec.default)

    def all_parts(self) -> tuple[Part, ...]:
        """The parts, or the one implicit part (engine_grid × load) of a file without any;
        none for a figures_only file."""
        if self.figures_only:
            return ()
        return self.parts or (Part("", self.engine_grid, self.load, self.figures),)

    def run_timeout_for(self, part: str) -> float:
        """The run timeout of the load points of part ``part`` (its own, else the file's)."""
        own = next((p.run_timeout_s for p in self.parts if p.name == part), None)
        return self.run_timeout_s if own is None else own

    def to_dict(self) -> dict[str, Any]:
        """The params as plain YAML-able data (round-trips through `parse`)."""
        load = load_dict(self.load)
        out = {
            "experiment": self.experiment,
            "notebook": self.notebook,
            "model": self.model,
            "description": self.description,
            "engine": dict(self.engine),
            "engine_grid": [dict(g) for g in self.engine_grid],
            "engine_env": dict(self.engine_env),
            "load": load,
            "repeats": self.repeats,
            "max_runs": self.max_runs,
            "max_prompts": self.max_prompts,
            "startup_timeout_s": self.startup_timeout_s,
            "run_timeout_s": self.run_timeout_s,
            "figures": list(self.figures),
        }
        if self.start_together != 1:
            out["start_together"] = self.start_together
        if self.figures_only:
            out = {k: v for k, v in out.items() if k not in ENGINE_KEYS}
            out["figures_only"] = True
        if self.parts:
            del out["engine_grid"]
            out["parts"] = [part.to_dict() for part in self.parts]
        for key, value in self.sections.items():
            out[key] = SECTIONS.get(key).dump(value)
        return out
