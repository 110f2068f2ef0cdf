"""The proxy in front of a prefill engine and a decode engine (Fig 6.2), run as its own process
by tunebook.servers.disagg: ``python -m tunebook.servers.disagg_proxy --port P --prefill URL
--decode URL --store DIR``.

For each ``POST /v1/completions`` (or ``/v1/chat/completions``) it sends the request to the
prefill engine with ``max_tokens`` 1 and no streaming, waits for that answer (the prefill engine
has then written the prompt's KV through its connector), then sends the original request to
the decode engine and streams its answer back chunk by chunk, as it arrives. Everything else
(`/v1/models`, `/metrics`, ...) goes to the decode engine; ``/metrics/prefill`` is the prefill
engine's; ``POST /reset_prefix_cache`` resets both and empties the store.

- The client's ``Authorization`` header is checked against ``TUNEBOOK_PROXY_API_KEY`` (from the
  environment, never argv) and passed through unchanged; neither key nor header is ever logged.
- One pooled HTTP client session (keep-alive): the hop costs one local round trip, no
  connection set-up per request. ``--mode passthrough`` forwards every request to ``--decode``
  alone: the control that measures that hop on one engine.
- The store (ExampleConnector's ``shared_storage_path``: one folder of per-layer files per
  prompt) is watched: a folder that appears is counted and deleted once every request that was
  in flight when it appeared has had its first decoded byte (its owner is one of them and has
  loaded it by then), so a long load needs room for the prompts in flight only. A folder the
  decode engine still needs is never deleted; a later request with the same prompt finds none
  and is prefilled again (a miss, not an error).
- ``GET /tunebook/stats`` reports, since the last ``POST /tunebook/stats/reset``: requests,
  KV bytes and folders the prefill engine wrote, and per request the prefill call's time, the
  decode engine's time to its first byte and the proxy's own time (overhead).

Only the standard library and aiohttp (a vLLM dependency): it imports nothing of tunebook.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

KEY_ENV = "TUNEBOOK_PROXY_API_KEY"
GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
# Request headers passed upstream; hop-by-hop ones (Host, Content-Length, Connection) are not.
PASS_HEADERS = ("Authorization", "Content-Type", "Accept", "X-Request-Id")
# Response headers passed back (the streamed body gets its own framing).
PASS_BACK = ("Content-Type", "Cache-Control")
# Fields a 1-token prefill request must not carry (min_tokens > max_tokens is refused).
PREFILL_DROP = ("stream_options", "min_tokens")

log = logging.getLogger("tunebook.servers.disagg_proxy")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request the prefill engine gets: the same prompt and sampling, one token, whole."""
    out = {k: v for k, v in body.items() if k not in PREFILL_DROP}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    return out


def upstream_headers(request: web.Request) -> dict[str, str]:
    return {h: request.headers[h] for h in PASS_HEADERS if h in request.headers}


class KVStore:
    """Folders the prefill engine's connector writes: counted, then deleted once consumed."""

    def __init__(self, root: Path | None):
        self.root = root
        self.owners: dict[str, set[int]] = {}  # folder -> requests in flight when it appeared
        self.bytes_written = 0  # of folders already deleted (live ones are added on read)
        self.folders_written = 0
        self.files_written = 0

    def reset_counts(self) -> None:
        self.bytes_written = self.folders_written = self.files_written = 0
        # folders still tracked were counted already; forget them for the new tally
        self.owners = {name: set() for name in self.owners}
        self._collect()

    def _names(self) -> list[str]:
        if self.root is None:
            return []
        try:
            return [e.name for e in os.scandir(self.root) if e.is_dir()]
        except OSError:
            return []

    def scan(self, in_flight: set[int]) -> None:
        """New folders: owned by every request in flight now (the writer is among them)."""
        for name in self._names():
            if name not in self.owners:
                self.owners[name] = set(in_flight)
                self.folders_written += 1

    def consumed(self, req: int) -> None:
        """Request ``req`` has its first decoded byte (or ended): its KV is loaded."""
        for owners in self.owners.values():
            owners.discard(req)
        self._collect()

    def _size(self, name: str) -> tuple[int, int]:
        total = files = 0
        try:
            for e in os.scandir(self.root / name):  # type: ignore[operator]
                with contextlib.suppress(OSError):
                    total += e.stat().st_size
                    files += 1
        except OSError:
            pass
        return total, files

    def _collect(self) -> None:
        for name in [n for n, o in self.owners.items() if not o]:
            size, files = self._size(name)
            self.bytes_written += size
            self.files_written += files
            shutil.rmtree(self.root / name, ignore_errors=True)  # type: ignore[operator]
            del self.owners[name]

    def live(self) -> tuple[int, int]:
        """Bytes and files of folders still on disk (read when nothing is in flight)."""
        sizes = [self._size(n) for n in self.owners]
        return sum(s for s, _ in sizes), sum(f for _, f in sizes)

    def clear(self) -> None:
        for name in self._names():
            shutil.rmtree(self.root / name, ignore_errors=True)  # type: ignore[operator]
        self.owners.clear()


class Proxy:
    def __init__(self, prefill: str, decode: str, store: Path | None, mode: str = "disagg",
                 timeout_s: float = 6 * 3600):
        self.prefill, self.decode, self.mode = prefill.rstrip("/"), decode.rstrip("/"), mode
        self.key = os.environ.get(KEY_ENV, "")
        self.store = KVStore(store)
        self.timeout = ClientTimeout(total=timeout_s)
        self.session: ClientSession | None = None
        self.ids = itertools.count()
        self.in_flight: set[int] = set()
        self.parent_pid = 0
        self.reset_stats()

    def reset_stats(self) -> None:
        self.requests = self.failures = 0
        self.prefill_ms: list[float] = []
        self.decode_first_byte_ms: list[float] = []
        self.overhead_ms: list[float] = []

    # -- the app ----------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics/prefill", self.prefill_metrics)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/tunebook/stats", self.stats)
        app.router.add_post("/tunebook/stats/reset", self.stats_reset)
        for path in GENERATE_PATHS:
            app.router.add_post(path, self.generate)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        return app

    async def _open(self, app: web.Application) -> None:
        self.session = ClientSession(connector=TCPConnector(limit=0, ttl_dns_cache=None),
                                     timeout=self.timeout, auto_decompress=False)
        if self.parent_pid:
            self._watch = asyncio.get_running_loop().create_task(self._watch_parent())

    async def _watch_parent(self) -> None:
        while os.getppid() == self.parent_pid:
            await asyncio.sleep(1.0)
        log.info("the process that started the proxy is gone: exiting")
        os.kill(os.getpid(), signal.SIGTERM)

    async def _close(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    def _authorized(self, request: web.Request) -> bool:
        return not self.key or request.headers.get("Authorization") == f"Bearer {self.key}"

    @staticmethod
    def _unauthorized() -> web.Response:
        return web.json_response({"error": "Unauthorized"}, status=401)

    # -- generation ---------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        t_in = time.perf_counter()
        if not self._authorized(request):
            return self._unauthorized()
        if self.mode == "passthrough":
            return await self._stream(request, self.decode, await request.read())
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return web.json_response({"error": "the body is not JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "the body is not a JSON object"}, status=400)
        req = next(self.ids)
        self.in_flight.add(req)
        self.requests += 1
        try:
            assert self.session is not None
            t0 = time.perf_counter()
            try:
                async with self.session.post(self.prefill + request.path,
                                             json=prefill_body(body),
                                             headers=upstream_headers(request)) as r:
                    answer = await r.read()
                    if r.status != 200:
                        self.failures += 1
                        log.warning("prefill answered HTTP %s on %s", r.status, request.path)
                        return web.Response(status=r.status, body=answer,
                                            content_type=r.content_type)
            except (ClientError, TimeoutError) as e:
                self.failures += 1
                log.warning("prefill failed: %s", type(e).__name__)
                return web.json_response({"error": f"proxy: prefill {type(e).__name__}"},
                                         status=502)
            t1 = time.perf_counter()
            self.prefill_ms.append((t1 - t0) * 1e3)
            self.store.scan(self.in_flight)
            data = json.dumps(body).encode()
            return await self._stream(request, self.decode, data, req=req,
                                      before_ms=(t0 - t_in + time.perf_counter() - t1) * 1e3)
        finally:
            self.in_flight.discard(req)
            self.store.consumed(req)

    async def _stream(self, request: web.Request, base: str, data: bytes,
                      req: int | None = None, before_ms: float | None = None
                      ) -> web.StreamResponse:
        """Send ``data`` to ``base`` and stream the answer back as it arrives. A failure
        before the first byte is the client's 502; after it, the stream just ends."""
        assert self.session is not None
        t0 = time.perf_counter()
        out: web.StreamResponse | None = None
        try:
            async with self.session.post(base + request.path, data=data,
                                         headers=upstream_headers(request)) as r:
                out = web.StreamResponse(status=r.status, headers={
                    h: r.headers[h] for h in PASS_BACK if h in r.headers})
                if r.status != 200:
                    self.failures += 1
                    log.warning("%s answered HTTP %s on %s", base, r.status, request.path)
                async for chunk in r.content.iter_any():
                    if not out.prepared:
                        t1 = time.perf_counter()
                        await out.prepare(request)
                        await out.write(chunk)
                        if req is not None:
                            self.decode_first_byte_ms.append((t1 - t0) * 1e3)
                            self.store.consumed(req)
                            self.overhead_ms.append((before_ms or 0.0)
                                                    + (time.perf_counter() - t1) * 1e3)
                        continue
                    await out.write(chunk)
                if not out.prepared:
                    await out.prepare(request)
                await out.write_eof()
                return out
        except (ClientError, TimeoutError) as e:
            self.failures += 1
            log.warning("%s failed: %s", base, type(e).__name__)
            if out is not None and out.prepared:
                raise
            return web.json_response({"error": f"proxy: {type(e).__name__}"}, status=502)

    # -- the rest -----------------------------------------------------------------------------
    async def forward(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/v1/") and not self._authorized(request):
            return self._unauthorized()
        assert self.session is not None
        async with self.session.request(request.method, self.decode + request.path_qs,
                                        data=await request.read(),
                                        headers=upstream_headers(request)) as r:
            return web.Response(status=r.status, body=await r.read(), headers={
                h: r.headers[h] for h in PASS_BACK if h in r.headers})

    async def health(self, request: web.Request) -> web.Response:
        bases = (self.decode,) if self.mode == "passthrough" else (self.prefill, self.decode)
        assert self.session is not None
        for base in bases:
            try:
                async with self.session.get(base + "/health",
                                            timeout=ClientTimeout(total=5)) as r:
                    if r.status != 200:
                        return web.Response(status=503, text=f"{base} answered {r.status}")
            except (TimeoutError, OSError):
                return web.Response(status=503, text=f"{base} does not answer")
        return web.Response(status=200)

    async def prefill_metrics(self, request: web.Request) -> web.Response:
        assert self.session is not None
        async with self.session.get(self.prefill + "/metrics") as r:
            return web.Response(status=r.status, body=await r.read(), headers={
                h: r.headers[h] for h in PASS_BACK if h in r.headers})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """Both engines' prefix caches, then the store: the next load point starts cold."""
        assert self.session is not None
        answers = {}
        for role, base in (("prefill", self.prefill), ("decode", self.decode)):
            async with self.session.post(base + "/reset_prefix_cache",
                                         headers=upstream_headers(request)) as r:
                text = (await r.text()).strip()
                if r.status != 200:
                    return web.Response(status=r.status, text=text)
                answers[role] = text
        self.store.clear()
        ok = all(_success(t) for t in answers.values())
        return web.json_response({"success": ok, **answers})

    async def stats(self, request: web.Request) -> web.Response:
        live_bytes, live_files = self.store.live()
        return web.json_response({
            "requests": self.requests, "failures": self.failures,
            "in_flight": len(self.in_flight),
            "kv_bytes_written": self.store.bytes_written + live_bytes,
            "kv_files_written": self.store.files_written + live_files,
            "kv_folders_written": self.store.folders_written,
            "prefill_ms": self.prefill_ms, "decode_first_byte_ms": self.decode_first_byte_ms,
            "overhead_ms": self.overhead_ms})

    async def stats_reset(self, request: web.Request) -> web.Response:
        self.reset_stats()
        self.store.reset_counts()
        return web.json_response({"success": True})


def _success(text: str) -> bool:
    try:
        return bool(json.loads(text).get("success", True)) if text else True
    except (ValueError, AttributeError):
        return True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefill", default="", help="the prefill engine's base URL")
    ap.add_argument("--decode", required=True, help="the decode engine's base URL")
    ap.add_argument("--store", default="", help="the connector's storage folder")
    ap.add_argument("--mode", choices=("disagg", "passthrough"), default="disagg")
    # idle client connections outlive the client's own keep-alive (servers.base.KEEP_ALIVE_S)
    ap.add_argument("--keep-alive-s", type=float, default=75.0,
                    help="seconds an idle client connection stays open (aiohttp's default)")
    ap.add_argument("--parent-pid", type=int, default=0,
                    help="exit when this process is gone (a killed kernel leaves no proxy)")
    args = ap.parse_args(argv)
    if args.mode == "disagg" and not args.prefill:
        ap.error("--prefill is required in disagg mode")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    proxy = Proxy(args.prefill, args.decode, Path(args.store) if args.store else None, args.mode)
    if args.parent_pid:
        proxy.parent_pid = args.parent_pid
    log.info("proxy (%s) on %s:%s", args.mode, args.host, args.port)
    # no access log: it would print request lines, and headers are nobody's business
    web.run_app(proxy.app(), host=args.host, port=args.port, access_log=None,
                print=None, handle_signals=True, keepalive_timeout=args.keep_alive_s)


if __name__ == "__main__":
    main()
