"""What `engine:`, `engine_grid:` and `engine_env:` may say: knobs checked against vLLM's
parser (tunebook.core.knobs), what each server kind refuses, and whether a load's requests
fit each config's context."""

from __future__ import annotations

import itertools
import math
from typing import Any

from tunebook.core.knobs import short
from tunebook.core.sections import type_name
from tunebook.inputs.params.model import (
    ENV_NAME_RE,
    SECRET_ENV_RE,
    LoadParams,
)
from tunebook.inputs.params.validator import (
    Validator,
    knob_problem,
)
from tunebook.models import presets as models
from tunebook.servers import kinds as server_kinds
from tunebook.servers.kinds import ENTRY_KINDS
from tunebook.servers.process import DEV_MODE_ENV


def read_engine_grid(v: Validator, raw: Any, max_runs: int) -> list[dict[str, Any]]:
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
                                          f"product is taken), got {short(values)}")
                ok = False
                continue
            for j, x in enumerate(values):
                problem = knob_problem(k, x)
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
                                       f"{{max_num_seqs: 4}}, got {type_name(item)} {short(item)}")
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


def read_engine_env(v: Validator, raw: Any) -> dict[str, str]:
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
                       f"{type_name(val)} {short(val)}")
        else:
            env[k] = str(val)
    return env


def config_problems(cfg: dict[str, Any], together: int = 1) -> list[tuple[str, str]]:
    """What the server kind of a merged engine config refuses (tunebook.servers.kinds): its
    engines' cross-field rules, keys prefixed `disaggregate.<role>.` for a pair's roles."""
    return server_kinds.problems(cfg, together)


def together_checks(v: Validator, n: int, configs: list[dict[str, Any]]) -> None:
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


def context_checks(v: Validator, model: str, engine: dict[str, Any],
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
