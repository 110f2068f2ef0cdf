"""Sweep definitions: `params/*.yaml` → a validated, frozen `SweepParams`.

Every problem is reported before any engine starts, as one `ParamsError` whose lines each
name the file and the dotted key. Engine knobs carry exactly the names vLLM gives them.

Layout of a params file (see params/quickstart.yaml for a commented example)::

    experiment: quickstart          # folder name under outputs/
    notebook: 00_quickstart         # which notebook renders it
    model: qwen3-tiny               # preset, local folder or hub id
    engine: {max_model_len: 1024}   # knobs shared by every engine config
    engine_grid:                    # one engine config per entry (list of overrides)
      - {}                          #   or a mapping of knob -> list (cartesian product)
      - {max_num_seqs: 4}
    engine_env: {VLLM_CPU_KVCACHE_SPACE: 1}
    load: {dataset: random, users: [1, 2, 4, 8], input_len: 128, output_len: 32}
    repeats: 1
"""

from __future__ import annotations

import difflib
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# The largest plan we accept without `max_runs` being raised explicitly: a typo such as
# users: [1..1000000] should fail here, not after a week of benchmarking.
DEFAULT_MAX_RUNS = 500

EXPERIMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME_RE = re.compile(r"^VLLM_[A-Z0-9_]+$")
# Environment variables that could carry secrets never go through params.
SECRET_ENV_RE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)

KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
QUANTIZATIONS = ("fp8", "awq", "gptq", "bitsandbytes", "compressed-tensors", "modelopt", "mxfp4")
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
SPEC_METHODS = ("ngram", "eagle", "eagle3", "medusa", "mtp", "draft_model", "suffix")
DATASETS = ("random", "random_prefix", "prefix_repetition")

# knob -> (python type(s), check, what is allowed). Names are vLLM's own.
_POS_INT = (int, lambda v: v > 0, "a positive integer")
_FRACTION = ((int, float), lambda v: 0 < v <= 1, "a number in (0, 1]")
_BOOL = (bool, None, "true or false")
_DICT = (dict, None, "a mapping")
ENGINE_KNOBS: dict[str, tuple[Any, Any, str]] = {
    "max_num_seqs": _POS_INT,
    "max_num_batched_tokens": _POS_INT,
    "max_model_len": _POS_INT,
    "gpu_memory_utilization": _FRACTION,
    "kv_cache_memory_bytes": _POS_INT,
    "block_size": _POS_INT,
    "tensor_parallel_size": _POS_INT,
    "pipeline_parallel_size": _POS_INT,
    "seed": (int, lambda v: v >= 0, "a non-negative integer"),
    "dtype": (str, lambda v: v in DTYPES, f"one of {DTYPES}"),
    "quantization": (str, lambda v: v in QUANTIZATIONS, f"one of {QUANTIZATIONS}"),
    "kv_cache_dtype": (str, lambda v: v in KV_CACHE_DTYPES, f"one of {KV_CACHE_DTYPES}"),
    "enforce_eager": _BOOL,
    "enable_prefix_caching": _BOOL,
    "enable_chunked_prefill": _BOOL,
    "async_scheduling": _BOOL,
    "speculative_config": _DICT,
    "compilation_config": _DICT,
    "attention_backend": (str, lambda v: bool(re.fullmatch(r"[A-Z0-9_]+", v)), "e.g. FLASH_ATTN"),
}

# Knobs with these types are rendered as vLLM flags by tunebook.engine.
LOAD_KEYS = (
    "dataset", "users", "request_rates", "input_len", "output_len", "prefix_len",
    "num_prefixes", "prompts_per_user", "min_prompts", "num_prompts", "num_warmups",
)
TOP_KEYS = (
    "experiment", "notebook", "model", "description", "engine", "engine_grid", "engine_env",
    "load", "repeats", "max_runs", "startup_timeout_s", "run_timeout_s", "figures",
)


class ParamsError(ValueError):
    """Bad params: every line names the file and the dotted key."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: {key}: {msg}" if key else f"{source}: {msg}" for key, msg in problems]
        super().__init__("invalid params\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class LoadParams:
    dataset: str = "random"
    users: tuple[int, ...] = (1, 2, 4, 8)  # vLLM --max-concurrency values
    request_rates: tuple[float | None, ...] = (None,)  # req/s; None = all at once
    input_len: int = 128
    output_len: int = 32
    prefix_len: int = 0  # shared prefix (random_prefix, prefix_repetition)
    num_prefixes: int = 1  # distinct prefixes (prefix_repetition)
    prompts_per_user: int = 4  # num_prompts = max(min_prompts, users * prompts_per_user)
    min_prompts: int = 4
    num_prompts: int | None = None  # fixed count; overrides prompts_per_user
    num_warmups: int = 1


@dataclass(frozen=True)
class SweepParams:
    experiment: str
    model: str
    notebook: str = "00_quickstart"
    description: str = ""
    engine: dict[str, Any] = field(default_factory=dict)
    engine_grid: tuple[dict[str, Any], ...] = ({},)
    engine_env: dict[str, str] = field(default_factory=dict)
    load: LoadParams = field(default_factory=LoadParams)
    repeats: int = 1
    max_runs: int = DEFAULT_MAX_RUNS
    startup_timeout_s: float = 900.0
    run_timeout_s: float = 1800.0
    figures: tuple[str, ...] = ()
    source: str = "<params>"

    def to_dict(self) -> dict[str, Any]:
        """The params as plain YAML-able data (round-trips through `parse`)."""
        load = {k: list(v) if isinstance(v, tuple) else v for k, v in self.load.__dict__.items()}
        return {
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
            "startup_timeout_s": self.startup_timeout_s,
            "run_timeout_s": self.run_timeout_s,
            "figures": list(self.figures),
        }


# --------------------------------------------------------------------------------------------
# Loading


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepParams:
    """Read, override and validate a params file."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsError(source, [("", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ParamsError(source, [("", f"cannot read: {e}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ParamsError(source, [("", f"YAML syntax error at {where}{problem}")]) from None
    return parse(data, source=source, overrides=overrides)


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


def parse_override(text: str) -> Any:
    """A `-p key value` value: YAML, so `-p load.users [1,2]` gives a list."""
    return yaml.safe_load(text)


def parse(data: Any, source: str = "<params>", overrides: dict | None = None) -> SweepParams:
    if data is None:
        raise ParamsError(source, [("", "file is empty")])
    if not isinstance(data, dict):
        raise ParamsError(source, [("", f"top level must be a mapping, got {_tname(data)}")])
    if overrides:
        data = apply_overrides(data, overrides, source)
    v = _Validator(source)
    v.unknown(data, TOP_KEYS, "")

    experiment = v.get(data, "experiment", str, required=True)
    if isinstance(experiment, str) and not EXPERIMENT_RE.match(experiment):
        v.err("experiment", "must be 1-64 letters, digits, '.', '_' or '-' (no '/', no '..'), "
                            f"starting with a letter or digit; got {experiment!r}")
    if isinstance(experiment, str) and ".." in experiment:
        v.err("experiment", f"must not contain '..'; got {experiment!r}")
    model = v.get(data, "model", str, required=True)
    if isinstance(model, str) and not model.strip():
        v.err("model", "must not be empty")
    notebook = v.get(data, "notebook", str, default="00_quickstart")
    if isinstance(notebook, str) and not re.fullmatch(r"[A-Za-z0-9_-]+", notebook):
        v.err("notebook", "must be a notebook name under notebooks/ without .ipynb; "
                          f"got {notebook!r}")
    description = v.get(data, "description", str, default="")

    engine = v.get(data, "engine", dict, default={})
    engine = v.knobs(engine, "engine") if isinstance(engine, dict) else {}
    grid = _engine_grid(v, data.get("engine_grid", [{}]))
    engine_env = _engine_env(v, v.get(data, "engine_env", dict, default={}))
    load_params = _load(v, v.get(data, "load", dict, default={}))
    repeats = v.number(data, "repeats", int, 1, lo=1)
    max_runs = v.number(data, "max_runs", int, DEFAULT_MAX_RUNS, lo=1)
    startup_timeout_s = v.number(data, "startup_timeout_s", (int, float), 900.0, lo=1)
    run_timeout_s = v.number(data, "run_timeout_s", (int, float), 1800.0, lo=1)
    figures = v.get(data, "figures", list, default=[])
    if isinstance(figures, list) and not all(isinstance(f, str | int | float) for f in figures):
        v.err("figures", "must be a list of figure numbers such as '1.3'")

    # Cross-field checks, on each engine config as it will run.
    for i, override in enumerate(grid):
        merged = {**engine, **override}
        _check_engine(v, merged, f"engine_grid[{i}]" if len(grid) > 1 else "engine")
        mml = merged.get("max_model_len")
        if isinstance(mml, int) and load_params is not None:
            need = load_params.prefix_len + load_params.input_len + load_params.output_len
            if need > mml:
                v.err("load.input_len", f"prefix_len + input_len + output_len = {need} exceeds "
                                        f"max_model_len {mml} of engine config {i}")
    if load_params is not None and isinstance(repeats, int) and isinstance(max_runs, int):
        n = len(grid) * len(load_params.users) * len(load_params.request_rates) * repeats
        if n > max_runs:
            v.err("load.users", f"the plan has {n:,} runs, over max_runs={max_runs}; narrow the "
                                "grid or raise max_runs deliberately")
    v.raise_if_any()
    return SweepParams(
        experiment=experiment, model=model.strip(), notebook=notebook, description=description,
        engine=engine, engine_grid=tuple(grid), engine_env=engine_env, load=load_params,
        repeats=repeats, max_runs=max_runs, startup_timeout_s=float(startup_timeout_s),
        run_timeout_s=float(run_timeout_s), figures=tuple(str(f) for f in figures), source=source,
    )


# --------------------------------------------------------------------------------------------
# Sections


def _engine_grid(v: _Validator, raw: Any) -> list[dict[str, Any]]:
    if isinstance(raw, dict):  # knob -> list of values: the cartesian product
        knobs = v.knobs({k: None for k in raw}, "engine_grid", types=False)
        axes = []
        for k in knobs:
            values = raw[k]
            if not isinstance(values, list) or not values:
                v.err(f"engine_grid.{k}", "must be a non-empty list of values")
                return [{}]
            axes.append([(k, x) for x in values])
        grid = [dict(combo) for combo in itertools.product(*axes)]
        for i, g in enumerate(grid):
            v.knobs(g, f"engine_grid[{i}]")
        return grid or [{}]
    if not isinstance(raw, list):
        v.err("engine_grid", f"must be a list of knob overrides or a mapping of knob -> list, "
                             f"got {_tname(raw)}")
        return [{}]
    if not raw:
        v.err("engine_grid", "is empty: give at least one engine config ({} = vLLM defaults)")
        return [{}]
    grid = []
    for i, item in enumerate(raw):
        item = {} if item is None else item
        if not isinstance(item, dict):
            v.err(f"engine_grid[{i}]", f"must be a mapping of knobs, got {_tname(item)}")
            continue
        grid.append(v.knobs(item, f"engine_grid[{i}]"))
    seen: dict[str, int] = {}
    for i, g in enumerate(grid):
        key = repr(sorted(g.items()))
        if key in seen:
            v.err(f"engine_grid[{i}]", f"duplicates engine_grid[{seen[key]}]")
        seen[key] = i
    return grid or [{}]


def _engine_env(v: _Validator, raw: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    for k, val in (raw or {}).items() if isinstance(raw, dict) else []:
        key = f"engine_env.{k}"
        if not isinstance(k, str) or not ENV_NAME_RE.match(k):
            v.err(key, "only VLLM_* environment variables may be set here")
        elif SECRET_ENV_RE.search(k):
            v.err(key, "secrets never go in params; export them in the shell instead")
        elif isinstance(val, bool) or not isinstance(val, str | int | float):
            v.err(key, f"must be a string or number, got {_tname(val)}")
        else:
            env[k] = str(val)
    return env


def _load(v: _Validator, raw: Any) -> LoadParams | None:
    if not isinstance(raw, dict):
        return None
    v.unknown(raw, LOAD_KEYS, "load")
    d = LoadParams()
    dataset = v.get(raw, "dataset", str, default=d.dataset, prefix="load")
    if isinstance(dataset, str) and dataset not in DATASETS:
        v.err("load.dataset", f"must be one of {DATASETS}, got {dataset!r}")
    users = _int_list(v, raw.get("users", list(d.users)), "load.users")
    rates_raw = raw.get("request_rates", [None])
    rates: list[float | None] = []
    if not isinstance(rates_raw, list) or not rates_raw:
        v.err("load.request_rates", "must be a non-empty list of requests/s (null = all at once)")
    else:
        for i, r in enumerate(rates_raw):
            if r is None or r == "inf":
                rates.append(None)
            elif isinstance(r, bool) or not isinstance(r, int | float) or not r > 0 \
                    or math.isinf(r) or math.isnan(r):
                v.err(f"load.request_rates[{i}]", f"must be a positive number or null, got {r!r}")
            else:
                rates.append(float(r))
    if len(set(rates)) != len(rates):
        v.err("load.request_rates", "has duplicates")
    lp = dict(
        input_len=v.number(raw, "input_len", int, d.input_len, lo=1, prefix="load"),
        output_len=v.number(raw, "output_len", int, d.output_len, lo=1, prefix="load"),
        prefix_len=v.number(raw, "prefix_len", int, d.prefix_len, lo=0, prefix="load"),
        num_prefixes=v.number(raw, "num_prefixes", int, d.num_prefixes, lo=1, prefix="load"),
        prompts_per_user=v.number(raw, "prompts_per_user", int, d.prompts_per_user, lo=1,
                                  prefix="load"),
        min_prompts=v.number(raw, "min_prompts", int, d.min_prompts, lo=1, prefix="load"),
        num_prompts=v.number(raw, "num_prompts", int, None, lo=1, prefix="load"),
        num_warmups=v.number(raw, "num_warmups", int, d.num_warmups, lo=0, prefix="load"),
    )
    if dataset in ("random_prefix", "prefix_repetition") and lp["prefix_len"] == 0:
        v.err("load.prefix_len", f"dataset {dataset!r} needs prefix_len > 0")
    if dataset == "random" and isinstance(lp["prefix_len"], int) and lp["prefix_len"] > 0:
        v.err("load.prefix_len", "is only used by random_prefix / prefix_repetition; "
                                 "set dataset: random_prefix")
    if v.problems:
        return LoadParams() if not users else LoadParams(users=tuple(users))
    return LoadParams(dataset=dataset, users=tuple(users), request_rates=tuple(rates), **lp)


def _int_list(v: _Validator, raw: Any, key: str) -> list[int]:
    if not isinstance(raw, list) or not raw:
        v.err(key, f"must be a non-empty list of positive integers, got {raw!r}"[:200])
        return []
    out = []
    for i, x in enumerate(raw):
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            v.err(f"{key}[{i}]", f"must be a positive integer, got {x!r}")
        else:
            out.append(x)
    if len(set(out)) != len(out):
        v.err(key, "has duplicates")
    return out


def _check_engine(v: _Validator, knobs: dict[str, Any], key: str) -> None:
    """Cross-field rules vLLM would otherwise only report after a minute of start-up."""
    spec = knobs.get("speculative_config")
    if isinstance(spec, dict):
        method = spec.get("method")
        if method not in SPEC_METHODS:
            v.err(f"{key}.speculative_config.method", f"must be one of {SPEC_METHODS}, "
                                                      f"got {method!r}")
        n = spec.get("num_speculative_tokens")
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            v.err(f"{key}.speculative_config.num_speculative_tokens",
                  f"must be a positive integer, got {n!r}")
        if method in ("eagle", "eagle3", "medusa", "draft_model") and not spec.get("model"):
            v.err(f"{key}.speculative_config.model", f"method {method!r} needs a draft model")
    mnbt, mml = knobs.get("max_num_batched_tokens"), knobs.get("max_model_len")
    if knobs.get("enable_chunked_prefill") is False and isinstance(mnbt, int) \
            and isinstance(mml, int) and mnbt < mml:
        v.err(f"{key}.max_num_batched_tokens",
              f"{mnbt} < max_model_len {mml} with chunked prefill off: vLLM refuses this")
    if "gpu_memory_utilization" in knobs and "kv_cache_memory_bytes" in knobs:
        v.err(f"{key}.kv_cache_memory_bytes", "conflicts with gpu_memory_utilization: "
                                              "vLLM sizes the KV cache by one or the other")


# --------------------------------------------------------------------------------------------


def _tname(x: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            type(None): "nothing (null)"}.get(type(x), type(x).__name__)


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

    def unknown(self, data: dict, allowed: tuple[str, ...] | dict, prefix: str) -> None:
        for k in data:
            if k not in allowed:
                near = difflib.get_close_matches(str(k), list(allowed), n=1)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                where = f"{prefix}.{k}" if prefix else str(k)
                self.err(where, f"unknown key{hint}; allowed: {', '.join(allowed)}")

    def get(self, data: dict, key: str, typ: type, required: bool = False, default: Any = None,
            prefix: str = "") -> Any:
        where = f"{prefix}.{key}" if prefix else key
        if key not in data or data[key] is None:
            if required:
                self.err(where, "is required")
            return default
        val = data[key]
        if not isinstance(val, typ) or (typ is not bool and isinstance(val, bool)):
            self.err(where, f"must be {_tname(typ())}, got {_tname(val)} ({val!r})"[:200])
            return default
        return val

    def number(self, data: dict, key: str, typ: Any, default: Any, lo: float,
               prefix: str = "") -> Any:
        where = f"{prefix}.{key}" if prefix else key
        if key not in data or data[key] is None:
            return default
        val = data[key]
        if isinstance(val, bool) or not isinstance(val, typ):
            want = "an integer" if typ is int else "a number"
            self.err(where, f"must be {want}, got {_tname(val)} ({val!r})"[:200])
            return default
        if val < lo:
            self.err(where, f"must be >= {lo:g}, got {val!r}")
            return default
        return val

    def knobs(self, data: dict, prefix: str, types: bool = True) -> dict[str, Any]:
        self.unknown(data, ENGINE_KNOBS, prefix)
        out = {}
        for k, val in data.items():
            if k not in ENGINE_KNOBS:
                continue
            if not types or val is None:  # None = leave vLLM's default
                out[k] = val
                continue
            typ, check, allowed = ENGINE_KNOBS[k]
            bad_bool = isinstance(val, bool) and typ is not bool
            if bad_bool or not isinstance(val, typ) or (check is not None and not check(val)):
                self.err(f"{prefix}.{k}", f"must be {allowed}, got {val!r}"[:200])
            else:
                out[k] = val
        return out
