"""A failed run's error says what happened: the exception its requests died of (the last line
of vLLM's client's traceback), how many requests failed, and how many of each when they died of
several things; the whole tracebacks stay in the run's JSON (requests.errors)."""

from __future__ import annotations

from tunebook.measure.loads.client import error_summary

DISCONNECT = """Traceback (most recent call last):
  File ".../vllm/benchmarks/lib/endpoint_request_func.py", line 232, in async_request_openai
    async with session.post(url=api_url, json=payload, headers=headers) as response:
  File ".../aiohttp/client.py", line 1425, in __aenter__
    self._resp: _RetType = await self._coro
aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected
"""
TIMEOUT = """Traceback (most recent call last):
  File ".../asyncio/tasks.py", line 520, in wait_for
    return await fut
TimeoutError
"""


def test_one_kind_of_failure_names_its_exception_and_message() -> None:
    said = error_summary({"errors": ["", DISCONNECT, "", DISCONNECT]})
    assert said == "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected"
    assert "Traceback" not in said and "File" not in said


def test_several_kinds_are_counted_per_exception_type() -> None:
    said = error_summary({"errors": [DISCONNECT, TIMEOUT, DISCONNECT, ""]})
    assert said is not None and said.startswith("aiohttp.client_exceptions.ServerDisconnectedError")
    assert said.endswith("(2x ServerDisconnectedError, 1x TimeoutError)")


def test_a_servers_reason_is_kept_as_it_said_it() -> None:
    assert error_summary({"errors": ["Service Unavailable", ""]}) == "Service Unavailable"


def test_no_failed_request_is_no_error() -> None:
    assert error_summary({"errors": ["", ""]}) is None and error_summary({}) is None
