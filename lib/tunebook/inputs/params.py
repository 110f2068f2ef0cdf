"""Sweep definitions: `params/*.yaml` → a validated, frozen `SweepParams`.

Every problem is reported before any engine starts, as one `ParamsError` whose lines each
name the file and the dotted key. Engine knobs carry exactly the names vLLM gives them.

Layout of a params file (see params/quickstart.yaml for a commented example)::

    experiment: quickstart          # folder name under outputs/
    notebook: 00_quickstart         # which notebook renders it (a trace's: 30_traces)
    model: qwen3-tiny               # preset, local folder or hub id
    engine: {max_model_len: 1024}   # knobs shared by every engine config
    engine_grid:                    # one engine config per entry (list of overrides)
      - {}                          #   or a mapping of knob -> list (cartesian product)
      - {max_num_seqs: 4}
    engine_env: {VLLM_CPU_KVCACHE_SPACE: 1}
    load: {dataset: random, users: [1, 2, 4, 8], input_len: 128, output_len: 32}
    repeats: 1

An engine_grid entry ``{disaggregate: {connector, prefill: {knobs}, decode: {knobs}}}`` is a
prefill engine and a decode engine joined by a KV connector (Fig 6.2, tunebook.servers.disagg).

`load.users`, `load.request_rates` and `load.prefix_len` may each be a list: one load point per
combination. `load.reset_prefix_cache` (default true) empties the engine's prefix cache before
each load point, so no point is flattered by what an earlier one left cached; a figure that
studies the cache sets it false. `dataset: block_reuse` is Fig 3.3's probe (tunebook.measure.probe);
`code_edit`, `code_edit_rename`, `code_edit_verbatim` and `fresh_text` are Fig 4.2's prompt sets
(tunebook.models.prompts), where `input_len` caps each prompt's tokens.

`load` reads files with `StrictLoader`: plain YAML values only, no duplicate keys, and limits
on size, nesting and alias expansion, so a mistaken or hostile file fails in milliseconds.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tunebook.core import knobs
from tunebook.core.files import FOLDER_NAME
from tunebook.core.sections import SECTIONS, Section, type_name
from tunebook.inputs import (
    cost,  # noqa: F401 - the owners of params sections register them
    datasets,
    executor,  # noqa: F401 - (where engine configs run: executor)
    slo,  # noqa: F401 - (`tunebook tune`'s bounds and space: slo, search)
)
from tunebook.inputs.load import (
    DATASETS,
    WorkloadRef,
)
from tunebook.inputs.workloads.replay import Replay
from tunebook.models import layout  # noqa: F401 - (Fig 6.1's inputs: layout)
from tunebook.models import presets as models
from tunebook.servers import kinds as server_kinds
from tunebook.servers import launcher  # noqa: F401 - (the start method: fast_start)
from tunebook.servers.kinds import ENTRY_KINDS
from tunebook.servers.process import DEV_MODE_ENV

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
T = TypeVar("T")
# Keys that plan engines: a figures_only file has none of them.
ENGINE_KEYS = ("engine", "engine_grid", "engine_env", "load", "parts", "start_together",
               "repeats")
PART_KEYS = ("name", "engine_grid", "load", "figures", "run_timeout_s")


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
               "load": _load_dict(self.load), "figures": list(self.figures)}
        if self.run_timeout_s is not None:
            out["run_timeout_s"] = self.run_timeout_s
        return out


def _load_dict(load: LoadParams) -> dict[str, Any]:
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
        load = _load_dict(self.load)
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


# --------------------------------------------------------------------------------------------
# Loading


class _LoaderProblems(yaml.YAMLError):
    """StrictLoader's refusals, as (dotted key, message) pairs for ParamsError."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("; ".join(m for _, m in problems))
        self.problems = problems


_MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses what `safe_load` would silently accept.

    - a duplicate mapping key (PyYAML keeps the last value): reported with its dotted path;
    - nesting deeper than MAX_NESTING levels (the composer would hit Python's recursion limit);
    - aliases that expand to more than MAX_VALUES values ("billion laughs"), or that refer to
      themselves. The check walks the composed node graph once, so it costs no more than
      the file's own size however large the expansion would be.
    """

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                line = self.peek_event().start_mark.line + 1
                raise _LoaderProblems([("", f"YAML is nested more than {MAX_NESTING} levels "
                                            f"deep (line {line}); params need at most 6")])
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        problems: list[tuple[str, str]] = []
        self._walk(node, "", set(), {}, problems)
        if problems:
            raise _LoaderProblems(problems)
        return super().construct_document(node)

    def _key(self, node: Any) -> Any:
        if isinstance(node, yaml.ScalarNode):
            try:
                return self.construct_object(node)  # so `1` and `0x1` are the same key
            except yaml.YAMLError:
                pass
        return (node.tag, id(node))

    def _walk(self, node: Any, path: str, stack: set[int], sizes: dict[int, int],
              problems: list[tuple[str, str]]) -> int:
        """Number of values `node` expands to; records duplicate keys on the way."""
        nid = id(node)
        if nid in stack:
            raise _LoaderProblems([(path, "a YAML alias refers to a value that contains it "
                                          "(a recursive structure); params are plain trees")])
        if nid in sizes:  # an alias: already walked (and checked) where its anchor is
            return sizes[nid]
        stack.add(nid)
        size = 1
        if isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                size += self._walk(child, f"{path}[{i}]", stack, sizes, problems)
        elif isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                child = f"{path}.{name}" if path else str(name)
                if key_node.tag != _MERGE_TAG:
                    key = self._key(key_node)
                    line = key_node.start_mark.line + 1
                    if key in first_line:
                        problems.append((child, f"duplicate key (also on line "
                                                f"{first_line[key]}): YAML would silently keep "
                                                "only the last one; keep one"))
                    else:
                        first_line[key] = line
                size += self._walk(key_node, child, stack, sizes, problems)
                size += self._walk(value_node, child, stack, sizes, problems)
        stack.discard(nid)
        sizes[nid] = size
        if size > MAX_VALUES:
            where = f" at '{path}'" if path else ""
            raise _LoaderProblems([("", f"YAML aliases expand to over {MAX_VALUES:,} values"
                                        f"{where} (an alias bomb?); params need a few hundred")])
        return size


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepParams:
    """Read, override and validate a params file."""
    path = Path(path)
    source = str(path)
    return parse(_read(path, source), source=source, overrides=overrides)


def _read(path: Path, source: str) -> Any:
    """The file's YAML data; any problem with the file as a whole is a ParamsError."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ParamsError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ParamsError(source, [("", "is a folder; give a params .yaml file")]) from None
    except OSError as e:
        raise ParamsError(source, [("", f"cannot read: {e.strerror or e}")]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ParamsError(source, [("", f"file is too large (over {MAX_FILE_BYTES // 1024} KiB);"
                                        " a params file is a few KiB: narrow the sweep")])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            what = "is UTF-16 text, not UTF-8"
        else:
            line = raw[:e.start].count(b"\n") + 1
            what = f"is not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line})"
        raise ParamsError(source, [("", f"{what}; save it as UTF-8")]) from None
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader: plain values only
    except _LoaderProblems as e:
        raise ParamsError(source, e.problems) from None
    except yaml.YAMLError as e:
        raise ParamsError(source, [("", _yaml_error(e))]) from None


def _yaml_error(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None) or ""
    if isinstance(e, yaml.reader.ReaderError):  # control characters: not a text file
        return (f"YAML syntax error: {str(e).splitlines()[0]} (character {e.position + 1}); "
                "is this a text file?")
    if context.startswith("expected a single document"):
        return (f"YAML syntax error at {where}: a second YAML document ('---'); "
                "put one sweep per file")
    if isinstance(e, yaml.constructor.ConstructorError):
        return (f"YAML tag not allowed at {where}: {problem}; params hold plain values "
                "(strings, numbers, booleans, lists, mappings)")
    context = f" ({context})" if context else ""
    return f"YAML syntax error at {where}: {problem}{context}"


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> dict:
    """Set dotted keys (`load.users`) in a copy of the raw params mapping."""
    import copy

    data = copy.deepcopy(data)
    for dotted, value in (overrides or {}).items():
        parts = str(dotted).split(".")
        node = data
        for part in parts[:-1]:
            if not isinstance(node.get(part, {}), dict):
                raise ParamsError(source, [(dotted, f"cannot override inside '{part}'")])
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return data


def parse_override(text: str, key: str = "") -> Any:
    """A `-p key value` value: YAML, so `-p load.users [1,2]` gives a list. A value that is
    not YAML is bad params (source `-p`), not a traceback."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as e:
        raise ParamsError("-p", [(key, f"{text!r}: {_yaml_error(e)}")]) from None


def parse(data: Any, source: str = "<params>", overrides: dict | None = None) -> SweepParams:
    if data is None:
        raise ParamsError(source, [("", "file is empty: it needs at least experiment and model "
                                        "(see params/quickstart.yaml)")])
    if not isinstance(data, dict):
        raise ParamsError(source, [("", f"top level must be a mapping of keys (experiment: ..., "
                                        f"model: ...), got {type_name(data)}")])
    if overrides:
        data = apply_overrides(data, overrides, source)
    v = _Validator(source)
    v.unknown(data, TOP_KEYS, "")

    experiment = v.get(data, "experiment", str, required=True)
    if isinstance(experiment, str):
        if any(c in experiment for c in "/\\") or ".." in experiment:
            v.err("experiment", "is a folder name under outputs/, not a path: no '/', '\\' or "
                                f"'..'; got {_short(experiment)}")
        elif not EXPERIMENT_RE.fullmatch(experiment):
            v.err("experiment", "must be 1-64 letters, digits, '.', '_' or '-', starting with a "
                                f"letter or digit; got {_short(experiment)}")
    model = v.get(data, "model", str, required=True)
    if isinstance(model, str) and not model.strip():
        v.err("model", "must not be empty: a preset, a local folder or a hub id")
    notebook = v.get(data, "notebook", str, default=None)  # None: the load's (below)
    if isinstance(notebook, str) and not re.fullmatch(r"[A-Za-z0-9_-]+", notebook):
        v.err("notebook", "must be a notebook name under notebooks/ without .ipynb; "
                          f"got {_short(notebook)}")
    description = v.get(data, "description", str, default="")

    max_runs = v.number(data, "max_runs", int, DEFAULT_MAX_RUNS, lo=1)
    max_prompts = v.number(data, "max_prompts", int, DEFAULT_MAX_PROMPTS, lo=1)
    engine = v.get(data, "engine", dict, default={})
    for key in ENTRY_KINDS:
        if isinstance(engine, dict) and key in engine:
            v.err(f"engine.{key}", f"goes in an engine_grid entry (one entry = "
                                   f"{ENTRY_KINDS[key].entry_means}): engine_grid: "
                                   f"[{{}}, {{{key}: {{...}}}}]")
            engine = {k: x for k, x in engine.items() if k != key}
    engine = v.knobs(engine, "engine") if isinstance(engine, dict) else {}
    grid = _engine_grid(v, data.get("engine_grid", [{}]), max_runs)
    engine_env = _engine_env(v, v.get(data, "engine_env", dict, default={}))
    n0 = len(v.problems)
    load_params = _load(v, v.get(data, "load", dict, default={}))
    load_ok = load_params is not None and len(v.problems) == n0
    repeats = v.number(data, "repeats", int, 1, lo=1)
    startup_timeout_s = v.number(data, "startup_timeout_s", (int, float), 900.0, lo=1)
    run_timeout_s = v.number(data, "run_timeout_s", (int, float), 1800.0, lo=1)
    figures = _figures(v, v.get(data, "figures", list, default=[]))
    start_together = v.number(data, "start_together", int, 1, lo=1)
    together = start_together if isinstance(start_together, int) else 1
    figures_only = v.get(data, "figures_only", bool, default=False)
    if figures_only is True:
        for key in ENGINE_KEYS:
            if key in data:
                v.err(key, "figures_only: true plans no engine: remove this key (or "
                           "figures_only)")
    sections = {sec.key: sec.read(v, data[sec.key]) for sec in SECTIONS if sec.key in data}
    for sec in SECTIONS:
        sec.cross_check(v, data, sec.key in data)
        if sec.key in sections:  # rules that need the parsed load (the search's levels)
            sec.check_with_load(v, sections[sec.key], load_params)
    parts = _parts(v, data, model, engine, max_runs, repeats, max_prompts, figures, together)
    if isinstance(start_together, int) and start_together > 1:
        grids = [g for part in parts for g in part.engine_grid] if parts else grid
        _together_checks(v, start_together, [{**engine, **g} for g in grids])

    # Cross-field checks, on each engine config as it will run; a problem of the shared
    # `engine` knobs is reported once, under `engine`.
    if "model" in engine:
        v.err("engine.model", "set the model at the top level (model: ...); an engine_grid "
                              "entry {model: ...} swaps it for one engine config")
    base = _config_problems(engine, together)
    for sub, msg in base:
        v.err(f"engine.{sub}", msg)
    for i, override in enumerate(grid):
        for sub, msg in _config_problems({**engine, **override}, together):
            if (sub, msg) not in base:
                v.err(f"engine_grid[{i}].{sub}", msg)
    if "parts" not in data and figures_only is not True:  # parts: checked in _parts
        if load_ok and isinstance(model, str) and model.strip():
            _context_checks(v, model.strip(), engine, grid, load_params)
        if load_params is not None and isinstance(repeats, int) and isinstance(max_runs, int):
            factors = {"engine_grid": len(grid), "load.users": len(load_params.users),
                       "load.request_rates": len(load_params.request_rates),
                       "load.prefix_len": len(load_params.prefix_len), "repeats": repeats}
            n = math.prod(factors.values())
            if n > max_runs:
                prefixes = (f" x {len(load_params.prefix_len)} prefix lengths"
                            if len(load_params.prefix_len) > 1 else "")
                v.err(max(factors, key=lambda k: factors[k]),
                      f"the plan has {len(grid)} engine configs x {len(load_params.users)} "
                      f"users x {len(load_params.request_rates)} rates{prefixes} x {repeats} "
                      f"repeats = {n:,} runs, over max_runs={max_runs}; narrow it or raise "
                      "max_runs deliberately")
            elif load_ok and isinstance(max_prompts, int):
                _prompts_check(v, load_params, len(grid), repeats, max_prompts)
    v.raise_if_any()
    if notebook is None:  # a trace replayed on its clock has no users to draw against
        notebook = TRACE_NOTEBOOK if load_params is not None and load_params.timed \
            else DEFAULT_NOTEBOOK
    return SweepParams(
        experiment=experiment, model=model.strip(), notebook=notebook, description=description,
        engine=engine, engine_grid=tuple(grid), engine_env=engine_env, load=load_params,
        repeats=repeats, max_runs=max_runs, max_prompts=max_prompts,
        startup_timeout_s=float(startup_timeout_s), run_timeout_s=float(run_timeout_s),
        figures=figures, parts=parts, start_together=start_together,
        figures_only=figures_only is True, sections=sections, source=source,
    )


def _together_checks(v: _Validator, n: int, configs: list[dict[str, Any]]) -> None:
    """Engines that start together share one accelerator: each must fit beside the others.
    vLLM sizes its KV pool by profiling the GPU's memory use, which would count the other
    engines' allocations as its own; kv_cache_memory_bytes skips that profile. And each engine
    first checks that gpu_memory_utilization x the GPU's memory is free."""
    # a disaggregated pair is two engines: count (and check) each
    starts = sorted((len(server_kinds.engines(c)) for c in configs), reverse=True)
    configs = [k for c in configs for _, k in server_kinds.engines(c)]
    n += sum(k - 1 for k in starts[:n])
    if any("kv_cache_memory_bytes" not in c for c in configs):
        v.err("start_together", f"{n} engines starting together would profile GPU memory at "
                                "the same time and count each other's allocations; set "
                                "engine.kv_cache_memory_bytes (e.g. 4294967296 for 4 GiB) "
                                "so each skips the profile")
    util = max((float(u) for c in configs
                if isinstance(u := c.get("gpu_memory_utilization", 0.9), (int, float))
                and not isinstance(u, bool)), default=0.9)
    if n * util > 1.0:
        v.err("start_together", f"{n} engines x gpu_memory_utilization {util:g} = "
                                f"{n * util:.2f} of the GPU; each engine checks at start that "
                                "its share is free: set gpu_memory_utilization to at most "
                                f"{1.0 / n:.3f}")


def _parts(v: _Validator, data: dict, model: Any, engine: dict[str, Any], max_runs: Any,
           repeats: Any, max_prompts: Any, figures: tuple[str, ...],
           together: int = 1) -> tuple[Part, ...]:
    """`parts:` — each a name, an engine_grid and a load merged over the top-level load, all
    checked as a whole file would be; problems are named `parts[i].<key>`."""
    raw = data.get("parts")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        v.err("parts", f"must be a non-empty list of {{name, engine_grid, load}}, got "
                       f"{type_name(raw)} {_short(raw)}")
        return ()
    if "engine_grid" in data:
        v.err("engine_grid", "with parts, each part has its own engine_grid: move it there")
    top_load = data.get("load") if isinstance(data.get("load"), dict) else {}
    out, names, total_runs = [], {}, 0
    for i, item in enumerate(raw):
        key = f"parts[{i}]"
        if not isinstance(item, dict):
            v.err(key, f"must be a mapping with name, engine_grid and load, got {type_name(item)}")
            continue
        v.unknown(item, PART_KEYS, key)
        name = item.get("name")
        if not isinstance(name, str) or not EXPERIMENT_RE.fullmatch(name):
            v.err(f"{key}.name", "is required: 1-64 letters, digits, '.', '_' or '-', got "
                                 f"{_short(name)}")
            name = f"part{i}"
        elif name in names:
            v.err(f"{key}.name", f"duplicates parts[{names[name]}].name")
        names.setdefault(name, i)
        # the same checks as a file without parts, with this part's keys
        sub = _Validator(v.source)
        grid = _engine_grid(sub, item.get("engine_grid", [{}]), max_runs
                            if isinstance(max_runs, int) else DEFAULT_MAX_RUNS)
        load_raw = item.get("load", {})
        if not isinstance(load_raw, dict):
            sub.err("load", f"must be a mapping, got {type_name(load_raw)}")
            load_raw = {}
        # keys its dataset refuses (the probe's counts and warm-ups) that the shared load
        # sets are for other parts
        family = datasets.family_of({**top_load, **load_raw}.get("dataset"))
        refused = family.refuses if family else ()
        inherited = {k: v for k, v in top_load.items() if k not in refused}
        load = _load(sub, {**inherited, **load_raw})
        part_figs = _figures(sub, item.get("figures") or [])
        part_timeout = sub.number(item, "run_timeout_s", (int, float), None, lo=1)
        stray = [f for f in part_figs if figures and f not in figures]
        if stray:
            sub.err("figures", f"{', '.join(stray)} not in the file's figures: list them there")
        n0 = len(sub.problems)
        for j, override in enumerate(grid):
            for k, msg in _config_problems({**engine, **override}, together):
                sub.err(f"engine_grid[{j}].{k}", msg)
        if load is not None and len(sub.problems) == n0 and isinstance(model, str) \
                and model.strip():
            _context_checks(sub, model.strip(), engine, grid, load)
        if load is not None and isinstance(repeats, int) and isinstance(max_prompts, int):
            _prompts_check(sub, load, len(grid), repeats, max_prompts)
            total_runs += (len(grid) * len(load.users) * len(load.request_rates)
                           * len(load.prefix_len) * repeats)
        v.problems += [(f"{key}.{k}" if k else key, m) for k, m in sub.problems]
        if load is not None:
            out.append(Part(name, tuple(grid), load, part_figs,
                            None if part_timeout is None else float(part_timeout)))
    if isinstance(max_runs, int) and total_runs > max_runs:
        v.err("parts", f"the parts plan {total_runs:,} runs, over max_runs={max_runs}; narrow "
                       "them or raise max_runs deliberately")
    return tuple(out)


def _figures(v: _Validator, raw: list) -> tuple[str, ...]:
    """Figure ids such as '1.3', each one the manual has (tunebook.core.manual.FIGURES)."""
    if not raw:
        return ()
    if not all(isinstance(f, str | int | float) and not isinstance(f, bool) for f in raw):
        v.err("figures", "must be a list of figure numbers such as '1.3'")
        return ()
    from tunebook.core.manual import FIGURES  # late: the manual's tables import pandas (~1 s)

    out = []
    for i, f in enumerate(raw):
        fig = str(f)
        if fig not in FIGURES:
            v.err(f"figures[{i}]", f"unknown figure {fig!r}; the manual's figures are "
                                   f"{', '.join(FIGURES)}")
        out.append(fig)
    return tuple(out)


def _context_checks(v: _Validator, model: str, engine: dict[str, Any],
                    grid: list[dict[str, Any]], load: LoadParams) -> None:
    """Each request (prefix + input + output tokens, the longest prefix of the list; the probe's
    prompts are input_len long; a trace's longest request after scaling and caps) must fit the
    engine config's max_model_len or, when that is left to vLLM, the model's own context
    length (known offline for a preset or a local folder; a hub id is not checked)."""
    workload = load.workload()
    if workload is not None and not workload.timed:
        return  # prompts as text: vLLM's client measures them (sharegpt drops long ones)
    in_prompt = load.family is None or load.family.prefix_in_prompt
    prefix = max(load.prefix_len) if in_prompt else 0
    need = workload.longest[0][1] if workload is not None else \
        prefix + load.input_len + load.output_len
    too_long: dict[str, tuple[int, list[int]]] = {}  # what it exceeds -> (limit, configs)
    for i, merged in [(i, k) for i, g in enumerate(grid)
                      for _, k in server_kinds.engines({**engine, **g})]:
        mml = merged.get("max_model_len")
        if isinstance(mml, int):
            if need > mml:
                too_long.setdefault(f"max_model_len {mml}", (mml, []))[1].append(i)
            continue
        spec = merged.get("model", model)
        ctx = models.context_len(spec) if isinstance(spec, str) else None
        if ctx is not None and need > ctx:
            what = f"the context length of {spec} ({ctx:,} tokens, from its config.json)"
            too_long.setdefault(what, (ctx, []))[1].append(i)
    for what, (limit, configs) in too_long.items():
        which = "" if len(grid) == 1 else f" (engine config {', '.join(map(str, configs))})"
        fix = ("raise max_model_len" if what.startswith("max_model_len")
               else "pick a model with a longer context")
        if workload is not None:
            over = workload.too_long(limit)
            lines = ", ".join(f"line {n} ({t:,} tokens)" for n, t in over[:3])
            v.err("load.file", f"{workload.source}: {len(over):,} request(s), input + output "
                               f"after length_scale and caps, exceed {what}{which}: {lines}"
                               f"{' …' if len(over) > 3 else ''}; set max_input_len / "
                               f"max_output_len (or a smaller length_scale) or {fix}")
            continue
        what_len = ("prefix_len + input_len + output_len" if in_prompt
                    else "input_len + output_len")
        v.err("load.input_len", f"{what_len} = {need:,} exceeds "
                                f"{what}{which}: shorten the requests or {fix}")


def _prompts_check(v: _Validator, load: LoadParams, n_engines: int, repeats: int,
                   max_prompts: int) -> None:
    """The prompts a plan sends, over every run, warm-ups included, must stay under
    max_prompts. The key named is the one whose default (or smallest sensible value) would
    shrink the total most: the one that blew it up."""
    def total(ld: LoadParams, engines: int = n_engines, reps: int = repeats) -> int:
        return ld.prompts_sent() * engines * reps

    n = total(load)
    if n <= max_prompts:
        return
    d = LoadParams()
    shrunk = {
        "load.users": total(replace(load, users=(1,))),
        "load.num_prompts": total(replace(load, num_prompts=None)),
        "load.prompts_per_user": total(replace(load, prompts_per_user=d.prompts_per_user)),
        "load.min_prompts": total(replace(load, min_prompts=d.min_prompts)),
        "load.num_warmups": total(replace(load, num_warmups=d.num_warmups)),
        "load.request_rates": total(replace(load, request_rates=(None,))),
        "load.prefix_len": total(replace(load, prefix_len=(0,))),
        "engine_grid": total(load, engines=1),
        "repeats": total(load, reps=1),
    }
    key = min(shrunk, key=lambda k: shrunk[k])  # ties: the first listed (users, then counts)
    runs = n_engines * repeats * len(load.users) * len(load.request_rates) * len(load.prefix_len)
    largest = max(load.prompts(u) for u in load.users)
    v.err(key, f"the plan sends {n:,} prompts (num_prompts + num_warmups over {runs:,} run(s); "
               f"the largest run sends {largest:,}), over max_prompts={max_prompts:,}; "
               f"narrow {key} or raise max_prompts deliberately")


# --------------------------------------------------------------------------------------------
# Sections


def _engine_grid(v: _Validator, raw: Any, max_runs: int) -> list[dict[str, Any]]:
    if isinstance(raw, dict):  # knob -> list of values: the cartesian product
        if not raw:
            v.err("engine_grid", "is empty: give knob -> list of values, or a list of "
                                 "configs ({} = vLLM defaults)")
            return [{}]
        for key in ENTRY_KINDS:
            if key in raw:
                v.err(f"engine_grid.{key}", "is one engine config, not a knob to vary: write "
                                            f"engine_grid as a list, e.g. [{{}}, {{{key}: "
                                            "{...}}]")
                return [{}]
        knobs = v.knobs({k: None for k in raw}, "engine_grid", types=False)
        ok = len(knobs) == len(raw)
        for k in knobs:
            values = raw[k]
            if not isinstance(values, list) or not values:
                v.err(f"engine_grid.{k}", "must be a non-empty list of values (the cartesian "
                                          f"product is taken), got {_short(values)}")
                ok = False
                continue
            for j, x in enumerate(values):
                problem = _knob_problem(k, x)
                if problem:
                    v.err(f"engine_grid.{k}[{j}]", problem)
                    ok = False
            if len({repr(x) for x in values}) != len(values):
                v.err(f"engine_grid.{k}", "has duplicates")
                ok = False
        if not ok:
            return [{}]
        n = math.prod(len(raw[k]) for k in knobs)
        if n > max_runs:
            v.err("engine_grid", f"the cartesian product is {n:,} engine configs, over "
                                 f"max_runs={max_runs}; use fewer values per knob")
            return [{}]
        return [dict(combo) for combo in itertools.product(*([(k, x) for x in raw[k]]
                                                             for k in knobs))]
    if not isinstance(raw, list):
        v.err("engine_grid", f"must be a list of knob overrides or a mapping of knob -> list, "
                             f"got {type_name(raw)}")
        return [{}]
    if not raw:
        v.err("engine_grid", "is empty: give at least one engine config ({} = vLLM defaults)")
        return [{}]
    grid = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        item = {} if item is None else item
        if not isinstance(item, dict):
            v.err(f"engine_grid[{i}]", f"must be a mapping of knobs such as "
                                       f"{{max_num_seqs: 4}}, got {type_name(item)} {_short(item)}")
            continue
        n0 = len(v.problems)
        knobs = v.knobs({k: x for k, x in item.items() if k not in ENTRY_KINDS},
                        f"engine_grid[{i}]")
        for key, kind in ENTRY_KINDS.items():  # e.g. a prefill and a decode engine
            if key in item:
                spec = kind.check_entry(v, item[key], f"engine_grid[{i}].{key}")
                if spec is not None:
                    knobs[key] = spec
        key = repr(sorted(knobs.items()))
        if key in seen and len(v.problems) == n0:  # a dropped bad knob is no duplicate
            v.err(f"engine_grid[{i}]", f"duplicates engine_grid[{seen[key]}]: each entry must "
                                       "be a different engine config")
        seen.setdefault(key, i)
        grid.append(knobs)
    return grid or [{}]


def _engine_env(v: _Validator, raw: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    for k, val in (raw or {}).items() if isinstance(raw, dict) else []:
        key = f"engine_env.{k}"
        if isinstance(k, str) and SECRET_ENV_RE.search(k):
            v.err(key, "secrets never go in params; export them in the shell instead")
        elif k == DEV_MODE_ENV:
            v.err(key, "is set by tunebook, only for engines whose load points reset the "
                       "prefix cache (load.reset_prefix_cache); leave it out")
        elif not isinstance(k, str) or not ENV_NAME_RE.match(k):
            v.err(key, "only VLLM_* environment variables may be set here; set others in the "
                       "shell that runs tunebook")
        elif isinstance(val, bool) or not isinstance(val, str | int | float):
            v.err(key, f"must be a string or number (quote true/false: '1' or '0'), got "
                       f"{type_name(val)} {_short(val)}")
        else:
            env[k] = str(val)
    return env


def _load(v: _Validator, raw: Any) -> LoadParams | None:
    if not isinstance(raw, dict):
        return None
    n0 = len(v.problems)
    v.unknown(raw, LOAD_KEYS, "load")
    d = LoadParams()
    dataset = v.get(raw, "dataset", str, default=d.dataset, prefix="load")
    if isinstance(dataset, str) and dataset not in DATASETS:
        v.err("load.dataset", f"must be one of {DATASETS}, got {_short(dataset)}")
    # a load defaults to a small concurrency sweep, a family to its own (the probe: one user)
    family = datasets.family_of(dataset)
    default_users = family.default_users if family and family.default_users else d.users
    users = _int_list(v, raw.get("users", list(default_users)), "load.users")
    rates_raw = raw.get("request_rates", [None])
    rates: list[float | None] = []
    if not isinstance(rates_raw, list) or not rates_raw:
        v.err("load.request_rates", "must be a non-empty list of requests/s (null = all at "
                                    f"once), got {_short(rates_raw)}")
    else:
        for i, r in enumerate(rates_raw):
            if r is None or r == "inf":
                rates.append(None)
            elif isinstance(r, bool) or not isinstance(r, int | float) or not r > 0 \
                    or math.isinf(r) or math.isnan(r):
                v.err(f"load.request_rates[{i}]", "must be a positive number of requests/s or "
                                                  f"null (all at once), got {_short(r)}")
            else:
                rates.append(float(r))
    if len(set(rates)) != len(rates):
        v.err("load.request_rates", "has duplicates: each rate runs once per repeat")
    prefix_lens = _prefix_lens(v, raw.get("prefix_len", 0))
    lp = dict(
        input_len=v.number(raw, "input_len", int, d.input_len, lo=1, prefix="load"),
        output_len=v.number(raw, "output_len", int, d.output_len, lo=1, prefix="load"),
        num_prefixes=v.number(raw, "num_prefixes", int, d.num_prefixes, lo=1, prefix="load"),
        prompts_per_user=v.number(raw, "prompts_per_user", int, d.prompts_per_user, lo=1,
                                  prefix="load"),
        min_prompts=v.number(raw, "min_prompts", int, d.min_prompts, lo=1, prefix="load"),
        num_prompts=v.number(raw, "num_prompts", int, None, lo=1, prefix="load"),
        num_warmups=v.number(raw, "num_warmups", int, d.num_warmups, lo=0, prefix="load"),
        reset_prefix_cache=v.get(raw, "reset_prefix_cache", bool, default=d.reset_prefix_cache,
                                 prefix="load"),
        seed=v.number(raw, "seed", int, None, lo=0, prefix="load"),
        ignore_eos=v.get(raw, "ignore_eos", bool, default=d.ignore_eos, prefix="load"),
    )
    extra = datasets.Extra()
    if family is not None:
        extra = family.check(v, datasets.Draft(dataset, raw, users, rates, prefix_lens, lp))
        for other in datasets.FAMILIES:
            set_here = [k for k in other.own_keys if raw.get(k) is not None]
            if other is not family and set_here:
                v.err(f"load.{set_here[0]}", other.own_hint)
    goodput = _goodput(v, raw.get("goodput"))
    if len(v.problems) > n0:
        return LoadParams() if not users else LoadParams(users=tuple(users))
    return LoadParams(dataset=dataset, users=tuple(users), request_rates=tuple(rates),
                      prefix_len=tuple(prefix_lens), replay=extra.replay, speeds=extra.speeds,
                      goodput=goodput, **lp)


def _goodput(v: _Validator, raw: Any) -> dict[str, float]:
    """`goodput: {ttft_ms: 2000, tpot_ms: 100, e2el_ms: 20000}`: per-request bounds; a request
    is good when it meets every one (vLLM's --goodput)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        v.err("load.goodput", "must map ttft_ms / tpot_ms / e2el_ms to milliseconds, e.g. "
                              f"{{ttft_ms: 2000, tpot_ms: 100}}, got {_short(raw)}")
        return {}
    out = {}
    for k, x in raw.items():
        if k not in GOODPUT_KEYS:
            v.err(f"load.goodput.{k}", f"unknown bound{knobs.did_you_mean(str(k), GOODPUT_KEYS)}"
                                       f"; allowed: {', '.join(GOODPUT_KEYS)}")
        elif isinstance(x, bool) or not isinstance(x, int | float) or not x > 0 \
                or not math.isfinite(x):
            v.err(f"load.goodput.{k}", f"must be milliseconds > 0, got {_short(x)}")
        else:
            out[k] = float(x)
    return out


def _prefix_lens(v: _Validator, raw: Any) -> list[int]:
    """`prefix_len`: one number of tokens (>= 0), or a non-empty list of them (one load point
    each)."""
    values = raw if isinstance(raw, list) else [raw]
    if isinstance(raw, list) and not raw:
        v.err("load.prefix_len", "must be a number of tokens >= 0 or a non-empty list of them, "
                                 "got []")
        return []
    out = []
    for i, x in enumerate(values):
        key = f"load.prefix_len[{i}]" if isinstance(raw, list) else "load.prefix_len"
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            v.err(key, f"must be an integer >= 0 (tokens), got {type_name(x)} {_short(x)}")
        else:
            out.append(x)
    if len(set(out)) != len(out):
        dups = sorted({x for x in out if out.count(x) > 1})
        v.err("load.prefix_len", f"has duplicates ({_short(dups)}): list each value once")
    return out  # empty only when every entry was wrong (and said so)


def _int_list(v: _Validator, raw: Any, key: str) -> list[int]:
    if not isinstance(raw, list) or not raw:
        v.err(key, f"must be a non-empty list of positive integers such as [1, 2, 4, 8], got "
                   f"{type_name(raw)} {_short(raw)}")
        return []
    out = []
    for i, x in enumerate(raw):
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            v.err(f"{key}[{i}]", f"must be a positive integer, got {_short(x)}")
        else:
            out.append(x)
    if len(set(out)) != len(out):
        dups = sorted({x for x in out if out.count(x) > 1})
        v.err(key, f"has duplicates ({_short(dups)}): list each value once")
    return out


def _config_problems(cfg: dict[str, Any], together: int = 1) -> list[tuple[str, str]]:
    """What the server kind of a merged engine config refuses (tunebook.servers.kinds): its
    engines' cross-field rules, keys prefixed `disaggregate.<role>.` for a pair's roles."""
    return server_kinds.problems(cfg, together)


_short = knobs.short

def _knob_problem(k: str, val: Any) -> str | None:
    """What is wrong with engine knob `k` set to `val` (None = vLLM's default is fine)."""
    knob = knobs.KNOBS[k]
    if knob.accepts(val):
        return None
    return f"must be {knob.allowed}, got {type_name(val)} {_short(val)}"


class _Validator:
    """Collects (key, message) problems so one error reports them all."""

    def __init__(self, source: str):
        self.source = source
        self.problems: list[tuple[str, str]] = []

    def err(self, key: str, msg: str) -> None:
        self.problems.append((key, msg))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ParamsError(self.source, self.problems)

    def unknown(self, data: dict, allowed: Collection[str], prefix: str) -> None:
        for k in data:
            if k not in allowed:
                where = f"{prefix}.{k}" if prefix else str(k)
                self.err(where, f"unknown key{knobs.did_you_mean(k, allowed)}; "
                                f"allowed: {', '.join(allowed)}")

    def get(self, data: dict, key: str, typ: type, required: bool = False, default: Any = None,
            prefix: str = "") -> Any:
        where = f"{prefix}.{key}" if prefix else key
        if key not in data or data[key] is None:
            if required:
                self.err(where, "is required")
            return default
        val = data[key]
        if not isinstance(val, typ) or (typ is not bool and isinstance(val, bool)):
            hint = " (quote it)" if typ is str and isinstance(val, int | float | bool) else ""
            self.err(where, f"must be {type_name(typ())}{hint}, got {type_name(val)} {_short(val)}")
            return default
        return val

    def number(self, data: dict, key: str, typ: Any, default: Any, lo: float,
               prefix: str = "") -> Any:
        where = f"{prefix}.{key}" if prefix else key
        if key not in data or data[key] is None:
            return default
        val = data[key]
        want = "an integer" if typ is int else "a number"
        if isinstance(val, bool) or not isinstance(val, typ) \
                or (isinstance(val, float) and math.isnan(val)):
            self.err(where, f"must be {want} >= {lo:g}, got {type_name(val)} {_short(val)}")
            return default
        if val < lo:
            self.err(where, f"must be {want} >= {lo:g}, got {val!r}")
            return default
        return val

    def knobs(self, data: dict, prefix: str, types: bool = True) -> dict[str, Any]:
        self.unknown(data, knobs.KNOBS, prefix)
        out = {}
        for k, val in data.items():
            if k not in knobs.KNOBS:
                continue
            problem = _knob_problem(k, val) if types else None
            if problem:
                self.err(f"{prefix}.{k}", problem)
            else:
                out[k] = val
        return out
