"""What a sweep keeps between runs of vLLM's client (tunebook.measure.client.ClientCache) and the
time each step takes (timings, StepTimes), on a stand-in for `vllm.benchmarks.serve`: no engine."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from tunebook.measure import client as L
from tunebook.measure.progress import StepTimes

# The parts of vllm.benchmarks.serve that run_bench touches; main() looks its helpers up in the
# module's namespace at each call, as vLLM's does (`get_tokenizer(...)`, `get_samples(...)`).
FAKE_SERVE = '''
loaded = []

def add_cli_args(parser):
    parser.add_argument("--tokenizer")
    parser.add_argument("--seed", type=int)

def get_tokenizer(name, tokenizer_mode="auto", trust_remote_code=False):
    loaded.append(name)
    return {"tokenizer": name, "mode": tokenizer_mode}

def get_samples(args, tokenizer):
    return [f"{tokenizer['tokenizer']} prompt {args.seed}"]

def main(args):
    tok = get_tokenizer(args.tokenizer, tokenizer_mode="auto", trust_remote_code=False)
    return {"samples": get_samples(args, tok), "tokenizer": tok}
'''


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    L.prefetched()  # an earlier test's sweep may be importing the real one in the background
    mod = types.ModuleType("vllm.benchmarks.serve")
    exec(FAKE_SERVE, mod.__dict__)  # noqa: S102 - test stand-in
    pkg, bench = types.ModuleType("vllm"), types.ModuleType("vllm.benchmarks")
    bench.serve = mod  # type: ignore[attr-defined]
    pkg.benchmarks = bench  # type: ignore[attr-defined]
    for name, m in (("vllm", pkg), ("vllm.benchmarks", bench), ("vllm.benchmarks.serve", mod)):
        monkeypatch.setitem(sys.modules, name, m)
    return mod


def _argv(tok: str, seed: int) -> list[str]:
    return ["--tokenizer", tok, "--seed", str(seed)]


def test_one_tokenizer_load_per_sweep_and_a_sample_per_run(serve: types.ModuleType) -> None:
    cache = L.ClientCache()
    first, _ = L.run_bench(_argv("tokA", 1), cache=cache)
    second, _ = L.run_bench(_argv("tokA", 2), cache=cache)
    assert serve.loaded == ["tokA"] and cache.loads == 1
    assert second["tokenizer"] is first["tokenizer"]  # the same object, not a copy
    # each run still samples from its own seed (vLLM does it; nothing of it is kept)
    assert first["samples"] == ["tokA prompt 1"] and second["samples"] == ["tokA prompt 2"]
    L.run_bench(_argv("tokB", 3), cache=cache)  # another tokenizer is another key
    assert serve.loaded == ["tokA", "tokB"] and cache.loads == 2


def test_without_a_cache_the_client_loads_its_tokenizer_each_run(
        serve: types.ModuleType) -> None:
    L.run_bench(_argv("tokA", 1))
    L.run_bench(_argv("tokA", 1))
    assert serve.loaded == ["tokA", "tokA"]


def test_timings_of_the_client_steps(serve: types.ModuleType) -> None:
    timings: dict[str, float] = {}
    L.run_bench(_argv("tokA", 1), cache=L.ClientCache(), timings=timings)
    assert set(timings) == {"client_s", "client_import_s", "client_tokenizer_s",
                            "client_samples_s"}
    assert all(v >= 0 for v in timings.values())
    assert timings["client_s"] >= timings["client_tokenizer_s"] + timings["client_samples_s"]


def test_hooks_wrap_once_and_are_vllms_own_outside_run_bench(serve: types.ModuleType) -> None:
    L.run_bench(_argv("tokA", 1), cache=L.ClientCache())
    hooked = serve.get_tokenizer
    L.run_bench(_argv("tokA", 1), cache=L.ClientCache())
    assert serve.get_tokenizer is hooked and hooked.__wrapped__.__name__ == "get_tokenizer"
    # called outside a run_bench worker thread: no cache, no timing, vLLM's function
    assert serve.get_tokenizer("tokC") == {"tokenizer": "tokC", "mode": "auto"}
    assert serve.loaded[-1] == "tokC"


def test_a_client_error_still_reports_timings(serve: types.ModuleType) -> None:
    def broken(args: Any) -> dict:
        raise ValueError("no server")

    serve.main = broken
    timings: dict[str, float] = {}
    with pytest.raises(ValueError, match="no server"):
        L.run_bench(_argv("tokA", 1), timings=timings)
    assert "client_s" in timings


def test_cache_keys_on_every_argument_and_loads_unhashable_ones_each_time() -> None:
    calls: list[tuple] = []

    def load(*args: Any, **kwargs: Any) -> object:
        calls.append((args, kwargs))
        return object()

    cache = L.ClientCache()
    a = cache.tokenizer(load, "tok", tokenizer_mode="auto")
    assert cache.tokenizer(load, "tok", tokenizer_mode="auto") is a
    assert cache.tokenizer(load, "tok", tokenizer_mode="slow") is not a
    assert cache.tokenizer(load, "tok", trust_remote_code=True, tokenizer_mode="auto") is not a
    cache.tokenizer(load, "tok", revision=["main"])
    cache.tokenizer(load, "tok", revision=["main"])
    assert len(calls) == 5 and cache.loads == 3


def test_prefetch_is_nothing_once_the_client_is_imported(serve: types.ModuleType) -> None:
    assert L.prefetch_client() is None


def test_step_times_sum_and_count() -> None:
    st = StepTimes()
    with st.time("a"):
        pass
    st.add("a", 1.5)
    st.add("b", 2.0, calls=3)
    assert st.calls == {"a": 2, "b": 3} and st.seconds["a"] >= 1.5 and st.seconds["b"] == 2.0


# A client that streams until it is stopped, as vLLM's does at a long load point: its
# connections close only as its tasks unwind (main is asyncio.run(main_async(args)), as vLLM's).
STREAMING = '''
import asyncio

unwound = []

async def main_async(args):
    try:
        await asyncio.sleep(3600)
    finally:
        unwound.append(args.seed)

def main(args):
    return asyncio.run(main_async(args))
'''


def _streaming(serve: types.ModuleType) -> types.ModuleType:
    exec(STREAMING, serve.__dict__)  # noqa: S102 - test stand-in
    return serve


def test_a_timed_out_client_is_cancelled_not_left_streaming(serve: types.ModuleType) -> None:
    _streaming(serve)
    with pytest.raises(L.LoadError, match="did not finish within"):
        L.run_bench(_argv("tokA", 7), timeout_s=0.3)
    assert serve.unwound == [7]  # its tasks were cancelled (its streams closed) before the raise


def test_ctrl_c_cancels_the_client(serve: types.ModuleType) -> None:
    """Ctrl-C (or tunebook's SIGTERM handler) raises in the waiting thread: the client is
    cancelled before the exception goes on. Waiting with Thread.join, CPython 3.11 marked the
    still-running client thread stopped (bpo-45274) and it was left streaming: vLLM's API
    server then waited 20 s for its connections at every stop."""
    import signal

    _streaming(serve)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            L.run_bench(_argv("tokA", 8), timeout_s=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert serve.unwound == [8]
