"""A peer engine beside vLLM: SGLang, started, watched and loaded like vLLM (issue 17).

`engine_kind: sglang` (an engine knob: in `engine:` or one `engine_grid` entry) starts SGLang's
OpenAI-compatible server (`python -m sglang.launch_server`) instead of vLLM's, on the same
loopback port scheme, API key, process group and kept log; vLLM's own benchmark client loads
both through the same OpenAI completions endpoint, so every metric means the same.

The knobs keep vLLM's names (they are tunebook's column names). This module says, once, how each
maps onto SGLang's flags, and why the ones that do not map are refused: params refuses them
before any engine starts (`problems`), never by a start that fails a minute later.

Nothing here imports SGLang: tunebook only starts it as a server process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebook.core.knobs import SGLANG as SGLANG
from tunebook.core.knobs import VLLM as VLLM
from tunebook.core.knobs import engine_kind as kind_of  # noqa: F401 - ch05 and tests read it here
from tunebook.servers.base import HOST, SERVED_NAME
from tunebook.servers.process import RESET_BUSY, RESET_FAILED, RESET_OK, ProcessServer
from tunebook.servers.sglang_launch import (
    KEY_ENV as KEY_ENV,  # the shim pops it: one name, both sides
)
from tunebook.servers.startup import (
    Diagnosis,
    FailedStart,
    StartupFacts,
    get_rule,
    rule,
    strip_ansi,
)

SGLANG_MODULE = "sglang.launch_server"
# The server is started through this shim, which hands it the API key from the environment
# (SGLang takes the key only as --api-key: a command line every user can read).
LAUNCHER = "tunebook.servers.sglang_launch"


# Folders put first on the SGLang server's PYTHONPATH only (the device's SGLang bundle pins
# transformers, tokenizers, openai … differently from the vLLM bundle tunebook itself runs on):
# scripts/h200_run.sh sets it to /root/sglsite when scripts/sglang_bundle.sh's parts are staged.
PATH_ENV = "TUNEBOOK_SGLANG_PYTHONPATH"


def installed(kind: str) -> bool:
    """Whether this Python can start that engine: its package is importable here, or (SGLang)
    found in the folders of PATH_ENV."""
    if importlib.util.find_spec(kind) is not None:
        return True
    extra = os.environ.get(PATH_ENV, "") if kind == SGLANG else ""
    return any((Path(d) / kind / "__init__.py").is_file() for d in extra.split(os.pathsep) if d)


class EngineNotInstalledError(ValueError):
    """A config asks for an engine this Python cannot start (said before any engine starts)."""


def require_installed(configs: list[Mapping[str, Any]]) -> None:
    """Raise EngineNotInstalledError when a config's peer engine is not importable here (vLLM
    itself is not checked: a missing vLLM fails its start with its own diagnosis, as always)."""
    missing = sorted({kind_of(k) for k in configs
                      if kind_of(k) != VLLM and not installed(kind_of(k))})
    if missing:
        raise EngineNotInstalledError(
            f"engine_kind {', '.join(missing)}: not installed in this Python "
            f"({sys.executable}). SGLang needs a GPU and its bundle (scripts/sglang_bundle.sh; "
            "there is no SGLang for CPUs): run these configs there, or drop them here")


@dataclass(frozen=True)
class FlagMap:
    """How one vLLM knob becomes SGLang flags: `flag` takes the value as is, or `render`
    turns a value into flags ([] for SGLang's default). `values`: the vLLM values it accepts
    (empty: all params accepts); `note`: where the meaning differs, said once."""

    flag: str | None = None
    render: Callable[[Any], list[str]] | None = None
    values: tuple[Any, ...] = ()
    note: str = ""

    def argv(self, value: Any) -> list[str]:
        if value is None:
            return []
        if self.render is not None:
            return self.render(value)
        return [self.flag or "", str(value)]


def _switch(flag: str, when: bool) -> Callable[[Any], list[str]]:
    """A vLLM boolean that SGLang expresses as one `--disable-…` flag."""
    return lambda v: [flag] if bool(v) is when else []


_KV_DTYPES = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
              "bfloat16": "bf16"}
_ATTENTION = {"FLASH_ATTN": "fa3", "TRITON_ATTN": "triton", "FLASHINFER": "flashinfer"}

SGLANG_FLAGS: Mapping[str, FlagMap] = {
    "max_num_seqs": FlagMap("--max-running-requests",
                             note="requests the scheduler runs at once"),
    "max_num_batched_tokens": FlagMap(
        render=lambda v: ["--chunked-prefill-size", str(v), "--max-prefill-tokens", str(v)],
        note="vLLM's per-step token budget; SGLang's closest are the prefill chunk size and "
             "the prefill batch budget (both set; its decode batches have no token budget)"),
    "max_model_len": FlagMap("--context-length"),
    "gpu_memory_utilization": FlagMap(
        "--mem-fraction-static",
        note="SGLang's fraction is of the memory free at start and covers the weights and the "
             "KV pool only (activations and CUDA graphs come out of the rest); vLLM's is of "
             "the total, for everything: the same number leaves a different pool"),
    "tensor_parallel_size": FlagMap("--tp-size"),
    "pipeline_parallel_size": FlagMap("--pp-size"),
    "block_size": FlagMap("--page-size", note="tokens per KV page"),
    "seed": FlagMap("--random-seed"),
    "dtype": FlagMap("--dtype", values=("auto", "bfloat16", "float16", "float32", "half",
                                         "float")),
    "kv_cache_dtype": FlagMap(render=lambda v: ["--kv-cache-dtype", _KV_DTYPES[v]],
                               values=tuple(_KV_DTYPES)),
    "quantization": FlagMap("--quantization",
                             values=("fp8", "awq", "gptq", "compressed-tensors", "modelopt",
                                     "mxfp4")),
    "enforce_eager": FlagMap(render=lambda v: ["--cuda-graph-backend-decode", "disabled",
                                               "--cuda-graph-backend-prefill", "disabled"]
                             if v else []),
    "enable_prefix_caching": FlagMap(render=_switch("--disable-radix-cache", False),
                                      note="SGLang's prefix cache is its radix cache"),
    "enable_chunked_prefill": FlagMap(render=lambda v: [] if v else
                                       ["--chunked-prefill-size", "-1"]),
    "attention_backend": FlagMap(render=lambda v: ["--attention-backend", _ATTENTION[v]],
                                  values=tuple(_ATTENTION)),
}

# vLLM knobs with no SGLang equivalent, and why: refused before anything starts.
REFUSED: Mapping[str, str] = {
    "kv_cache_memory_bytes": "SGLang sizes its KV pool by --mem-fraction-static (or "
                             "--max-total-tokens, in tokens), not in bytes: use "
                             "gpu_memory_utilization",
    "speculative_config": "SGLang's speculative decoding has its own flags and methods "
                          "(--speculative-algorithm EAGLE/NGRAM …); tunebook does not map "
                          "vLLM's speculative_config onto them",
    "compilation_config": "vLLM's torch.compile / CUDA-graph settings; SGLang has no such "
                          "mapping (enforce_eager maps to --disable-cuda-graph)",
    "async_scheduling": "a vLLM scheduler option; SGLang overlaps scheduling by default "
                        "(--disable-overlap-schedule turns it off), which is not the same knob",
    "enable_logging_iteration_details": "vLLM's per-step log line (Fig 8.2)",
    "scheduler_cls": "a vLLM Scheduler subclass (Fig 8.3)",
    "vllm": "which vLLM release serves a vLLM engine (tunebook.servers.versions)",
    "kv_transfer_config": "vLLM's KV connector (Fig 6.2)",
}
# Not engine flags (tunebook's own, or handled by the engine's start): never mapped.
_NOT_FLAGS = ("engine_kind", "model")


def problems(knobs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(knob, message) for every knob an SGLang config cannot take; [] for a vLLM config."""
    if kind_of(knobs) != SGLANG:
        return []
    out = []
    for name, value in knobs.items():
        if value is None or name in _NOT_FLAGS:
            continue
        if name in REFUSED:
            out.append((name, f"has no SGLang equivalent: {REFUSED[name]}"))
        elif name not in SGLANG_FLAGS:
            out.append((name, "has no SGLang mapping in tunebook.servers.sglang (add one there, or "
                              "refuse it with a reason)"))
        elif SGLANG_FLAGS[name].values and value not in SGLANG_FLAGS[name].values:
            out.append((name, f"{value!r} has no SGLang equivalent; SGLang takes one of "
                              f"{SGLANG_FLAGS[name].values}"))
    return out


def sglang_flags(knobs: Mapping[str, Any]) -> list[str]:
    """SGLang flags for a config's knobs (call `problems` first: a refused knob raises)."""
    bad = problems({**knobs, "engine_kind": SGLANG})
    if bad:
        raise ValueError("; ".join(f"{k} {m}" for k, m in bad))
    out: list[str] = []
    for name, value in knobs.items():
        if name in _NOT_FLAGS:
            continue
        out += SGLANG_FLAGS[name].argv(value)
    return out


def sglang_argv(python: str, model_path: str, tokenizer: str | None, load_format: str,
                served_name: str, host: str, port: int, knobs: Mapping[str, Any],
                metrics: bool = True) -> list[str]:
    """The SGLang server's command line, through tunebook's launcher shim. The API key is not
    in it (a command line is visible to every user of the machine, and tunebook stores its
    engines' argv): tunebook.servers.vllm puts it in KEY_ENV, and the shim hands it to SGLang."""
    argv = [python, "-m", LAUNCHER, "--model-path", model_path,
            "--served-model-name", served_name, "--host", host, "--port", str(port),
            "--log-level", "info"]
    if tokenizer and tokenizer != model_path:
        argv += ["--tokenizer-path", tokenizer]
    if load_format != "auto":
        argv += ["--load-format", load_format]
    if metrics:  # /metrics: the running/waiting gauges the sampler reads
        argv += ["--enable-metrics"]
    return argv + sglang_flags(knobs)


def serve_command(model: str, knobs: Mapping[str, Any]) -> str:
    """The command a person would type to start this SGLang config by hand: its launcher
    with the mapped flags (tunebook.servers.kinds asks each kind for its own)."""
    return " ".join(["python -m", SGLANG_MODULE, "--model-path", model, *sglang_flags(knobs)])


class SGLangServer(ProcessServer):
    """One SGLang server, started through tunebook's launcher shim (which hands it the key)."""

    kind = SGLANG
    server_module = LAUNCHER
    reset_path = "/flush_cache"
    process_titles = ("sglang::",)  # sglang::scheduler, sglang::detokenizer

    def build_argv(self, port: int) -> list[str]:
        return sglang_argv(self.python, self.model.path_or_id, self.model.tokenizer,
                           self.model.load_format, SERVED_NAME, HOST, port, self.knobs)

    def parse_facts(self, log: str) -> StartupFacts:
        return parse_startup(log)

    def kind_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The key for the shim, and this tunebook's package on the path (the shim is ours),
        after the folders of PATH_ENV."""
        lib = str(Path(__file__).resolve().parents[2])
        return {KEY_ENV: self.api_key, "PYTHONPATH": os.pathsep.join(
            x for x in (env.get(PATH_ENV), lib, env.get("PYTHONPATH")) if x)}

    def reset_answer(self, status: int, text: str) -> tuple[str, str]:
        """SGLang answers HTTP 400 while requests run: busy, asked again."""
        if status == 400:
            return RESET_BUSY, f"the engine answered {text} (requests still running)"
        if status != 200:
            return RESET_FAILED, f"HTTP {status}: {text}"
        return RESET_OK, text or "HTTP 200"


# --- SGLang's start-up log (the facts of Fig 1.1 in the row's same columns) ------------------
# Format strings of SGLang 0.5.17 (python/sglang/srt/: model_executor/model_runner.py "Load
# weight end. elapsed=…, type=…, avail mem=… GB, mem usage=… GB."; mem_cache/memory_pool.py
# "KV Cache is allocated. dtype: …, #tokens: N, K size: … GB, V size: … GB"; managers/
# scheduler.py "max_total_num_tokens=…, …, context_len=…"; cuda_graph_setup.py "Capture target
# {prefill,decode} CUDA graph end. elapsed=… s, mem usage=… GB, …"; entrypoints/engine.py
# "server_args=ServerArgs(…, attention_backend='fa3', …)"). "GB" there is GiB (bytes / 2**30).
# SGLang logs no version: the line is tunebook's own, printed by the launcher shim.
VERSION_LINE = "tunebook: sglang "
_N = r"([\d,]+(?:\.\d+)?)"
_SGLANG_FACTS: dict[str, list[re.Pattern[str]]] = {
    "sglang_version": [re.compile(re.escape(VERSION_LINE) + r"(\S+)")],
    "attention_backend": [re.compile(r"attention_backend='([\w-]+)'"),
                          re.compile(r"[Uu]sing (\w+) attention backend")],
    "weights_gib": [re.compile(r"Load weight end\..*?mem usage=" + _N + r" ?GB")],
    "kv_pool_tokens": [re.compile(r"KV Cache is allocated\..*?#tokens: " + _N),
                       re.compile(r"max_total_num_tokens=" + _N)],
    "k_gib": [re.compile(r"KV Cache is allocated\..*?K size: " + _N + r" ?GB")],
    "v_gib": [re.compile(r"KV Cache is allocated\..*?V size: " + _N + r" ?GB")],
    "context_len": [re.compile(r"context_len=" + _N)],
}
# One line per graph SGLang captures (prefill, then decode): their memory adds up.
_GRAPH_END = re.compile(r"Capture .*?CUDA graph end\..*?mem usage=" + _N + r" ?GB", re.I)


def _first(log: str, patterns: list[re.Pattern[str]]) -> str | None:
    for pat in patterns:
        m = pat.search(log)
        if m:
            return m.group(1)
    return None


def parse_startup(log: str) -> StartupFacts:
    """SGLang's start-up facts in tunebook's columns: weights, KV pool (tokens and GiB, K + V),
    CUDA graph memory, attention backend, version; a line that is missing gives None."""
    log = strip_ansi(log)
    raw = {k: _first(log, pats) for k, pats in _SGLANG_FACTS.items()}

    def num(key: str) -> float | None:
        v = raw.get(key)
        return float(v.replace(",", "")) if v is not None else None

    pool, ctx = num("kv_pool_tokens"), num("context_len")
    k, v = num("k_gib"), num("v_gib")
    return StartupFacts(
        sglang_version=raw["sglang_version"], attention_backend=raw["attention_backend"],
        weights_gib=num("weights_gib"),
        kv_cache_gib=round(k + v, 2) if k is not None and v is not None else None,
        kv_pool_tokens=int(pool) if pool is not None else None,
        max_concurrency_x=round(pool / ctx, 2) if pool and ctx else None,
        cuda_graph_gib=round(sum(float(x) for x in _GRAPH_END.findall(log)), 2)
        if _GRAPH_END.search(log) else None)


# --- why an SGLang start failed: rows of tunebook.servers.startup's table (SGLang 0.5.17's
# wording) ---
_RAISE_ABOVE = re.compile(r"Raise --mem-fraction-static above ([\d.]+)")
_CTX = re.compile(r"context_length \((\d+)\) is greater than the derived context_length "
                  r"\((\d+)\)")


@rule("sglang_kv_memory", r"Not enough memory\. Please try to increase --mem-fraction-static",
      r"leave no GPU memory for the KV cache under --mem-fraction-static",
      symptom="SGLang: no memory left for the KV pool after the weights",
      setting="gpu_memory_utilization",
      computes="the floor SGLang printed + 0.05 (its --mem-fraction-static), at most 0.95; "
               "without it: now + 0.05", first=True)
def _sglang_kv_memory(line: str | None, start: FailedStart) -> Diagnosis:
    m = _RAISE_ABOVE.search("\n".join(start.lines))
    now = start.knobs.get("gpu_memory_utilization")
    value = round(min(0.95, float(m.group(1)) + 0.05 if m else (now or 0.85) + 0.05), 2)
    return Diagnosis(get_rule("sglang_kv_memory").symptom, line,
                     f"raise gpu_memory_utilization (SGLang's --mem-fraction-static) to {value}",
                     "gpu_memory_utilization", value)


@rule("sglang_context_length", r"context_length \(\d+\) is greater than the derived",
      symptom="SGLang: max_model_len beyond the model's context length",
      setting="max_model_len", computes="the model's context length SGLang printed",
      first=True)
def _sglang_context_length(line: str | None, start: FailedStart) -> Diagnosis:
    m = _CTX.search(line or "")
    value = int(m.group(2)) if m else None
    return Diagnosis(get_rule("sglang_context_length").symptom, line,
                     f"set max_model_len: {value} (the model's own)" if value else
                     "lower max_model_len to the model's context length", "max_model_len", value)


@rule("sglang_cuda_graph", r"Capture cuda graph failed", r"Fail when using backend: .* for "
      r"prefill runner", symptom="SGLang: capturing CUDA graphs failed (memory)",
      setting="gpu_memory_utilization", computes="now − 0.1 (SGLang's first suggestion)",
      first=True)
def _sglang_cuda_graph(line: str | None, start: FailedStart) -> Diagnosis:
    now = start.knobs.get("gpu_memory_utilization")
    value = round(max(0.5, (now or 0.9) - 0.1), 2)
    return Diagnosis(get_rule("sglang_cuda_graph").symptom, line,
                     f"lower gpu_memory_utilization (SGLang's --mem-fraction-static) to {value}, "
                     "or enforce_eager: true (no graphs, much slower)", "gpu_memory_utilization",
                     value)


def mapping_table() -> list[dict[str, str]]:
    """Every vLLM knob and what SGLang makes of it (docs, the notebook's peer section)."""
    rows = [{"knob": k, "sglang": m.flag or "(rendered)", "note": m.note}
            for k, m in SGLANG_FLAGS.items()]
    rows += [{"knob": k, "sglang": "refused", "note": why} for k, why in REFUSED.items()]
    return rows
