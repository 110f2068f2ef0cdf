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

The package: `model` (the keys and the dataclasses), `reader` (the strict YAML reader and the
overrides), `validator`, `engines` and `loads` (what those parts of a file may say), `parse`
(the file, in order). Import from here."""

from __future__ import annotations

from tunebook.inputs.params.model import (
    DEFAULT_MAX_PROMPTS,
    DEFAULT_MAX_RUNS,
    DEFAULT_NOTEBOOK,
    ENGINE_KEYS,
    ENV_NAME_RE,
    EXPERIMENT_RE,
    GOODPUT_KEYS,
    LOAD_KEYS,
    MAX_FILE_BYTES,
    MAX_NESTING,
    MAX_PROBLEMS,
    MAX_VALUES,
    PART_KEYS,
    SECRET_ENV_RE,
    TOP_KEYS,
    TRACE_NOTEBOOK,
    LoadParams,
    ParamsError,
    Part,
    SweepParams,
)
from tunebook.inputs.params.parse import (
    load,
    parse,
)
from tunebook.inputs.params.reader import (
    StrictLoader,
    apply_overrides,
    parse_override,
)

__all__ = [
    "DEFAULT_MAX_PROMPTS",
    "DEFAULT_MAX_RUNS",
    "DEFAULT_NOTEBOOK",
    "ENGINE_KEYS",
    "ENV_NAME_RE",
    "EXPERIMENT_RE",
    "GOODPUT_KEYS",
    "LOAD_KEYS",
    "LoadParams",
    "MAX_FILE_BYTES",
    "MAX_NESTING",
    "MAX_PROBLEMS",
    "MAX_VALUES",
    "PART_KEYS",
    "ParamsError",
    "Part",
    "SECRET_ENV_RE",
    "StrictLoader",
    "SweepParams",
    "TOP_KEYS",
    "TRACE_NOTEBOOK",
    "apply_overrides",
    "load",
    "parse",
    "parse_override",
]
