"""What every server kind shares: the `Server` protocol the measuring code talks to, the options
a load point asks of a server, the API key, loopback ports and HTTP, and the errors.

A server is one thing the benchmark client sends requests to: a vLLM engine
(tunebook.servers.vllm), an SGLang engine (tunebook.servers.sglang), or a prefill engine, a
decode engine and a proxy (tunebook.servers.disagg). tunebook.servers.kinds picks one for an
engine config; nothing in tunebook.measure asks which kind it holds.
"""

from __future__ import annotations

import json
import secrets
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tunebook.core import config
from tunebook.core.files import replace_atomic
from tunebook.core.sections import Checker as Checker  # what kinds check params with
from tunebook.servers import launcher
from tunebook.servers.start_phases import StartPhases
from tunebook.servers.startup import Diagnosis, StartupFacts

HOST = "127.0.0.1"  # every server tunebook starts listens on loopback only
SERVED_NAME = "tunebook-model"
# vLLM's benchmark client keeps an idle connection for 60 s (aiohttp.TCPConnector(
# keepalive_timeout=60) in vllm/benchmarks/serve.py), while vLLM's API server closes one after
# 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE): a connection the client reuses just as the server closes
# it fails its request with "Server disconnected". The servers tunebook starts keep idle
# connections longer than any client of theirs does (the client, then, always closes first),
# as aiohttp's own server does by default; each row says what was set (http_keep_alive_s).
KEEP_ALIVE_S = 75.0
API_KEY_FILE = "api_key"
# Set by tunebook.measure.executors.ray_cluster for the sweep a Ray task runs: Ray kills a task's
# child processes
# with SIGKILL when its driver dies, and an engine in its own process group would outlive them.
DIE_WITH_PARENT_ENV = launcher.DIE_WITH_PARENT_ENV


class EngineStartError(RuntimeError):
    def __init__(self, diagnosis: Diagnosis, log_path: Path, log_tail: str):
        self.diagnosis = diagnosis
        self.log_path = log_path
        self.log_tail = log_tail
        super().__init__(
            f"{diagnosis.error}\n  log line: {diagnosis.line}\n  fix: {diagnosis.hint}\n"
            f"  full log: {log_path}"
        )


class EngineDiedAtStartError(EngineStartError):
    """A process of the engine was killed while it started (the OOM killer, a crash, a kill
    from outside): not the config's fault, so a replacement may start (the executor decides).
    `death` says which process and how."""

    def __init__(self, diagnosis: Diagnosis, log_path: Path, log_tail: str, death: str):
        super().__init__(diagnosis, log_path, log_tail)
        self.death = death


class EngineRequestError(RuntimeError):
    """A request to the engine's HTTP API failed (status, or no answer)."""


class EngineDiedError(RuntimeError):
    """The engine died while a load point ran on it: which process, and how (the run is
    `interrupted`, run again on resume, and the rest of its config gets a new engine)."""

    def __init__(self, death: str):
        super().__init__(f"the engine died: {death}")
        self.death = death


@dataclass(frozen=True)
class ServerOptions:
    """How the server is started beyond its knobs: what load points need from it, not what is
    measured (so not part of the engine config's id). A kept engine serves a later sweep only
    if it was started with at least the options that sweep needs."""

    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: POST /reset_prefix_cache exists
    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details

    def covers(self, need: ServerOptions) -> bool:
        return (self.dev_mode or not need.dev_mode) and \
            (self.prompt_tokens_details or not need.prompt_tokens_details)

    def union(self, other: ServerOptions) -> ServerOptions:
        """Options that cover both."""
        return ServerOptions(self.dev_mode or other.dev_mode,
                             self.prompt_tokens_details or other.prompt_tokens_details)


@dataclass(frozen=True)
class ResetResult:
    ok: bool
    attempts: int
    detail: str  # what the server said, e.g. '{"success": false}' or 'HTTP 404'


class PointWatch(Protocol):
    """What a server watches over one load point beyond /metrics (a pair: the KV that crossed
    from its prefill to its decode engine): `end()` gives the row's columns and the sections
    it adds to the run's record."""

    def end(self) -> tuple[dict[str, Any], dict[str, Any]]: ...


class NoWatch:
    """A server with nothing to watch per point beyond /metrics."""

    def end(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {}


class Server(Protocol):
    """What tunebook.measure needs of a server, whatever its kind."""

    options: ServerOptions
    api_key: str
    log_path: Path
    facts: StartupFacts | None
    phases: StartPhases | None  # where the start's time went (start_phases)
    startup_s: float | None
    # Engines started at the same time on this machine (one's own included): more than one
    # makes startup_s a time under contention, not this config's own.
    started_together: int
    engines: int  # engine processes it starts (a prefill/decode pair: 2)
    # the deaths of the engines of its config that it replaces, in this sweep (set by the
    # executor; the rows it serves count them)
    replaces: tuple[str, ...]

    @property
    def base_url(self) -> str: ...

    def start(self, on_phase: Callable[[str, float], None] | None = None) -> StartupFacts: ...

    def stop(self) -> None: ...

    def alive(self) -> bool: ...

    def death(self) -> str | None:
        """Why it stopped serving on its own: which of its processes exited and how
        ("engine core exited: SIGKILL (pid …)"); None while every process of it runs (and
        after a stop tunebook asked for). Cheap: asked between every step of a load point."""

    def hung(self) -> str | None:
        """Why it no longer answers, when it does not (a process of it stopped, /health
        silent); None when it answers. Asked when a load point ran out of time."""

    def metrics_text(self, timeout_s: float = 5.0) -> str: ...

    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float = 10.0) -> tuple[int, bytes]: ...

    def reset_prefix_cache(self, attempts: int = 5, wait_s: float = 0.5) -> ResetResult: ...

    def watch_point(self) -> PointWatch:
        """Called before each load point (may raise EngineRequestError)."""

    def log_offsets(self) -> dict[str, int]: ...

    def log_tail(self, n: int = 40, text: str | None = None) -> str: ...

    def row(self) -> dict[str, Any]:
        """The result row's columns about this server: start-up facts, phases, start time."""

    def record(self, root: Path) -> dict[str, Any]:
        """The run record's `engine` section (argv, log relative to `root`, process tree): no
        secret and no machine path."""


class ServerBase:
    """What every server class shares: `with` starts and stops it, its loopback URL, and the
    row columns its start gives (start-up facts, phases, start time)."""

    port: int | None = None
    facts: StartupFacts | None = None
    phases: StartPhases | None = None
    startup_s: float | None = None
    started_together = 1
    engines = 1  # engine processes it starts (a prefill/decode pair: 2)
    disaggregated = False  # the row's column: a prefill/decode pair says True
    # How long the server keeps an idle client connection open (None: the kind sets none)
    keep_alive_s: float | None = None
    start_method: str | None = None  # tunebook.servers.launcher: exec, launcher, launcher+fork
    start_method_note: str | None = None  # why a start that could be fast was plain
    replaces: tuple[str, ...] = ()  # deaths of the engines of its config before it (the sweep's)

    def start(self, on_phase: Callable[[str, float], None] | None = None) -> StartupFacts:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> ServerBase:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def row(self) -> dict[str, Any]:
        return {**(self.facts.as_row() if self.facts else {}),
                **(self.phases.as_row() if self.phases else {}),
                "startup_s": self.startup_s, "engines_started_together": self.started_together,
                "disaggregated": self.disaggregated, "http_keep_alive_s": self.keep_alive_s,
                "start_method": self.start_method, "start_method_note": self.start_method_note,
                "engine_replaces": len(self.replaces)}


def api_key() -> str:
    """The API key tunebook's engines require: random, made once per user and kept in the
    state folder (mode 0600). Not a fresh one per engine: vLLM 0.26 puts VLLM_API_KEY among
    the variables it hashes into torch.compile's cache key (vllm.envs.compile_factors; 0.32
    leaves it out), so a new key made every start compile from scratch — 30-40 s per start
    on the H200 (docs/start-phases.md)."""
    path = config.state_dir() / API_KEY_FILE
    try:
        key = path.read_text().strip()
        if len(key) >= 32 and (path.stat().st_mode & 0o077) == 0:
            return key
    except OSError:
        pass
    key = secrets.token_urlsafe(24)
    try:
        replace_atomic(path, key.encode(), mode=0o600)
    except OSError:  # a read-only home: this process's engines share a key, nothing is kept
        pass
    return key


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Could a new server listen on this port? (SO_REUSEADDR, as uvicorn sets: connections
    left in TIME_WAIT by the last server do not count as taken.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
            s.listen(1)
        except OSError:
            return False
        return True


def http_request(base_url: str, api_key: str, method: str, path: str, body: Any = None,
                 timeout_s: float = 10.0) -> tuple[int, bytes]:
    """One HTTP request to a server of ours (an engine, a disaggregated pair's proxy) with its
    API key; (status, body). A non-2xx status is returned, not raised; no answer at all raises
    EngineRequestError."""
    headers = {"Authorization": f"Bearer {api_key}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(f"{base_url}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise EngineRequestError(f"{method} {path}: no answer ({reason})") from None


def portable_argv(argv: list[str]) -> list[str]:
    """An engine's command line as stored with its runs: the model cache's path becomes
    `$TUNEBOOK_CACHE` (shared reports carry no machine paths; a folder's name keeps its preset
    and content hash)."""
    cache = config.model_cache_dir().expanduser()
    roots = sorted({str(cache), str(cache.resolve())}, key=len, reverse=True)
    out = []
    for a in argv:  # also inside an argument (a draft's folder in --speculative-config's JSON)
        for root in roots:
            a = a.replace(root, f"${config.CACHE_ENV}")
        out.append(a)
    return out
