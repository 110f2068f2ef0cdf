"""Load points: what one run sends a server — dataset, users, request rate, lengths, prompts —
with a stable identity for its run id, the dataset seed of each run, and the arguments of
vLLM's benchmark client that send it (`bench_argv`). A new load kind is a dataset here, its
family's keys and rules in tunebook.inputs.datasets, and how it is sent in tunebook.measure.loads
(vLLM's client runs whatever arguments it is given).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tunebook.core import config
from tunebook.inputs.workloads import replay as workload_replay
from tunebook.models import prompts
from tunebook.models.prompts import PROMPT_SETS

# The block-reuse probe of Fig 3.3 (tunebook.measure.probe): two requests per point, not a load.
BLOCK_REUSE = "block_reuse"
# Fig 4.2's prompt sets (tunebook.models.prompts): vLLM `custom` datasets built from the stdlib.
PROMPT_DATASETS = tuple(PROMPT_SETS)
# A workload file (tunebook.inputs.workloads): a trace replayed on its own clock, or prompts
FILE = "file"
# vLLM's client sends these
BENCH_DATASETS = ("random", "random_prefix", "prefix_repetition", *PROMPT_DATASETS, FILE)
DATASETS = (*BENCH_DATASETS, BLOCK_REUSE)

# Fields added to LoadPoint after runs were stored. At these values a field is left out of the
# run id (tunebook.inputs.plan), so every run stored before it existed keeps its id and still
# resumes
# as done; any other value makes a different run.
_ID_NEUTRAL: dict[str, Any] = {"reset_prefix_cache": True, "seed": None, "ignore_eos": True,
                               "workload": None, "replay_speed": None, "goodput": None}
# How a run is judged, not what it sends: in the row, never in the run id.
_NOT_IDENTITY = ("goodput",)


@dataclass(frozen=True)
class WorkloadRef:
    """The workload file a load point sends (tunebook.inputs.workloads.replay.prepare made it):
    what the row says of it, and how to find the prepared file again. Its run-id identity is
    the prepared file's content (`sha`)."""

    sha: str
    replay: workload_replay.Replay
    source: str  # the file's name only: rows travel between machines
    format: str
    vllm_dataset: str
    requests: int
    block_tokens: int | None
    duration_s: float | None
    conversion: str | None
    capped_inputs: int
    capped_outputs: int
    # mean (input, output) tokens of the prepared requests (0 where the file gives text)
    mean_input_len: int = 0
    mean_output_len: int = 0
    # (source line, input + output tokens) of every timed request, longest first
    longest: tuple[tuple[int, int], ...] = ()
    shared_prefix_share: float | None = None  # Prepared.shared_prefix_share
    file_name: str = ""  # the prepared file, named by its content (Prepared.file_name)
    # the source file's (mtime, size) when it was prepared: unchanged, it is not read again
    source_state: tuple[int, int] | None = None

    @classmethod
    def of(cls, r: workload_replay.Replay) -> WorkloadRef:
        state = file_state(r)
        p = workload_replay.prepare(r)
        ins = [x["input_length"] for x in p.records if "input_length" in x]
        outs = [x.get("output_length", x.get("output_tokens")) for x in p.records]
        outs = [x for x in outs if isinstance(x, int)]
        return cls(p.sha, r, p.source, p.format, p.vllm_dataset, p.requests, p.block_tokens,
                   p.duration_s, p.conversion, p.capped_inputs, p.capped_outputs,
                   round(sum(ins) / len(ins)) if ins else 0,
                   round(sum(outs) / len(outs)) if outs else 0,
                   tuple(sorted(workload_replay.too_long(p, 0), key=lambda x: -x[1])),
                   p.shared_prefix_share(), p.file_name, state)

    def too_long(self, max_tokens: int) -> list[tuple[int, int]]:
        """(source line, tokens) of the requests over `max_tokens` (input + output)."""
        return [(line, n) for line, n in self.longest if n > max_tokens]

    @property
    def timed(self) -> bool:
        return self.vllm_dataset == "timed_trace"

    def mean_lens(self) -> tuple[int, int]:
        return self.mean_input_len, self.mean_output_len

    def path(self) -> Path:
        """The prepared file vLLM's client reads, written when missing; an error when the
        source file no longer gives what was planned. A source unchanged since it was
        prepared (mtime, size) is not read again: each load point asks."""
        done = config.workloads_dir() / self.file_name
        if self.file_name and self.source_state is not None and \
                file_state(self.replay) == self.source_state and done.is_file():
            return done
        p = workload_replay.prepare(self.replay)
        if p.sha != self.sha:
            raise ValueError(f"{self.source} changed since the sweep was planned (its "
                             f"prepared requests were {self.sha}, are now {p.sha}): plan again")
        return p.write(config.workloads_dir())

    def as_row(self) -> dict[str, Any]:
        r = self.replay
        return {
            "workload_file": self.source, "workload_format": self.format,
            "workload_sha": self.sha, "workload_vllm_dataset": self.vllm_dataset,
            "workload_requests": self.requests, "workload_duration_s": self.duration_s,
            "workload_window_start_s": r.window_s[0] if r.window_s else None,
            "workload_window_end_s": r.window_s[1] if r.window_s else None,
            "workload_first": r.first, "workload_length_scale": r.length_scale,
            "workload_max_input_len": r.max_input_len,
            "workload_max_output_len": r.max_output_len,
            "workload_block_tokens": self.block_tokens,
            "workload_capped_inputs": self.capped_inputs,
            "workload_capped_outputs": self.capped_outputs,
            "workload_conversion": self.conversion,
            "workload_shared_prefix_share": self.shared_prefix_share,
        }


def file_state(r: workload_replay.Replay) -> tuple[int, int] | None:
    """The source file's (mtime ns, size); None when it cannot be read."""
    try:
        st = workload_replay.source_path(r).stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@dataclass(frozen=True)
class LoadPoint:
    dataset: str  # one of DATASETS
    max_concurrency: int
    request_rate: float | None  # None = send all at once (inf)
    input_len: int  # block_reuse: the length of both prompts; PROMPT_DATASETS: the longest
    output_len: int
    prefix_len: int  # block_reuse: tokens the second prompt shares with the first
    num_prefixes: int
    num_prompts: int
    num_warmups: int
    reset_prefix_cache: bool = True  # POST /reset_prefix_cache before the point
    seed: int | None = None  # dataset seed; None = a fresh one per run
    ignore_eos: bool = True  # False: answers end at the model's EOS (real weights)
    workload: WorkloadRef | None = None  # dataset FILE: the file it sends
    # a timed workload: replayed at this multiple of the trace's own rate (max_concurrency 0:
    # no cap on users, arrivals follow the trace)
    replay_speed: float | None = None
    goodput: str | None = None  # vLLM's --goodput bounds, e.g. "ttft:2000 tpot:100"

    def as_row(self) -> dict[str, Any]:
        """The point's columns (the row says what happened: prefix_cache_reset, seed)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__
             if k not in ("num_prefixes", "reset_prefix_cache", "seed", "workload", "goodput")}
        if self.workload is not None:
            d.update(self.workload.as_row())
        if self.replay_speed is not None:
            d["max_concurrency"] = None  # unbounded: the trace's arrivals decide
        d["goodput_slo"] = self.goodput
        return d

    def identity(self) -> dict[str, Any]:
        """What defines the point, for its run id (see _ID_NEUTRAL): a workload by the content
        of what it sends."""
        # fields one by one, not asdict: a workload is its sha, not a deep copy of its lengths
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.workload is not None:
            values["workload"] = self.workload.sha
        return {k: v for k, v in values.items()
                if not (k in _ID_NEUTRAL and v == _ID_NEUTRAL[k]) and k not in _NOT_IDENTITY}

    @property
    def label(self) -> str:
        if self.dataset == BLOCK_REUSE:
            return f"block reuse, {self.prefix_len} of {self.input_len} shared"
        if self.replay_speed is not None:
            return f"{self.workload.source if self.workload else 'trace'} at {self.replay_speed:g}×"
        rate = "inf" if self.request_rate is None else f"{self.request_rate:g}"
        prefix = f", prefix {self.prefix_len}" if self.prefix_len else ""
        return f"{self.max_concurrency} users, {rate} req/s{prefix}"


def fresh_seed() -> int:
    return random.SystemRandom().randrange(1, 2**31 - 1)


def point_seed(point: LoadPoint) -> int:
    """The dataset seed of one run: the fixed `load.seed`, else a fresh one."""
    return point.seed if point.seed is not None else fresh_seed()


# what vLLM's client reports of each latency
PERCENTILES = "50,90,99"
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"


def bench_argv(point: LoadPoint, base_url: str, model_name: str, tokenizer: str,
               seed: int) -> list[str]:
    """`vllm bench serve` arguments for one load point."""
    # a replay: no cap on users and no rate of ours (vLLM's semaphore would hold requests
    # back from the trace's clock)
    users = [] if point.replay_speed is not None else [
        "--max-concurrency", str(point.max_concurrency)]
    argv = [
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model_name, "--served-model-name", model_name, "--tokenizer", tokenizer,
        "--num-prompts", str(point.num_prompts), "--num-warmups", str(point.num_warmups),
        *users,
        "--request-rate", "inf" if point.request_rate is None else str(point.request_rate),
        "--seed", str(seed), "--temperature", "0",
        "--percentile-metrics", PERCENTILE_METRICS, "--metric-percentiles", PERCENTILES,
        "--save-detailed", "--disable-tqdm", *(["--ignore-eos"] if point.ignore_eos else []),
        # vLLM's default, pinned: its test request would cache the first measured prompt
        "--ready-check-timeout-sec", "0",
    ]
    if point.dataset in ("random", "random_prefix"):
        argv += ["--dataset-name", "random", "--random-input-len", str(point.input_len),
                 "--random-output-len", str(point.output_len),
                 "--random-prefix-len", str(point.prefix_len)]
    elif point.dataset == "prefix_repetition":
        argv += ["--dataset-name", "prefix_repetition",
                 "--prefix-repetition-prefix-len", str(point.prefix_len),
                 "--prefix-repetition-suffix-len", str(point.input_len),
                 "--prefix-repetition-num-prefixes", str(point.num_prefixes),
                 "--prefix-repetition-output-len", str(point.output_len)]
    elif point.dataset in PROMPT_DATASETS:
        # Built for this tokenizer: prompts of at most input_len tokens (chat template
        # included: vLLM's client applies it), code at least output_len tokens long.
        path = prompts.dataset_file(point.dataset, tokenizer, point.input_len, point.output_len)
        argv += ["--dataset-name", "custom", "--dataset-path", str(path),
                 "--custom-output-len", str(point.output_len)]
    elif point.dataset == FILE and point.workload is not None:
        argv += _workload_argv(point, point.workload)
    else:
        raise ValueError(f"dataset {point.dataset!r} is not one vLLM's client sends")
    if point.goodput:
        argv += ["--goodput", *point.goodput.split()]
    return argv


def _workload_argv(point: LoadPoint, w: WorkloadRef) -> list[str]:
    path = str(w.path())
    if w.vllm_dataset == "timed_trace":
        speed = point.replay_speed or 1.0
        # the prepared file's timestamps are seconds; vLLM waits timestamp × multiplier
        return ["--dataset-name", "timed_trace", "--dataset-path", path,
                "--timed-trace-chunk-hash-size", str(w.block_tokens),
                "--timed-trace-sec-multiplier", repr(1.0 / speed)]
    if w.vllm_dataset == "custom":
        # -1: each record's own output_tokens (256 for a record without one: vLLM's default)
        return ["--dataset-name", "custom", "--dataset-path", path, "--custom-output-len", "-1"]
    return ["--dataset-name", "sharegpt", "--dataset-path", path]
