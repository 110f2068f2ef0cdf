"""Talking to an engine between load points, against a stub HTTP server on loopback:
prefix-cache reset (retries, failures said), /metrics, the API key, dev mode in the server's
environment, and Fig 3.3's probe (tunebook.measure.probe)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tunebook.inputs.load import LoadPoint
from tunebook.measure import probe
from tunebook.models.presets import resolve_model
from tunebook.servers.base import EngineRequestError, ServerOptions
from tunebook.servers.kinds import server_for
from tunebook.servers.process import DEV_MODE_ENV
from tunebook.servers.sglang import SGLangServer
from tunebook.servers.vllm import Engine

DATA = Path(__file__).resolve().parents[1] / "data"


class Stub:
    """What the stub server answers, and what it was asked."""

    def __init__(self) -> None:
        self.resets: list[tuple[int, bytes]] = []  # answers to POST /reset_prefix_cache, in turn
        self.completions: list[dict] = []  # answers to POST /v1/completions, in turn
        self.seen: list[dict[str, Any]] = []


@pytest.fixture
def stub() -> Iterator[tuple[Stub, int]]:
    state = Stub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _record(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            state.seen.append({"method": self.command, "path": self.path,
                               "auth": self.headers.get("Authorization"),
                               "body": json.loads(body) if body else None})

        def do_GET(self) -> None:  # noqa: N802
            self._record()
            if self.path == "/metrics":
                self._answer(200, (DATA / "vllm-0.32-cpu-metrics-busy.txt").read_bytes())
            else:
                self._answer(404, b"")

        def do_POST(self) -> None:  # noqa: N802
            self._record()
            if self.path in ("/reset_prefix_cache", "/flush_cache") and state.resets:
                self._answer(*state.resets.pop(0))
            elif self.path == "/v1/completions" and state.completions:
                self._answer(200, json.dumps(state.completions.pop(0)).encode())
            else:
                self._answer(404, b'{"detail":"Not Found"}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                         daemon=True)
    t.start()
    try:
        yield state, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _engine(port: int, **options: bool) -> Engine:
    e = Engine(resolve_model("qwen3-tiny"), options=ServerOptions(**options))
    e.port = port  # as if started: only the HTTP side is under test
    return e


def test_reset_succeeds_with_the_api_key(stub: tuple[Stub, int]) -> None:
    state, port = stub
    state.resets = [(200, b'{"success":true}')]
    eng = _engine(port, dev_mode=True)
    r = eng.reset_prefix_cache()
    assert r.ok and r.attempts == 1
    assert state.seen[0] == {"method": "POST", "path": "/reset_prefix_cache",
                             "auth": f"Bearer {eng.api_key}", "body": None}


def test_reset_retries_while_blocks_are_held(stub: tuple[Stub, int]) -> None:
    state, port = stub
    state.resets = [(200, b'{"success":false}')] * 2 + [(200, b'{"success":true}')]
    r = _engine(port, dev_mode=True).reset_prefix_cache(wait_s=0.01)
    assert r.ok and r.attempts == 3


def test_reset_that_keeps_failing_says_so(stub: tuple[Stub, int]) -> None:
    state, port = stub
    state.resets = [(200, b'{"success":false}')] * 3
    r = _engine(port, dev_mode=True).reset_prefix_cache(attempts=3, wait_s=0.01)
    assert not r.ok and r.attempts == 3 and "success" in r.detail and "in use" in r.detail


def test_reset_without_dev_mode_names_the_cause(stub: tuple[Stub, int]) -> None:
    _, port = stub
    r = _engine(port).reset_prefix_cache()
    assert not r.ok and r.attempts == 1 and f"{DEV_MODE_ENV}=1" in r.detail


def test_older_vllm_empty_200_counts_as_reset(stub: tuple[Stub, int]) -> None:
    state, port = stub
    state.resets = [(200, b"")]
    assert _engine(port, dev_mode=True).reset_prefix_cache().ok


def test_sglang_flush_is_retried_while_requests_run(stub: tuple[Stub, int]) -> None:
    # SGLang's cache reset (tunebook.servers.sglang): /flush_cache, HTTP 400 while requests run
    state, port = stub
    eng = server_for(resolve_model("qwen3-tiny"), {"engine_kind": "sglang"}, {},
                     Path("engine.log"))
    assert isinstance(eng, SGLangServer)  # the kind the knob picks
    eng.port = port  # as if started: only the HTTP side is under test
    state.resets = [(400, b"Flush cache failed.")] + [(200, b"Cache flushed.")]
    r = eng.reset_prefix_cache(wait_s=0.01)
    assert r.ok and r.attempts == 2 and state.seen[-1]["path"] == "/flush_cache"
    state.resets = [(400, b"Flush cache failed.")] * 2
    r = eng.reset_prefix_cache(attempts=2, wait_s=0.01)
    assert not r.ok and "requests still running" in r.detail
    state.resets = [(500, b"boom")]
    r = eng.reset_prefix_cache(wait_s=0.01)
    assert not r.ok and r.attempts == 1 and r.detail == "HTTP 500: boom"


def test_no_server_is_an_answer_not_a_crash() -> None:
    from tunebook.servers.base import free_port

    eng = _engine(free_port(), dev_mode=True)
    r = eng.reset_prefix_cache()
    assert not r.ok and "no answer" in r.detail
    with pytest.raises(EngineRequestError, match="no answer"):
        eng.metrics_text(timeout_s=2)


def test_metrics_text(stub: tuple[Stub, int]) -> None:
    _, port = stub
    assert "vllm:prefix_cache_hits_total" in _engine(port).metrics_text()


def test_dev_mode_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEV_MODE_ENV, "1")  # exported in the shell: never inherited
    m = resolve_model("qwen3-tiny")
    off = Engine(m, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert DEV_MODE_ENV not in off.server_env()
    assert off.server_env()["VLLM_API_KEY"] == off.api_key
    on = Engine(m, options=ServerOptions(dev_mode=True))
    assert on.server_env()[DEV_MODE_ENV] == "1"
    assert "--enable-prompt-tokens-details" not in on.argv
    assert "--enable-prompt-tokens-details" in Engine(
        m, options=ServerOptions(prompt_tokens_details=True)).argv


def test_options_cover() -> None:
    both = ServerOptions(True, True)
    assert both.covers(ServerOptions()) and both.covers(ServerOptions(True, False))
    assert not ServerOptions(False, True).covers(ServerOptions(True, False))
    assert ServerOptions().covers(ServerOptions())


# -- Fig 3.3's probe ------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 1, 15, 16, 17, 79])
def test_probe_prompts_share_exactly_k_tokens(k: int) -> None:
    p = probe.prompts(80, k, seed=7)
    assert len(p.base) == len(p.second) == 80
    assert p.second[:k] == p.base[:k] and p.second[k] != p.base[k]
    assert all(probe.LOW_ID <= t < probe.HIGH_ID for t in p.base + p.second)
    assert probe.prompts(80, k, seed=7) == p  # the seed recorded in the row reproduces it
    assert probe.prompts(80, k, seed=8).base != p.base


def test_probe_prompts_stay_in_a_small_vocabulary() -> None:
    p = probe.prompts(64, 10, seed=1, vocab_size=300)
    assert max(p.base + p.second) < 300
    with pytest.raises(ValueError, match="shared tokens"):
        probe.prompts(64, 64, seed=1)


def _completion(prompt_tokens: int, cached: int | None) -> dict:
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": 1,
                             "total_tokens": prompt_tokens + 1}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"choices": [{"text": "x"}], "usage": usage}


def _point(k: int) -> LoadPoint:
    return LoadPoint("block_reuse", 1, None, 80, 1, k, 1, 2, 0)


def test_probe_sends_token_ids_and_reads_cached_tokens(stub: tuple[Stub, int]) -> None:
    state, port = stub
    state.completions = [_completion(80, 0), _completion(80, 32)]
    eng = _engine(port, prompt_tokens_details=True)
    res = probe.run(eng, _point(40), seed=3, timeout_s=10)
    assert res.error is None
    assert res.row["cached_tokens"] == 32 and res.row["completed"] == 2
    assert res.row["total_input_tokens"] == 160 and res.row["total_output_tokens"] == 2
    assert res.record["probe"]["base_cached_tokens"] == 0
    sent = [s["body"] for s in state.seen if s["path"] == "/v1/completions"]
    expected = probe.prompts(80, 40, seed=3)
    assert [b["prompt"] for b in sent] == [expected.base, expected.second]
    assert all(b["max_tokens"] == 1 and b["model"] == "tunebook-model" for b in sent)
    assert all(s["auth"] == f"Bearer {eng.api_key}" for s in state.seen)


def test_probe_with_a_warm_base_is_an_error_with_its_numbers(stub: tuple[Stub, int]) -> None:
    state, port = stub
    state.completions = [_completion(80, 32), _completion(80, 64)]
    res = probe.run(_engine(port), _point(64), seed=3, timeout_s=10)
    assert res.error and "not cold" in res.error and res.row["cached_tokens"] == 64


def test_probe_without_prompt_details_says_which_flag(stub: tuple[Stub, int]) -> None:
    state, port = stub
    state.completions = [_completion(80, None), _completion(80, None)]
    with pytest.raises(probe.ProbeError, match="--enable-prompt-tokens-details"):
        probe.run(_engine(port), _point(16), seed=3, timeout_s=10)


def test_api_key_is_kept_per_user_and_private(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """One key per user, mode 0600: vLLM 0.26 hashes VLLM_API_KEY into torch.compile's cache
    key, so a key per engine would make every start compile from scratch."""
    from tunebook.core import config
    from tunebook.servers.base import api_key

    monkeypatch.setenv(config.STATE_DIR_ENV, str(tmp_path))
    key = api_key()
    path = tmp_path / "api_key"
    assert len(key) >= 32 and path.read_text() == key
    assert path.stat().st_mode & 0o777 == 0o600
    assert api_key() == key
    model = resolve_model("qwen3-tiny")
    assert Engine(model).api_key == Engine(model).api_key == key
    path.chmod(0o644)  # readable by others: not trusted, a new private one replaces it
    fresh = api_key()
    assert fresh != key and path.stat().st_mode & 0o777 == 0o600
