"""One load point as the sweep runs it, on a stand-in engine (no vLLM): the reset before it
(asked, skipped, failed), /metrics before, during and after it, and what lands in the row and
the run's JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fake_server import FakeEngine
from tunebook.core import schema
from tunebook.inputs import params as P
from tunebook.measure import sweep as S
from tunebook.measure.client import ClientCache
from tunebook.measure.loads import client as client_kind
from tunebook.measure.point import PointContext, measure
from tunebook.models.presets import resolve_model
from tunebook.results.store import Store
from tunebook.servers import metrics as M


def _sweep(tmp: Path, **load: Any) -> S.Sweep:
    p = P.parse({"experiment": "m", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
                 "load": {"users": [1], **load}})
    return S.Sweep(p, tmp / "out", S.SweepOptions(progress=False))


def _one(sw: S.Sweep, eng: FakeEngine) -> tuple[dict, dict]:
    """One run measured on `eng` and stored, as the sweep's local executor does it."""
    result = S.SweepResult(sw.store, sw.plan, steps=sw.steps)
    ctx = PointContext(sw.params, sw.store.root, resolve_model("qwen3-tiny"), steps=sw.steps)
    measured = measure(eng, sw.plan.runs[0], ctx)  # type: ignore[arg-type]
    S.StoreSink(sw.store, result, None, sw.starts).save(measured)
    (record,) = Store(sw.store.root).records()
    return result.rows[0], record


def _probe_load() -> dict[str, Any]:
    return {"dataset": "block_reuse", "input_len": 80, "output_len": 1, "prefix_len": [40]}


def test_probe_point_records_cached_tokens_and_engine_metrics(tmp_path: Path) -> None:
    eng = FakeEngine(tmp_path)
    row, record = _one(_sweep(tmp_path, **_probe_load()), eng)
    assert row["status"] == schema.STATUS_OK and row["error"] is None
    assert eng.resets == 1 and row["prefix_cache_reset"] is True
    assert row["cached_tokens"] == 32 and row["dataset"] == "block_reuse"
    assert row["prefix_cache_hit_tokens"] == 416 and row["prefix_cache_query_tokens"] == 960
    assert row["kv_block_size"] == 32 and row["metrics_samples"] >= 1
    assert row["max_running_requests"] is not None
    assert set(M.MAXIMA.values()) <= set(row)
    em = record["engine_metrics"]
    assert em["before"] and em["after"] and em["samples"] and em["scrape_errors"] == 0
    assert record["probe"]["base_cached_tokens"] == 0
    assert len(eng.requests) == 2 and len(eng.requests[0]["prompt"]) == 80


def test_failed_reset_is_a_failed_run_and_nothing_is_sent(tmp_path: Path) -> None:
    eng = FakeEngine(tmp_path, reset_ok=False)
    row, record = _one(_sweep(tmp_path, **_probe_load()), eng)
    assert row["status"] == schema.STATUS_FAILED and row["prefix_cache_reset"] is False
    assert "prefix cache reset failed after 5 attempt(s)" in row["error"]
    assert "success" in row["error"] and "dev mode" in row["error_hint"]
    assert eng.requests == [] and "engine_metrics" not in record


def test_a_result_tunebook_cannot_read_is_a_failed_row_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's client answered, and reading its result raised (vLLM 0.26 on the H100: no
    `latencies`, an IndexError in the SLO share): the run is stored failed, saying so, with
    vLLM's arrays kept; the sweep goes on."""
    eng = FakeEngine(tmp_path)

    def fake_bench(argv: list[str], **kw: Any) -> tuple[dict, str]:
        eng.loaded = True
        return {"completed": 4, "failed": 0, "duration": 1.5, "ttfts": [0.1] * 4}, "printed"

    def unreadable(result: dict, point: Any) -> dict:
        raise IndexError("list index out of range")

    monkeypatch.setattr(client_kind, "run_bench", fake_bench)
    monkeypatch.setattr(client_kind, "metrics_row", unreadable)
    row, record = _one(_sweep(tmp_path, reset_prefix_cache=False, num_warmups=0), eng)
    assert row["status"] == schema.STATUS_FAILED
    assert row["error"].startswith("tunebook could not read vLLM's result: IndexError")
    assert "ttfts" in row["error"] and record["requests"]["ttfts"] == [0.1] * 4


def test_bench_point_without_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = FakeEngine(tmp_path)
    sent: list[list[str]] = []

    def fake_bench(argv: list[str], api_key: str | None = None, quiet: bool = True,
                   timeout_s: float | None = None, cache: Any = None,
                   timings: dict | None = None, death: Any = None) -> tuple[dict, str]:
        assert isinstance(cache, ClientCache) and timings is not None
        assert death is not None and death() is None  # the client asks the engine's watchdog
        timings.update({"client_s": 2.0, "client_tokenizer_s": 0.25})
        sent.append(argv)
        eng.loaded = True
        return {"completed": 4, "failed": 0, "duration": 1.5, "output_throughput": 10.0,
                "ttfts": [0.1] * 4}, "printed"

    monkeypatch.setattr(client_kind, "run_bench", fake_bench)
    sw = _sweep(tmp_path, reset_prefix_cache=False, seed=11, num_warmups=0)
    row, record = _one(sw, eng)
    assert row["status"] == schema.STATUS_OK and row["prefix_cache_reset"] is False
    assert eng.resets == 0 and row["seed"] == 11  # the fixed seed reached vLLM's client
    assert sent[0][sent[0].index("--seed") + 1] == "11"
    assert row["prefix_cache_hit_tokens"] == 416 and row["output_tok_s"] == 10.0
    assert record["requests"]["ttfts"] == [0.1] * 4 and record["engine_metrics"]["after"]
    # the run's steps in its JSON and the sweep's sums
    assert record["timings"]["client_s"] == 2.0 and record["timings"]["metrics_scrapes_s"] >= 0
    assert sw.steps.seconds["client (vLLM's, whole call)"] == 2.0
    assert sw.steps.calls["metrics scrapes"] == 2 and sw.steps.calls["save run"] == 1
