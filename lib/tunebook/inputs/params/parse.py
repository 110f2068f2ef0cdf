"""A params file into SweepParams: the top-level keys, the parts, then each part of the file
checked by its owner (the engine configs, the load, the registered sections)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from tunebook.core.knobs import short
from tunebook.core.sections import SECTIONS, type_name
from tunebook.inputs import datasets
from tunebook.inputs.params.engines import (
    config_problems,
    context_checks,
    read_engine_env,
    read_engine_grid,
    together_checks,
)
from tunebook.inputs.params.loads import (
    prompts_check,
    read_load,
)
from tunebook.inputs.params.model import (
    DEFAULT_MAX_PROMPTS,
    DEFAULT_MAX_RUNS,
    DEFAULT_NOTEBOOK,
    ENGINE_KEYS,
    EXPERIMENT_RE,
    PART_KEYS,
    TOP_KEYS,
    TRACE_NOTEBOOK,
    ParamsError,
    Part,
    SweepParams,
)
from tunebook.inputs.params.reader import (
    apply_overrides,
    read_yaml,
)
from tunebook.inputs.params.validator import (
    Validator,
)
from tunebook.servers.kinds import ENTRY_KINDS


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> SweepParams:
    """Read, override and validate a params file."""
    path = Path(path)
    source = str(path)
    return parse(read_yaml(path, source), source=source, overrides=overrides)


def parse(data: Any, source: str = "<params>", overrides: dict | None = None) -> SweepParams:
    if data is None:
        raise ParamsError(source, [("", "file is empty: it needs at least experiment and model "
                                        "(see params/quickstart.yaml)")])
    if not isinstance(data, dict):
        raise ParamsError(source, [("", f"top level must be a mapping of keys (experiment: ..., "
                                        f"model: ...), got {type_name(data)}")])
    if overrides:
        data = apply_overrides(data, overrides, source)
    v = Validator(source)
    v.unknown(data, TOP_KEYS, "")

    experiment = v.get(data, "experiment", str, required=True)
    if isinstance(experiment, str):
        if any(c in experiment for c in "/\\") or ".." in experiment:
            v.err("experiment", "is a folder name under outputs/, not a path: no '/', '\\' or "
                                f"'..'; got {short(experiment)}")
        elif not EXPERIMENT_RE.fullmatch(experiment):
            v.err("experiment", "must be 1-64 letters, digits, '.', '_' or '-', starting with a "
                                f"letter or digit; got {short(experiment)}")
    model = v.get(data, "model", str, required=True)
    if isinstance(model, str) and not model.strip():
        v.err("model", "must not be empty: a preset, a local folder or a hub id")
    notebook = v.get(data, "notebook", str, default=None)  # None: the load's (below)
    if isinstance(notebook, str) and not re.fullmatch(r"[A-Za-z0-9_-]+", notebook):
        v.err("notebook", "must be a notebook name under notebooks/ without .ipynb; "
                          f"got {short(notebook)}")
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
    grid = read_engine_grid(v, data.get("engine_grid", [{}]), max_runs)
    engine_env = read_engine_env(v, v.get(data, "engine_env", dict, default={}))
    n0 = len(v.problems)
    load_params = read_load(v, v.get(data, "load", dict, default={}))
    load_ok = load_params is not None and len(v.problems) == n0
    repeats = v.number(data, "repeats", int, 1, lo=1)
    startup_timeout_s = v.number(data, "startup_timeout_s", (int, float), 900.0, lo=1)
    run_timeout_s = v.number(data, "run_timeout_s", (int, float), 1800.0, lo=1)
    figures = read_figures(v, v.get(data, "figures", list, default=[]))
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
    parts = read_parts(v, data, model, engine, max_runs, repeats, max_prompts, figures, together)
    if isinstance(start_together, int) and start_together > 1:
        grids = [g for part in parts for g in part.engine_grid] if parts else grid
        together_checks(v, start_together, [{**engine, **g} for g in grids])

    # Cross-field checks, on each engine config as it will run; a problem of the shared
    # `engine` knobs is reported once, under `engine`.
    if "model" in engine:
        v.err("engine.model", "set the model at the top level (model: ...); an engine_grid "
                              "entry {model: ...} swaps it for one engine config")
    base = config_problems(engine, together)
    for sub, msg in base:
        v.err(f"engine.{sub}", msg)
    for i, override in enumerate(grid):
        for sub, msg in config_problems({**engine, **override}, together):
            if (sub, msg) not in base:
                v.err(f"engine_grid[{i}].{sub}", msg)
    if "parts" not in data and figures_only is not True:  # parts: checked in read_parts
        if load_ok and isinstance(model, str) and model.strip():
            context_checks(v, model.strip(), engine, grid, load_params)
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
                prompts_check(v, load_params, len(grid), repeats, max_prompts)
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


def read_parts(v: Validator, data: dict, model: Any, engine: dict[str, Any], max_runs: Any,
           repeats: Any, max_prompts: Any, figures: tuple[str, ...],
           together: int = 1) -> tuple[Part, ...]:
    """`parts:` — each a name, an engine_grid and a load merged over the top-level load, all
    checked as a whole file would be; problems are named `parts[i].<key>`."""
    raw = data.get("parts")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        v.err("parts", f"must be a non-empty list of {{name, engine_grid, load}}, got "
                       f"{type_name(raw)} {short(raw)}")
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
                                 f"{short(name)}")
            name = f"part{i}"
        elif name in names:
            v.err(f"{key}.name", f"duplicates parts[{names[name]}].name")
        names.setdefault(name, i)
        # the same checks as a file without parts, with this part's keys
        sub = Validator(v.source)
        grid = read_engine_grid(sub, item.get("engine_grid", [{}]), max_runs
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
        load = read_load(sub, {**inherited, **load_raw})
        part_figs = read_figures(sub, item.get("figures") or [])
        part_timeout = sub.number(item, "run_timeout_s", (int, float), None, lo=1)
        stray = [f for f in part_figs if figures and f not in figures]
        if stray:
            sub.err("figures", f"{', '.join(stray)} not in the file's figures: list them there")
        n0 = len(sub.problems)
        for j, override in enumerate(grid):
            for k, msg in config_problems({**engine, **override}, together):
                sub.err(f"engine_grid[{j}].{k}", msg)
        if load is not None and len(sub.problems) == n0 and isinstance(model, str) \
                and model.strip():
            context_checks(sub, model.strip(), engine, grid, load)
        if load is not None and isinstance(repeats, int) and isinstance(max_prompts, int):
            prompts_check(sub, load, len(grid), repeats, max_prompts)
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


def read_figures(v: Validator, raw: list) -> tuple[str, ...]:
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
