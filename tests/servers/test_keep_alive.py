"""The keep-alive race behind "Server disconnected" (issue 31), reproduced on a real engine.

vLLM's benchmark client pools connections with aiohttp.TCPConnector(keepalive_timeout=60); vLLM's
API server closes an idle one after VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (5 by default). A
request sent on a pooled connection that the server has closed, before the client has read the
close, dies with aiohttp's ServerDisconnectedError: one failed request, a `failed` run.

Made deterministic here: the client's event loop is blocked (time.sleep) for longer than vLLM's
default keep-alive between two requests, so when it sends the second one it has not yet read the
server's close, as a busy client at a lull in the load would. With vLLM's 5 s the second request
fails (run this test against a server of engine_env VLLM_HTTP_TIMEOUT_KEEP_ALIVE: 5, or on the
commit before the fix); tunebook starts its engines with a keep-alive longer than the client's,
and the row says so (http_keep_alive_s).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from tunebook.servers.base import KEEP_ALIVE_S, SERVED_NAME
from tunebook.servers.vllm import KEEP_ALIVE_ENV

pytestmark = pytest.mark.engine

VLLM_DEFAULT_KEEP_ALIVE_S = 5  # vllm/envs.py: VLLM_HTTP_TIMEOUT_KEEP_ALIVE
IDLE_S = VLLM_DEFAULT_KEEP_ALIVE_S + 1.5  # past vLLM's default, far below tunebook's


async def _two_requests_with_an_idle_gap(base_url: str, key: str) -> list[Any]:
    """Two completions on one pooled connection (as vLLM's client pools them), the loop
    blocked in between; each result is a status, or the exception the request died of."""
    connector = aiohttp.TCPConnector(limit=1, keepalive_timeout=60, force_close=False)
    body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}"}
    out: list[Any] = []
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(2):
            if i:
                time.sleep(IDLE_S)  # blocks the loop: the server's close is not read meanwhile
            try:
                async with session.post(f"{base_url}/v1/completions", json=body,
                                        headers=headers) as r:
                    await r.read()
                    out.append(r.status)
            except aiohttp.ClientError as e:
                out.append(e)
    return out


def test_a_connection_left_idle_past_vllms_keep_alive_is_reused_safely(shared_engine) -> None:
    engine = shared_engine.up()
    assert engine.keep_alive_s == KEEP_ALIVE_S > 60  # longer than the client keeps a connection
    assert engine.server_env()[KEEP_ALIVE_ENV] == f"{KEEP_ALIVE_S:g}"
    assert engine.row()["http_keep_alive_s"] == KEEP_ALIVE_S
    got = asyncio.run(_two_requests_with_an_idle_gap(engine.base_url, engine.api_key))
    assert got == [200, 200], got  # with vLLM's 5 s: [200, ServerDisconnectedError(...)]
