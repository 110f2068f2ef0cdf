"""vLLM's own benchmark client (`vllm.benchmarks.serve`), in-process: what loads a server.

Every metric therefore means exactly what `vllm bench serve` means. tunebook only picks the
arguments, gives each run a fresh dataset seed unless `load.seed` fixes one (a fixed seed sends
the same prompts again, which a warm prefix cache then serves from memory), and renames nothing
but the throughput keys (units in the name).

The warm-ups (`num_warmups`) send the first measured prompt (vLLM's choice), so that prompt finds
itself cached even right after a prefix-cache reset: a figure that needs every measured request
cache-cold sets num_warmups: 0. vLLM's optional "initial test run" request (the same prompt) stays
off, as vLLM's default is (`--ready-check-timeout-sec 0`, pinned): tunebook waited for /health.

vLLM's client loads its tokenizer again for every run (0.6-1 s on the 2-core CPU box, more than a
short run's benchmark: docs/overhead.md). A sweep passes a `ClientCache`, so each tokenizer loads
once per sweep; the dataset is still sampled by every run, from that run's seed, by vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tunebook.core import config
from tunebook.core.schema import COLUMN_NAMES
from tunebook.core.threads import Background
from tunebook.inputs.load import LoadPoint
from tunebook.servers.base import EngineDiedError

# vLLM's per-request arrays we keep in each run's JSON (they stay out of the table).
REQUEST_ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                  "errors")
_RENAME = {
    "duration": "duration_s",
    "failed": "failed_requests",
    "request_throughput": "request_throughput_req_s",
    "output_throughput": "output_tok_s",
    "total_token_throughput": "total_tok_s",
    "max_output_tokens_per_s": "max_output_tok_s",
    "request_goodput": "request_goodput_req_s",
}


@contextlib.contextmanager
def _api_key(key: str | None) -> Iterator[None]:
    """vLLM's client reads OPENAI_API_KEY; set it only for the call."""
    old = os.environ.get("OPENAI_API_KEY")
    if key:
        os.environ["OPENAI_API_KEY"] = key
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = old


class LoadError(RuntimeError):
    pass


_PREFETCH: list[threading.Thread] = []  # the prefetch under way or done, if any


def prefetch_client() -> threading.Thread | None:
    """Import vLLM's benchmark client (`vllm.benchmarks.serve`: torch, transformers; ~5 s on
    the 2-core CPU box) on a background thread at the lowest CPU priority, so the first run
    finds it imported instead of waiting for it. Meant to run while an engine starts: at nice
    19 the thread only gets the CPU the engine leaves idle, and the start-up keeps its own
    pace (docs/overhead.md compares the start phases with and without it). None when it is
    imported already; an import error is left for run_bench to raise where it is reported."""

    if "vllm.benchmarks.serve" in sys.modules:
        return None

    def work() -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: the nice value is per thread
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        with contextlib.suppress(Exception):
            config.import_module("vllm.benchmarks.serve")

    t = threading.Thread(target=work, name="tunebook-import-vllm-client", daemon=True)
    t.start()
    _PREFETCH.append(t)
    return t


def prefetched() -> None:
    """Wait for the prefetches started (code that puts a stand-in for vLLM's client in
    sys.modules must not race a real import of it: once, a test's stand-in was replaced
    mid-test by the import an earlier test's sweep had started)."""
    while _PREFETCH:
        _PREFETCH.pop().join()


class ClientCache:
    """What vLLM's client would build again in every run of a sweep: its tokenizer, loaded once
    per set of `get_tokenizer` arguments (the tokenizer folder, mode, trust_remote_code), so
    each run gets the tokenizer its own call would have loaded. Dataset samples are not kept:
    each run samples its own, from its own seed (point_seed), in 20-120 ms."""

    def __init__(self) -> None:
        self._tokenizers: dict[Hashable, Any] = {}
        self.loads = 0  # tokenizers loaded (the rest were reused)

    def tokenizer(self, load: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        key = (args, tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:  # arguments it cannot be keyed on: load it, as vLLM would
            return load(*args, **kwargs)
        if key not in self._tokenizers:
            self._tokenizers[key] = load(*args, **kwargs)
            self.loads += 1
        return self._tokenizers[key]


@dataclass
class _ClientRun:
    """What the hooks of one run_bench call see (on its worker thread only)."""
    cache: ClientCache | None
    timings: dict[str, float] = field(default_factory=dict)


_CURRENT = threading.local()  # .run: the _ClientRun of the run_bench worker thread
# vLLM client functions run_bench times, as timings keys (get_tokenizer also goes through the
# ClientCache). Looked up in vllm.benchmarks.serve's namespace at each call, so wrapping the
# name there reaches them; outside a run_bench worker thread the wrapper is vLLM's function.
_HOOKED = {"get_tokenizer": "client_tokenizer_s", "get_samples": "client_samples_s"}


def _hook(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        run: _ClientRun | None = getattr(_CURRENT, "run", None)
        if run is None:
            return f(*args, **kwargs)
        t0 = time.monotonic()
        try:
            if name == "get_tokenizer" and run.cache is not None:
                return run.cache.tokenizer(f, *args, **kwargs)
            return f(*args, **kwargs)
        finally:
            key = _HOOKED[name]
            run.timings[key] = run.timings.get(key, 0.0) + time.monotonic() - t0

    wrapper._tunebook_hook = True  # type: ignore[attr-defined]
    return wrapper


def _install_hooks(vbs: Any) -> None:
    for name in _HOOKED:
        f = getattr(vbs, name, None)
        if f is not None and not getattr(f, "_tunebook_hook", False):
            setattr(vbs, name, _hook(name, f))


def _parse_args(vbs: Any, argv: list[str]) -> Any:
    import argparse

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older layouts
        FlexibleArgumentParser = argparse.ArgumentParser  # noqa: N806
    parser = FlexibleArgumentParser()
    vbs.add_cli_args(parser)
    return parser.parse_args(argv)


def sample_requests(argv: list[str]) -> list[Any]:
    """The requests vLLM's client makes of these arguments, without a server: its own dataset
    code (get_samples) and tokenizer — what a workload file becomes when it is sent."""
    vbs = config.import_module("vllm.benchmarks.serve")
    from vllm.benchmarks.datasets import get_samples

    args = _parse_args(vbs, argv)
    if args.dataset_name == "timed_trace" and args.self_timed is None:
        args.self_timed = True  # as its main() sets it
    tokenizer = vbs.get_tokenizer(args.tokenizer, tokenizer_mode=args.tokenizer_mode,
                                  trust_remote_code=args.trust_remote_code)
    return get_samples(args, tokenizer)


def run_bench(argv: list[str], api_key: str | None = None, quiet: bool = True,
              timeout_s: float | None = None, cache: ClientCache | None = None,
              timings: dict[str, float] | None = None,
              death: Callable[[], str | None] | None = None) -> tuple[dict[str, Any], str]:
    """Run vLLM's client in this process; return its result dict and what it printed.

    It runs on a worker thread with its own event loop: `vllm bench serve` calls asyncio.run,
    which fails inside a Jupyter kernel (a loop is already running there). With a `cache` the
    tokenizer is reused across calls; `timings` gets the seconds of the client's steps (its
    import, tokenizer, dataset sampling, and the whole call: `client_s`). `death` (the
    server's) is asked every WATCH_S while it runs: once it names a process of the engine that
    died, the client is cancelled and EngineDiedError raised (an engine core that died under a
    forked API server leaves its requests waiting forever otherwise).
    """
    t0 = time.monotonic()
    vbs = config.import_module("vllm.benchmarks.serve")  # ~5 s the first time (torch)

    t_import = time.monotonic() - t0
    _install_hooks(vbs)
    args = _parse_args(vbs, argv)
    out = io.StringIO()
    box: dict[str, Any] = {}
    run = _ClientRun(cache)

    def work() -> None:
        _CURRENT.run = run
        try:
            main_async = getattr(vbs, "main_async", None)
            if main_async is None:  # a client without it cannot be cancelled: it runs out
                box["result"] = vbs.main(args)
                return
            with asyncio.Runner() as runner:  # vbs.main is asyncio.run(main_async(args))
                box["loop"] = runner.get_loop()
                box["result"] = runner.run(main_async(args))
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e
        finally:
            _CURRENT.run = None

    redirect = contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext()
    ended, died = False, None
    try:
        with _api_key(api_key), redirect:
            bg = Background(work, "vllm-bench")
            try:
                # Ctrl-C and SIGTERM land here, in the caller's thread
                ended, died = _wait(bg, timeout_s, death)
            finally:
                if not ended:  # interrupted or timed out: the client lets go of its streams
                    _cancel_client(box, bg)
    finally:
        if timings is not None:
            timings.update({"client_s": time.monotonic() - t0, "client_import_s": t_import,
                            **run.timings})
    text = out.getvalue().replace(api_key, "***") if api_key else out.getvalue()
    if died is not None:
        raise EngineDiedError(died)
    if not ended:
        raise LoadError(f"the benchmark did not finish within {timeout_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["result"], text


WATCH_S = 0.1  # how often a running client asks whether its engine died


def _wait(bg: Background, timeout_s: float | None,
          death: Callable[[], str | None] | None) -> tuple[bool, str | None]:
    """(ended, None) once the client ends; (False, None) after `timeout_s`; (False, what
    died) as soon as `death` says so."""
    if death is None:
        return bg.wait(timeout_s), None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False, None
        if bg.wait(WATCH_S if left is None else min(WATCH_S, left)):
            return True, None
        if (died := death()) is not None:
            return False, died


def _cancel_client(box: dict[str, Any], bg: Background, grace_s: float = 10.0) -> None:
    """Cancel the client's asyncio tasks and give it `grace_s` to close its connections.

    An open streaming connection keeps vLLM's API server (uvicorn) waiting, with no limit,
    when it is stopped next; cancelled, the client's aiohttp sessions close as they unwind."""
    loop = box.get("loop")
    if loop is None or loop.is_closed():
        return

    def cancel_all() -> None:
        for task in asyncio.all_tasks(loop):
            task.cancel()

    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing to cancel
        loop.call_soon_threadsafe(cancel_all)
    bg.wait(grace_s)


def metrics_row(result: dict[str, Any], point: LoadPoint) -> dict[str, Any]:
    """vLLM's summary metrics under tunebook's column names (see tunebook.core.schema)."""
    row: dict[str, Any] = {}
    for key, value in result.items():
        name = _RENAME.get(key, key)
        if name in COLUMN_NAMES and not isinstance(value, list | dict):
            row[name] = value.item() if hasattr(value, "item") else value
    out_tok_s = row.get("output_tok_s")
    if out_tok_s is not None and point.max_concurrency:
        row["output_tok_s_per_user"] = out_tok_s / point.max_concurrency
    row.update(itl_tail_ms(result))
    if point.goodput:
        row["slo_attainment"] = slo_attainment(result, point.goodput)
    return {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}


def e2e_latency(result: dict[str, Any], i: int) -> float | None:
    """Request i's end-to-end latency, s: vLLM's `latencies` where the result has them, else
    its TTFT plus its inter-token gaps (what vLLM measures it as, streaming: vLLM 0.26's
    client returns no `latencies`); None when it has neither."""
    lats, ttfts, itls = (result.get(k) or [] for k in ("latencies", "ttfts", "itls"))
    if i < len(lats) and lats[i] is not None:
        return float(lats[i])
    if i < len(ttfts) and i < len(itls) and itls[i] is not None:
        return ttfts[i] + sum(itls[i])
    return None


def slo_attainment(result: dict[str, Any], goodput: str) -> float | None:
    """The share of the requests sent that met every bound of `goodput` (vLLM's --goodput
    text, "ttft:2000 tpot:100 e2el:20000", ms). vLLM's definition of a good request: it
    succeeded and each bound holds with <=, TPOT per request = (e2el - ttft) / (output tokens
    - 1), 0 for a one-token answer. Unlike vLLM's request_goodput (good requests per second),
    the share counts a failed request as sent and not good. A request's e2el is vLLM's
    `latencies` where the result has them, else its TTFT plus its inter-token gaps (what vLLM
    measures it as, streaming); None when a request that succeeded has neither."""
    bounds = {k: float(v) / 1000 for k, v in (b.split(":") for b in goodput.split())}
    ttfts = result.get("ttfts") or []
    outs, errors = result.get("output_lens") or [], result.get("errors") or []
    n = max(len(ttfts), len(errors))
    if not n:
        return None
    good = 0
    for i in range(n):
        if i >= len(ttfts) or (errors[i] if i < len(errors) else "") \
                or i >= len(outs) or not outs[i]:
            continue
        e2el = e2e_latency(result, i)
        if e2el is None:
            return None
        tpot = (e2el - ttfts[i]) / (outs[i] - 1) if outs[i] > 1 else 0.0
        values = {"ttft": ttfts[i], "tpot": tpot, "e2el": e2el}
        good += all(values[k] <= b for k, b in bounds.items())
    return good / n


def itl_tail_ms(result: dict[str, Any]) -> dict[str, float]:
    """p999_itl_ms and max_itl_ms over the gaps vLLM's own ITL percentiles use: every gap of
    every request without an error, np.percentile's default (linear) as vLLM computes them;
    nothing when there is no gap (vLLM would report 0)."""
    import numpy as np

    itls, errors = result.get("itls") or [], result.get("errors") or []
    gaps = [g for i, req in enumerate(itls) if not (errors[i] if i < len(errors) else "")
            for g in (req or [])]
    if not gaps:
        return {}
    return {"p999_itl_ms": float(np.percentile(gaps, 99.9)) * 1000,
            "max_itl_ms": max(gaps) * 1000}


def request_arrays(result: dict[str, Any], texts: bool = False) -> dict[str, Any]:
    """The per-request arrays a run's JSON keeps; with `texts` also what each request wrote
    (real prompts, real weights: outputs with and without speculation can be compared)."""
    keep = (*REQUEST_ARRAYS, "generated_texts") if texts else REQUEST_ARRAYS
    return {k: result[k] for k in keep if k in result}
