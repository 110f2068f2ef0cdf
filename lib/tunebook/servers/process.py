"""A server as a child process group: started, watched, always stopped.

- Runs the server's command line (each kind says its own: tunebook.servers.vllm,
  tunebook.servers.sglang) in its own process group, on 127.0.0.1, a free port.
- An API key goes through the environment, never argv, so it is not in `ps`, in the
  process-tree record or in the log (tunebook.servers.base.api_key).
- The whole log is written to a file; ready means `/health` answers 200.
- Stopped with TERM then KILL of the whole group on every exit path: `with`, exceptions,
  KeyboardInterrupt, interpreter exit (atexit). Servers left by a process that died hard
  (a killed Jupyter kernel) are found through their pid files and reaped on the next start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tunebook.core import config
from tunebook.core.files import replace_atomic
from tunebook.core.hardware import machine
from tunebook.core.threads import Background
from tunebook.models.presets import ModelRef, weights_gib_estimate
from tunebook.servers import compile_cache, launcher
from tunebook.servers.base import (
    DIE_WITH_PARENT_ENV,
    EngineDiedAtStartError,
    EngineRequestError,
    EngineStartError,
    NoWatch,
    PointWatch,
    ResetResult,
    ServerBase,
    ServerOptions,
    api_key,
    free_port,
    http_request,
    portable_argv,
)
from tunebook.servers.shm import mapped_by_any, reap_shared_memory, shared_memory_of
from tunebook.servers.start_phases import (
    StartPhases,
    parse_phases,
    ready_line,
    running_phase,
    spawn_line,
)
from tunebook.servers.startup import Diagnosis, StartupFacts, diagnose, strip_ansi
from tunebook.servers.watchdog import KILLED_BY, Death, Watchdog, returncode_text

RESET_OK, RESET_BUSY, RESET_FAILED = "ok", "busy", "failed"  # reset_answer's verdicts
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# Where tunebook.vllm_hooks' BlockTableScheduler writes its steps (the same name there: that
# module imports vLLM, so tunebook never imports it).
BLOCK_TABLE_ENV = "TUNEBOOK_BLOCK_TABLE_LOG"


def state_dir() -> Path:
    """Where pid files of live engines are kept (one per engine)."""
    d = config.state_dir() / "engines"
    d.mkdir(parents=True, exist_ok=True)
    return d




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
    def write(pgid: int, port: int, log: Path, scratch: Path | None = None,
              leftovers: str | None = None) -> _PidFile:
        me = psutil.Process()
        p = state_dir() / f"{pgid}.json"
        # whole or not at all: reap_orphans (another engine's start) may read it at any time;
        # the temp file it is written to ends in .tmp, which that glob of *.json never sees
        replace_atomic(p, json.dumps({"pgid": pgid, "port": port, "log": str(log),
                                      "scratch": str(scratch) if scratch else None,
                                      "leftovers": leftovers,
                                      "owner_pid": me.pid,
                                      "owner_started": me.create_time()}).encode())
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


# Sessions. An engine (and the launcher it may be forked from) is a process group of its own,
# stopped and reaped as a whole (killpg), in the session of the process that starts it — not
# in a session of its own. Linux schedules each session as one group (sched_autogroup), and
# vLLM's engine core and worker spin (sched_yield) on their shared-memory queues while they
# serve: an engine in a session of its own kept the benchmark client (vLLM's, in this process)
# off a CPU for about a second at a time on 2 cores, its requests' tokens then arriving all at
# once (benchmarks/run_stalls.py; docs/suite-time.md). In the client's session they yield to it.
STOP_GRACE_S = 20.0  # a serving engine: time to close its connections and its engine core
NOT_READY_GRACE_S = 3.0  # one that never became ready (Engine.stop says why)

# vLLM's own lines naming a process of it that died, with multiprocessing's exit code (-9:
# SIGKILL): a start whose watchdog had not yet seen that process still learns how it ended
_LOGGED_DEATHS = (re.compile(r"Worker proc (\S+) died unexpectedly \(exit code: (-\d+)\)"),
                  re.compile(r"Failed core proc\(s\): \{'([^']+)': (-\d+)"))


def logged_death(log: str) -> tuple[Death | None, str | None]:
    """The last process vLLM's log says a signal killed, as a Death (pid unknown: 0), and the
    log line that says so."""
    found: tuple[Death | None, str | None] = (None, None)
    for pattern in _LOGGED_DEATHS:
        for m in pattern.finditer(log):
            how = returncode_text(int(m.group(2)))
            if how.startswith(KILLED_BY):
                role = "worker" if "Worker" in pattern.pattern else "engine core"
                line = log[log.rfind("\n", 0, m.start()) + 1:log.find("\n", m.end())]
                found = (Death(role, m.group(1), 0, how, time.time()), line.strip())
    return found


def kill_group(pgid: int, grace_s: float = STOP_GRACE_S) -> None:
    """TERM the whole process group, wait, then KILL whatever is left; then unlink the
    shared-memory segments its processes had mapped. A process killed before it could close
    them (and the resource tracker that would unlink them, killed with the group) leaves them
    in /dev/shm: memory on a GPU box, where vLLM's message queues are touched. Only names the
    group mapped, only once every process of it is gone, and none another process maps."""
    shm = shared_memory_of(_group_members(pgid))
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
    left = {p for p in shm if p.exists()} if not _group_members(pgid) else set()
    for path in left - mapped_by_any(left):  # e.g. a launcher the engine was forked from
        path.unlink(missing_ok=True)


def remove_leftovers(pattern: str | None, log: str) -> None:
    """The files a server's log names with `pattern` (ProcessServer.leftover_files)."""
    for path in re.findall(pattern, log) if pattern else ():
        Path(path).unlink(missing_ok=True)


def remove_engine_files(scratch: Path | str | None, pattern: str | None, log: Path) -> None:
    """What a stopped engine leaves outside its own folders: its scratch folder, and the files
    its log names with `pattern`. For its stop and the orphan reaper alike: call it once every
    process of the engine is gone (a live one may still use them)."""
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    with contextlib.suppress(OSError):
        remove_leftovers(pattern, log.read_text(errors="replace"))


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
        if not _group_members(pgid) and info.get("log"):
            remove_engine_files(info.get("scratch"), info.get("leftovers"), Path(info["log"]))
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


_LIVE: set[ProcessServer] = set()


@atexit.register
def _stop_all() -> None:
    for eng in list(_LIVE):
        eng.stop()


class ProcessServer(ServerBase, ABC):
    """One engine server as a child process group (a tunebook.servers.base.Server). A kind
    says its command line (`build_argv`), how it reads its start-up log (`parse_facts`) and how
    it resets its prefix cache; the rest is here. Use as a context manager, or call
    start()/stop()."""

    kind: str = ""  # the engine_kind knob's value: start_phases reads each kind's log lines
    server_module = ""  # the module its API server runs (names that process in the tree)
    reset_path = ""  # POST here empties the prefix cache
    fast_start_ok = False  # its server can be forked from a launcher (tunebook.servers.launcher)
    preload: tuple[str, ...] = ()  # what else a launcher imports for it (each if it exists)
    fast_start: bool | None = None  # params' fast_start (None: TUNEBOOK_FAST_START decides)
    # how the kind titles the processes its server makes (the watchdog watches those too)
    process_titles: tuple[str, ...] = ()
    # files outside `scratch` that its processes make and leave behind, as its log names them
    # (one group: the path): its stop removes them once every process is gone, and so does
    # the orphan reaper (the pid file keeps the pattern)
    leftover_files: str | None = None

    def __init__(self, model: ModelRef, knobs: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | str = "engine.log",
                 startup_timeout_s: float = 900.0, options: ServerOptions | None = None):
        self.model = model
        self.knobs = dict(knobs or {})
        self.env = dict(env or {})
        self.options = options or ServerOptions()
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.python = sys.executable
        self.api_key = api_key()
        self.port: int | None = None
        self.proc: subprocess.Popen | launcher.Forked | None = None
        self.facts: StartupFacts | None = None
        self.phases: StartPhases | None = None  # where the start's time went (start_phases)
        self.startup_s: float | None = None
        # Engines started at the same time on this machine (Sweep's start_together): more
        # than one makes startup_s a time under contention, not this config's own.
        self.started_together = 1
        self.process_tree: list[dict[str, Any]] = []
        self._pidfile: _PidFile | None = None
        self.watchdog: Watchdog | None = None
        self._spawned_at: float | None = None
        self._dead_by: float | None = None  # when stop() began or its death was found
        # a folder of its own for the files its processes make where they please (vLLM's
        # ZMQ sockets: /tmp/<uuid>, one per start, never removed), removed at its stop
        self.scratch: Path | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def argv(self) -> list[str]:
        return self.build_argv(self.port or 0)

    @abstractmethod
    def build_argv(self, port: int) -> list[str]:
        """The server's command line (no secret in it: it is stored with every run)."""

    @abstractmethod
    def parse_facts(self, log: str) -> StartupFacts:
        """The start-up facts (Fig 1.1) from the start's log."""

    @abstractmethod
    def reset_answer(self, status: int, text: str) -> tuple[str, str]:
        """What the reset endpoint's answer means: (RESET_OK, RESET_BUSY or RESET_FAILED,
        what to say)."""

    def kind_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """What this kind adds to the server's environment `env` (as built so far)."""
        return {}


    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.death() is None

    def death(self) -> str | None:
        found = self.watchdog.death() if self.watchdog is not None else None
        return str(found) if found is not None else None

    def hung(self) -> str | None:
        stopped = self.watchdog.stopped() if self.watchdog is not None else None
        if stopped:
            return f"the engine stopped answering: its {stopped}"
        if self.proc is not None and not self._health(timeout_s=5):
            return "the engine stopped answering: GET /health gave no answer in 5 s"
        return None

    def start(self, on_phase: Callable[[str, float], None] | None = None) -> StartupFacts:
        """Start and wait until /health answers. Raises EngineStartError with a diagnosis."""
        reap_orphans()
        self.port = free_port()
        self.scratch = Path(tempfile.mkdtemp(prefix="tunebook-engine-"))
        env = self.server_env()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            # tunebook's clock in the log: the phases of the start are cut from this line
            log.write(spawn_line().encode())
            log.flush()
            t0, self._spawned_at = time.monotonic(), time.time()
            self.proc = self._launch(env, log)
        self.watchdog = Watchdog(self.proc.pid, self.process_titles, self.proc.poll)
        _LIVE.add(self)
        self._pidfile = _PidFile.write(self.proc.pid, self.port, self.log_path, self.scratch,
                                       self.leftover_files)
        try:
            self._wait_ready(t0, on_phase)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        with open(self.log_path, "ab") as log:
            log.write(ready_line(self.startup_s).encode())
        text = self.log_text()
        self.facts = self.parse_facts(text)
        self.phases = parse_phases(text, self.startup_s, engine=self.kind)
        self.watchdog.scan(force=True)  # every process it serves with is up now
        self.process_tree = self.snapshot_process_tree()
        return self.facts

    def _launch(self, env: dict[str, str], log: Any) -> subprocess.Popen | launcher.Forked:
        """The server's process: forked by a launcher that has imported it (when the kind
        can, fast starts are on and the launcher can take it), else a plain exec; which one,
        and why not the fast one, goes into the row."""
        choice = launcher.choose(self.fast_start_ok, self.fast_start)
        if choice.method != launcher.EXEC:
            forked, choice = launcher.launch(self.python, self.argv, env, self.log_path, choice,
                                             self.preload)
            if forked is not None:  # the note: why only the API server was forked, if so
                self.start_method, self.start_method_note = choice.method, choice.why
                return forked
        self.start_method, self.start_method_note = launcher.EXEC, choice.why
        return subprocess.Popen(
            self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, process_group=0, close_fds=True,  # the owner's session (Sessions, above)
            preexec_fn=launcher.die_with_parent if os.environ.get(DIE_WITH_PARENT_ENV) else None,
        )

    def server_env(self) -> dict[str, str]:
        """The server's environment: ours, the config's VLLM_* variables, then tunebook's own
        (the API key, no usage stats, no colour; dev mode only when the options ask)."""
        # the compile cache first: the shell and the config may point it elsewhere
        env = {**self.compile_env(), **config.user_environ(), **self.env,
               "VLLM_API_KEY": self.api_key, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "PYTHONUNBUFFERED": "1",
               # Jupyter kernels force colour; a log full of escape codes is hard to read.
               "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1"}
        for name in ("OPENAI_API_KEY", "FORCE_COLOR", "CLICOLOR_FORCE", DEV_MODE_ENV):
            env.pop(name, None)
        if self.options.dev_mode:  # only when asked: never inherited from the shell
            env[DEV_MODE_ENV] = "1"
        env.update(self.kind_env(env))
        env[BLOCK_TABLE_ENV] = str(self.block_table_path)  # read only by tunebook's scheduler
        return env

    def compile_env(self) -> dict[str, str]:
        """Where this server's compile caches live (tunebook.servers.compile_cache): those of
        the vLLM installed here; a kind that runs another build names its own."""
        return compile_cache.server_env()

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
        assert self.watchdog is not None
        while True:
            elapsed = time.monotonic() - t0
            self.watchdog.scan()
            died = self.watchdog.death()
            if died is not None or (self.proc is not None and self.proc.poll() is not None):
                # asked again: the root may have exited between the watchdog's look and poll
                self._fail(exit_code=self.proc.poll() if self.proc is not None else None,
                           died=died or self.watchdog.death())
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
            time.sleep(0.25)

    def _fail(self, *, timed_out: bool = False, exit_code: int | None = None,
              died: Death | None = None) -> None:
        text = self.log_text()
        killed, line = ((died, None) if died is not None and died.how.startswith(KILLED_BY)
                        else logged_death(text))
        if killed is not None:  # not the config: a process of it was killed from outside
            raise EngineDiedAtStartError(Diagnosis(
                f"the engine died during its start: {killed}", line,
                "a process of the engine was killed from outside (the OOM killer, a crash, "
                "a kill): a replacement engine is started; if it happens again, look at the "
                "machine's memory (dmesg) and what else runs there"),
                self.log_path, self.log_tail(text=text), str(killed))
        weights = (weights_gib_estimate(self.model.config, str(self.knobs.get("dtype", "auto")),
                                        self.knobs.get("quantization"))
                   if self.model.config else None)
        diag = diagnose(text, self.knobs, timed_out=timed_out, exit_code=exit_code,
                        device_memory_gib=machine().get("gpu_memory_gib"), weights_gib=weights)
        raise EngineStartError(diag, self.log_path, self.log_tail(text=text))

    def _health(self, timeout_s: float = 2.0) -> bool:
        # SGLang checks the key on /health too; vLLM ignores it there
        req = urllib.request.Request(f"{self.base_url}/health",
                                     headers={"Authorization": f"Bearer {self.api_key}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc is not None:
            # an engine that never answered /health, or one a process of which died, has
            # nothing to drain: a short grace. vLLM 0.32's API server waits for its engine
            # core's handshake in a blocking zmq poll inside its event loop, where its SIGTERM
            # handler cannot run: stopped there (a start that timed out, Ctrl-C during a
            # start) it sat out the whole 20 s grace
            died = self.death()  # asked before the stop: what the stop ends is no death
            found = self.watchdog.death() if self.watchdog is not None else None
            # the dead engine's own segments were made before its death was found; a
            # replacement may be starting meanwhile, and its fresh segments are not ours
            self._dead_by = found.found_at if found is not None else time.time()
            stuck = self.watchdog.stopped() if self.watchdog is not None else None
            if self.watchdog is not None:
                self.watchdog.close()
            broken = self.startup_s is None or died is not None or stuck is not None
            kill_group(self.proc.pid, grace_s=NOT_READY_GRACE_S if broken else STOP_GRACE_S)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._pidfile:
            self._pidfile.remove()
            self._pidfile = None
        if self.death() is not None and self._spawned_at is not None:
            # its processes that died first took their segments' names with them (kill_group
            # saw only the living): what it made and nobody maps now goes too
            reap_shared_memory(min_age_s=0, since=self._spawned_at,
                               until=self._dead_by)
        self._remove_leftovers()
        _LIVE.discard(self)

    def _remove_leftovers(self) -> None:
        if self.proc is not None and _group_members(self.proc.pid):
            return  # a process of it outlived the stop: its files may be in use
        remove_engine_files(self.scratch, self.leftover_files, self.log_path)
        self.scratch = None

    # -- talking to it (loopback only) -----------------------------------------------------
    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float = 10.0) -> tuple[int, bytes]:
        """One HTTP request to this engine, with its API key; (status, body). A non-2xx status
        is returned, not raised; no answer at all raises EngineRequestError."""
        if self.port is None:
            raise EngineRequestError("the engine was not started")
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["answer"] = http_request(self.base_url, self.api_key, method, path, body,
                                             timeout_s)
            except BaseException as e:  # noqa: BLE001 - raised below, on the caller's thread
                box["error"] = e

        # an engine whose engine core died may still accept a request and never answer it:
        # the request ends when the watchdog sees the death, not at its timeout
        call_bg = Background(call, "engine-request")
        while not call_bg.wait(0.1):
            if (died := self.death()) is not None:
                raise EngineRequestError(f"{method} {path}: the engine died ({died})")
        if "error" in box:
            raise box["error"]
        return box["answer"]

    def metrics_text(self, timeout_s: float = 5.0) -> str:
        """`GET /metrics`: vLLM's Prometheus text (tunebook.servers.metrics parses it)."""
        status, body = self.request("GET", "/metrics", timeout_s=timeout_s)
        if status != 200:
            raise EngineRequestError(f"GET /metrics: HTTP {status}")
        return body.decode(errors="replace")

    def reset_prefix_cache(self, attempts: int = 5, wait_s: float = 0.5) -> ResetResult:
        """POST the kind's reset endpoint (`reset_path`). An engine that says blocks or
        requests are still in use (`reset_answer`: busy) is asked again, with a doubling wait
        (0.5 + 1 + 2 + 4 s over 5 attempts). Never raises: the result says what happened."""
        detail = ""
        for attempt in range(1, attempts + 1):
            try:
                status, body = self.request("POST", self.reset_path, timeout_s=30.0)
            except EngineRequestError as e:
                return ResetResult(False, attempt, str(e))
            answer, detail = self.reset_answer(status, body.decode(errors="replace").strip()[:200])
            if answer != RESET_BUSY:
                return ResetResult(answer == RESET_OK, attempt, detail)
            if attempt < attempts:
                time.sleep(wait_s * 2 ** (attempt - 1))
        return ResetResult(False, attempts, detail)

    def watch_point(self) -> PointWatch:
        return NoWatch()

    # -- reading ----------------------------------------------------------------------------
    def record(self, root: Path) -> dict[str, Any]:
        # no secrets in argv (the key is in the environment), and no machine paths: the model
        # folder is named relative to the model cache
        return {"argv": portable_argv(self.argv[1:]), "env": self.env,
                "log": os.path.relpath(self.log_path, root), "process_tree": self.process_tree,
                "replaces": list(self.replaces)}

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
                        # (a forked API server's title is its whole command line: its
                        # first word, as a plain start's)
                        "title": cmd[0].split()[0] if cmd and cmd[0].strip() else p.name(),
                        "role": _role(p.name(), cmd, self.server_module),
                        "rss_gib": p.memory_info().rss / 2**30,
                        "threads": p.num_threads(),
                        "holds_gpu": p.pid in gpu_pids,
                    })
            except psutil.Error:
                continue
        return tree


def _role(name: str, cmd: list[str], server_module: str) -> str:
    text = (name + " " + " ".join(cmd[:3])).lower()
    if "enginecore" in text or "engine_core" in text:
        return "engine core"
    if "worker" in text:
        return "worker"
    if (server_module and server_module in " ".join(cmd)) or "apiserver" in text:
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
