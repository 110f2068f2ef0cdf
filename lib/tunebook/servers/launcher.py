"""Engines started by forking a process that has already imported the server (fast starts).

A plain start execs `python -m vllm.entrypoints.openai.api_server …`: the API server imports
torch and vLLM (~5 s on a 2-core CPU box, ~21 s on the H200), then vLLM spawns its engine core
(and, on CPU, a worker), each importing them again. The launcher is one long-lived process per
tunebook process and server module: it imports the module once, without touching an
accelerator, then starts each engine by forking:

- **API server fork**: the child resets what it inherited (session, stdio to the engine's log,
  environment, working folder, signals) and runs the module as `__main__`, as `python -m` would.
- **engine-core fork** (`VLLM_WORKER_MULTIPROC_METHOD=fork`): vLLM's engine core and workers
  are forked from that child instead of spawned. vLLM's CPU platform forces `spawn` while it
  builds the config (vllm/platforms/cpu.py); the child puts `fork` back right after that call.

What stays as through exec: argv, the environment (set whole in the child), the log, the
process group (the engine's pgid is its pid), its pid file (written by the owner, as for a
plain start). What cannot: a variable vLLM reads while it is imported (the launcher records
which ones it read) set differently for this engine — that start is a plain one, and says why.

Protocol (one JSON line each way on a Unix socket): `{"op": "start", argv, env, cwd, log}` →
`{"pid": N}`; the launcher reaps its children and writes each exit code to `exits/<pid>`.
`python -m tunebook.servers.launcher MODULE SOCKET` runs one (its owner starts it).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tunebook.core.files import replace_atomic
from tunebook.core.sections import SECTIONS, Checker, Section

FAST_START_ENV = "TUNEBOOK_FAST_START"  # 1: fast starts; api: the API server fork only; 0: plain
MP_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
# start_method, in every row: how its engine was started
EXEC, API_FORK, FULL_FORK = "exec", "launcher", "launcher+fork"
LOST = -255  # exit code of an engine whose launcher died before it could say
# Read once, when a process or a library in it starts (the interpreter, the dynamic loader,
# OpenMP, malloc): a forked engine has the launcher's, whatever its environment says.
STARTUP_VARS = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MALLOC_")
# what vLLM's CPU executor sets for each worker it starts, for the worker's OpenMP runtime
OMP_PLACEMENT = ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY",
                 "KMP_AFFINITY")
# A running launcher's folder, in the environment of the processes its owner starts (a papermill
# kernel, a spawned sweep): they fork their engines from it instead of importing vLLM into one
# of their own. Not for engines that must die with their process (DIE_WITH_PARENT_ENV).
LAUNCHER_ENV = "TUNEBOOK_LAUNCHER"
# set for the sweep a Ray task runs: its engines die with it (tunebook.servers.base says why)
DIE_WITH_PARENT_ENV = "TUNEBOOK_ENGINE_DIES_WITH_PARENT"
READY_TIMEOUT_S = 300.0  # importing the server (cold page cache, a slow disk)
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # there: an NVIDIA GPU (no CUDA touched)
GPU_NO_CORE_FORK = (
    "an NVIDIA GPU: the API server forked, its engine core spawned as vLLM does (a forked "
    "engine core's torch.compile autotuning failed on an H100 with vLLM 0.26: "
    "outputs/h100/engine-deaths/forked.json); TUNEBOOK_FAST_START=1 forks it too")


# -- in the launcher process -------------------------------------------------------------------

_ENV_CODE = ("<frozen os>", "<frozen _collections_abc>", os.__file__)


def _caller() -> Any:
    """The first frame outside os and collections.abc (the code touching os.environ)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename in _ENV_CODE:
        f = f.f_back
    return f


def _import_recording(module: str) -> dict[str, str | None]:
    """Import `module`; the environment variables it looked up meanwhile (get, `in`, getenv,
    [key]), each with its value before the import (None: unset; the import sets some itself
    before reading them). A walk over the whole environment (`items()`, `dict(os.environ)`,
    copying it for a subprocess) is no lookup: it would make every variable count, per-engine
    paths included. A walk's values are read once each by the code that walked."""
    before = dict(os.environ)
    read: set[str] = set()
    walk_by: list[Any] = [None, set()]  # the code that last walked, and the keys it got
    get, walk = os._Environ.__getitem__, os._Environ.__iter__

    def recording(self: os._Environ, key: str) -> str:
        if isinstance(key, str):
            if key in walk_by[1] and _caller() is walk_by[0]:
                walk_by[1].discard(key)  # the walk's own read, once: a later lookup counts
            else:
                read.add(key)
        return get(self, key)

    def walking(self: os._Environ):  # noqa: ANN202
        by = _caller()
        if by is not walk_by[0]:
            walk_by[:] = [by, set()]
        for key in walk(self):
            walk_by[1].add(key)
            yield key

    os._Environ.__getitem__ = recording  # type: ignore[method-assign]
    os._Environ.__iter__ = walking  # type: ignore[method-assign]
    try:
        __import__(module)
    finally:
        os._Environ.__getitem__ = get  # type: ignore[method-assign]
        os._Environ.__iter__ = walk  # type: ignore[method-assign]
        walk_by.clear()
    return {k: before.get(k) for k in sorted(read)}


def _keep_fork_on_cpu() -> None:
    """vLLM's CPU platform sets VLLM_WORKER_MULTIPROC_METHOD=spawn in check_and_update_config;
    put back what the engine's environment asked for right after it (no-op elsewhere), and
    give each forked worker the OpenMP threads and cores vLLM asks for (_omp_as_spawned)."""
    try:
        from vllm.platforms import cpu
    except Exception:  # noqa: BLE001 - not a CPU build: nothing forces spawn there
        return
    inherited = {k: os.environ.get(k) for k in OMP_PLACEMENT}
    os.register_at_fork(after_in_child=lambda: _omp_as_spawned(inherited))
    original = cpu.CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]
    wanted = os.environ.get(MP_METHOD_ENV)

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        original(cls, vllm_config)
        if wanted:
            os.environ[MP_METHOD_ENV] = wanted

    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


def _omp_cpus(env: dict[str, str | None]) -> set[int]:
    """The cores an OpenMP placement in `env` names, as vLLM's CPU executor writes them
    (vllm/utils/ompmultiprocessing.py): OMP_PLACES "{0,1}", GOMP_CPU_AFFINITY "0 1" (ranges
    "0-3" too), KMP_AFFINITY "...,proclist=[0,1]"."""
    cpus: set[int] = set()
    if places := env.get("OMP_PLACES"):
        cpus.update(int(x) for x in re.findall(r"\d+", places))
    elif gomp := env.get("GOMP_CPU_AFFINITY"):
        for part in gomp.replace(",", " ").split():
            lo, _, hi = part.partition("-")
            if lo.isdigit():
                cpus.update(range(int(lo), int(hi if hi.isdigit() else lo) + 1))
    elif m := re.search(r"proclist=\[([\d,\s-]+)\]", env.get("KMP_AFFINITY") or ""):
        cpus.update(int(x) for x in re.findall(r"\d+", m[1]))
    return cpus


def _omp_as_spawned(inherited: dict[str, str | None]) -> None:
    """In a process forked from a forked engine (on CPU: its worker), right after the fork:
    the OpenMP threads and cores vLLM asked for. vLLM's CPU executor sets OMP_NUM_THREADS and
    OMP_PLACES (or GOMP_/KMP_ affinity) around starting each worker, for the worker's OpenMP
    runtime to read as it starts; a forked worker's runtime started in the launcher and reads
    nothing, so it ran as many threads as the box has cores, on every core (a plain start's
    worker on 2 cores: one thread, on core 0). Its threads, made later, inherit both."""
    now = {k: os.environ.get(k) for k in OMP_PLACEMENT}
    if now == inherited:  # not a worker vLLM placed (the engine core, a helper)
        return
    with contextlib.suppress(OSError, ValueError):
        if cpus := _omp_cpus(now) & os.sched_getaffinity(0):
            os.sched_setaffinity(0, cpus)
    threads = now.get("OMP_NUM_THREADS") or ""
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


def die_with_parent() -> None:
    """In an engine's process, before it becomes the server (Linux): SIGTERM when the process
    that started it dies (vLLM's server then stops its engine core). Asked by the environment
    (TUNEBOOK_ENGINE_DIES_WITH_PARENT, set for a Ray task's sweep); for a forked engine the
    parent is the launcher, which exits when its owner does."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _flag(argv: list[str], name: str) -> str | None:
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name), None)


def _release_listener(port: int) -> None:
    """In a process forked from a forked API server (its engine core, their workers): let go
    of the API server's socket on `port` (bound, listened on later), which a fork inherits (a
    spawned process does not). Held there, a killed API server's port would go on accepting
    connections that nobody serves: a client's next request would hang, not be refused. The fd is
    pointed at /dev/null, not closed: the socket object copied into this process may close
    that number later."""
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            try:
                s = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)  # a dup: ours
            except OSError:
                continue  # not a socket
            try:
                # bound to the port and connected to nobody: vLLM binds it before it forks its
                # engine core and only listens on it later (a connection has a peer)
                ours = s.getsockname()[1] == port and not _peer(s)
            except (OSError, IndexError, TypeError):
                ours = False
            finally:
                s.close()
            if ours:
                os.dup2(null, fd)
    finally:
        os.close(null)


def _peer(s: socket.socket) -> bool:
    try:
        s.getpeername()
    except OSError:
        return False
    return True


def _title(title: str) -> None:
    try:
        import setproctitle
    except ImportError:  # vLLM depends on it; without it, titles stay the launcher's
        return
    setproctitle.setproctitle(title)


def _child(req: dict[str, Any], listener: socket.socket, conn: socket.socket,
           settled: int) -> None:
    """In the forked child: become the engine `req` asks for, as `python -m` would; never
    returns. `settled` is written to (and closed) once it leads its own process group."""
    code = 1
    try:
        if req["env"].get(DIE_WITH_PARENT_ENV):
            launcher = os.getppid()
            die_with_parent()
            if os.getppid() != launcher:  # it died before the line above: nobody would stop us
                os._exit(1)
        listener.close()
        conn.close()
        # a plain start's signal handling before anyone can signal it: the launcher's SIGTERM
        # handler would make a stop right after the fork an exit with code 0
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        # its own process group (stopped and reaped as a whole, as a plain start), in the
        # owner's session (tunebook.servers.process, Sessions)
        os.setpgid(0, 0)
        os.write(settled, b"1")
        os.close(settled)
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        now = datetime.now()
        print(f"tunebook: forked by the launcher at {now:%m-%d %H:%M:%S}.{now.microsecond:06d}",
              flush=True)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        argv = req["argv"]
        module = argv[2]
        if req.get("core_fork"):
            _keep_fork_on_cpu()
        import runpy
        import warnings

        # runpy warns that the module it runs as __main__ is imported already (the launcher
        # imported it): true and meant, and a plain start's log has no such line
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message=f"'{module}' found in sys.modules after import")
        sys.argv = [argv[0], *argv[3:]]
        _title(" ".join(argv))  # what `ps` shows for a plain start
        port = _flag(argv, "--port")
        if port is not None and port.isdigit():
            os.register_at_fork(after_in_child=lambda: _release_listener(int(port)))
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - what a plain start would print, into the log
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()  # vLLM's own exit handlers, as at a normal exit
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def serve(sock_path: Path, module: str, preload: list[str]) -> None:
    """The launcher: import `module` and what else its engines will import (`preload`, each
    where this vLLM has it), listen on `sock_path`, fork an engine per request, reap them;
    exit when the owner (its parent) is gone or on SIGTERM."""
    owner = os.getppid()
    # Titled now, before anything touches the environment: setproctitle takes over the
    # argv/environ memory on its first call and cannot once the environment was rewritten
    # (as each child does); its children then title themselves (vLLM's VLLM::EngineCore).
    # The title names no server module: nothing takes the launcher for an engine.
    _title("tunebook-launcher")
    read = _import_recording(module)
    for extra in preload:
        try:
            read.update({k: v for k, v in _import_recording(extra).items() if k not in read})
        except Exception as e:  # noqa: BLE001 - another vLLM version: imported on demand
            print(f"launcher: not preloaded: {extra} ({type(e).__name__}: {e})", flush=True)
    exits = sock_path.parent / "exits"
    exits.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    listener.listen(8)
    listener.settimeout(0.2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # what was imported stays out of the collector's walks: a child's first collection would
    # otherwise touch (and so copy) every page it shares with the launcher
    gc.collect()
    gc.freeze()
    after = dict(os.environ)
    hello = {"pid": os.getpid(), "module": module, "read_at_import": read,
             "set_at_import": {k: v for k, v in after.items() if k in read and read[k] != v}}
    # ready; whole or not at all: the owner reads it as soon as it exists
    replace_atomic(sock_path.parent / "hello.json", json.dumps(hello).encode())
    try:
        while os.getppid() == owner:
            _reap(exits)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(30)
                req = json.loads(conn.makefile("rb").readline())
                settled, tell = os.pipe()
                try:
                    pid = os.fork()
                except OSError as e:
                    os.close(settled)
                    os.close(tell)
                    conn.sendall((json.dumps({"error": f"fork: {e}"}) + "\n").encode())
                    continue
                if pid == 0:
                    os.close(settled)
                    _child(req, listener, conn, tell)
                os.close(tell)
                # answered once the child leads its own process group (or is gone): the
                # owner may stop the engine at once, and stops it by that group
                os.read(settled, 1)
                os.close(settled)
                conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
    finally:
        _reap(exits)
        with contextlib.suppress(OSError):
            sock_path.unlink()


def _reap(exits: Path) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        replace_atomic(exits / str(pid), str(os.waitstatus_to_exitcode(status)).encode())


# -- in the owner (the tunebook process) ------------------------------------------------------

class Forked:
    """An engine the launcher forked, with the part of subprocess.Popen a server uses (pid,
    poll, wait, returncode). Its exit code comes from the launcher, which reaps it and writes
    it down; while the launcher lives, an engine that has exited is waited for until the code
    is there (no grace window to run out under load); if the launcher died first, the code is
    LOST."""

    def __init__(self, pid: int, exits: Path, launcher_alive: Callable[[], bool]):
        self.pid = pid
        self.exits = exits
        self.launcher_alive = launcher_alive
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        code = self._exit_file()
        while code is None and not _running(self.pid):
            if not self.launcher_alive():
                code = self._exit_file()
                code = LOST if code is None else code
                break
            time.sleep(0.02)  # exited: the launcher reaps it within its next turn
            code = self._exit_file()
        self.returncode = code
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def _exit_file(self) -> int | None:
        try:
            return int((self.exits / str(self.pid)).read_text())
        except (OSError, ValueError):
            return None


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class Choice:
    """How the next engine starts: `method` (EXEC, API_FORK, FULL_FORK) and, for a plain
    start where a fast one was wanted, why."""

    method: str
    why: str | None = None


class Launcher:
    """The owner's handle on one launcher process (started on first use)."""

    def __init__(self, python: str, module: str, folder: Path, preload: tuple[str, ...] = ()):
        self.python, self.module, self.folder, self.preload = python, module, folder, preload
        self.proc: subprocess.Popen | None = None
        self.borrowed_pid: int | None = None  # another process's launcher (attach)
        self.read_at_import: dict[str, str | None] = {}
        self.set_at_import: dict[str, str] = {}  # what the import itself set of those
        self.start_env: dict[str, str] = {}  # its STARTUP_VARS when it was started
        self.error: str | None = None  # why it could not start: every start is plain then
        self._stopping = False

    @property
    def sock_path(self) -> Path:
        return self.folder / "launcher.sock"

    @classmethod
    def attach(cls, folder: Path) -> Launcher | None:
        """The launcher another tunebook process started in `folder`, if it is up; stopping
        this handle leaves it to its owner."""
        try:
            hello = json.loads((folder / "hello.json").read_text())
            owner = json.loads((folder / "owner.json").read_text())
        except (OSError, ValueError):
            return None
        x = cls(owner["python"], hello["module"], folder, tuple(owner["preload"]))
        x.borrowed_pid, x.start_env = int(hello["pid"]), owner["start_env"]
        x.read_at_import, x.set_at_import = hello["read_at_import"], hello["set_at_import"]
        return x if x.alive() else None

    def alive(self) -> bool:
        if self.borrowed_pid is not None:
            return _running(self.borrowed_pid)
        return self.proc is not None and self.proc.poll() is None

    def ensure(self, env: dict[str, str]) -> bool:
        """Up and ready (started with `env` if it is not); False, with `error`, if it can't."""
        if self.alive():
            return True
        if self.error is not None:
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in ("launcher.sock", "hello.json"):
            (self.folder / stale).unlink(missing_ok=True)
        log = self.folder / "launcher.log"
        self.start_env = {k: v for k, v in env.items() if k.startswith(STARTUP_VARS)}
        replace_atomic(self.folder / "owner.json", json.dumps(  # `attach` may read it now
            {"python": self.python, "preload": self.preload, "start_env": self.start_env}
        ).encode())
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [self.python, "-m", "tunebook.servers.launcher", str(self.sock_path),
                 self.module, *self.preload], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env={**env, "PYTHONUNBUFFERED": "1"},
                process_group=0, close_fds=True)  # the engines it forks: the owner's session
        hello = self.folder / "hello.json"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not hello.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                self.error = (f"the launcher exited (code {self.proc.poll()}): {tail[0]}"
                              if self.proc.poll() is not None else "the launcher never got ready")
                self.stop()
                return False
            time.sleep(0.05)
        said = json.loads(hello.read_text())
        self.read_at_import, self.set_at_import = said["read_at_import"], said["set_at_import"]
        return True

    def differs(self, env: dict[str, str]) -> list[str]:
        """Variables `env` sets otherwise than the launcher had, where that matters: those
        vLLM looked up while imported (unless set to what that import set them to itself),
        and those read when a process or a library starts (the interpreter's, the loader's,
        OpenMP's, malloc's: STARTUP_VARS)."""
        at_import = [k for k, v in self.read_at_import.items() if env.get(k) != v
                     # set to what vLLM's import sets it to anyway (an owner that imported
                     # vLLM itself passes on TORCHINDUCTOR_COMPILE_THREADS=1 …): same outcome
                     and env.get(k) != self.set_at_import.get(k, v)]
        started = {k for k in {*env, *self.start_env} if k.startswith(STARTUP_VARS)}
        return sorted({*at_import,
                       *(k for k in started if env.get(k) != self.start_env.get(k))})

    def start(self, argv: list[str], env: dict[str, str], log: Path, core_fork: bool) -> Forked:
        req = {"op": "start", "argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log),
               "core_fork": core_fork}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(self.sock_path))
            s.sendall((json.dumps(req) + "\n").encode())
            answer = json.loads(s.makefile("rb").readline() or b"{}")
        if "pid" not in answer:
            raise OSError(answer.get("error", "the launcher gave no answer"))
        return Forked(int(answer["pid"]), self.folder / "exits", self.alive)

    def died_unasked(self) -> bool:
        """It exited without stop() asking (killed, crashed)."""
        return not self._stopping and (self.proc is not None or self.borrowed_pid is not None) \
            and not self.alive()

    def stop(self) -> None:
        self._stopping = True
        if self.borrowed_pid is not None:
            return  # its owner's
        _advertise(self.folder, False)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)  # its log too: the engines' are kept


MAX_LAUNCHERS = 2  # each holds an imported vLLM (~1 GB); a third import-time env evicts one
_LAUNCHERS: list[Launcher] = []
_GAVE_UP: str | None = None  # set when a launcher died under this process
_LOCK = threading.Lock()


def choose(kind_ok: bool, wanted: bool | None = None) -> Choice:
    """How this process starts its next engine of a kind that can (`kind_ok`) be forked;
    `wanted`: the params' fast_start (None: the environment decides). On by default:
    TUNEBOOK_FAST_START=0 turns it off whatever params say, `api` forks the API server alone
    (its engine core and worker spawned as vLLM chooses); params' fast_start: false turns it
    off for one sweep. On an NVIDIA GPU the API server alone is forked unless
    TUNEBOOK_FAST_START=1 asks for more (GPU_NO_CORE_FORK says why)."""
    mode = os.environ.get(FAST_START_ENV, "").strip()
    if not kind_ok:
        return Choice(EXEC)
    if mode == "0":
        return Choice(EXEC, f"{FAST_START_ENV}=0")
    if wanted is False:
        return Choice(EXEC, "params: fast_start: false")
    if not sys.platform.startswith("linux"):
        return Choice(EXEC, "fast starts fork a pre-imported server: Linux only")
    if mode == "api":
        return Choice(API_FORK)
    if mode != "1" and NVIDIA_DRIVER.exists():
        return Choice(API_FORK, GPU_NO_CORE_FORK)
    return Choice(FULL_FORK)


class FastStartSection(Section[bool | None]):
    """params `fast_start: true | false`: engines forked from a launcher, or plain starts, for
    one sweep (left out: TUNEBOOK_FAST_START decides, `choose` above). How a start is made,
    not what it measures: part of no run id; each row says how its engine started."""

    key = "fast_start"
    default = None

    def read(self, v: Checker, raw: Any) -> bool | None:
        if not isinstance(raw, bool):
            v.err(self.key, f"must be a boolean (true: fork engines from a launcher that has "
                            f"imported vLLM; false: plain starts), got {raw!r}")
            return None
        return raw

    def dump(self, value: bool | None) -> Any:
        return value


FAST_START = SECTIONS.add(FastStartSection.key, FastStartSection())


def launch(python: str, argv: list[str], env: dict[str, str], log: Path,
           choice: Choice, preload: tuple[str, ...] = ()) -> tuple[Forked | None, Choice]:
    """Start the engine `argv` (`python -m MODULE …`) through a launcher that has imported
    MODULE and `preload`; (None, a plain choice with the reason) when it cannot, and the
    caller starts it plain."""
    with _LOCK:  # engines started together start from threads
        return _launch(python, argv, env, log, choice, preload)


def _launch(python: str, argv: list[str], env: dict[str, str], log: Path,
            choice: Choice, preload: tuple[str, ...]) -> tuple[Forked | None, Choice]:
    module = argv[2]
    core_fork = choice.method == FULL_FORK and MP_METHOD_ENV not in env
    if core_fork:
        env = {**env, MP_METHOD_ENV: "fork"}
    global _GAVE_UP
    dead = [x for x in _LAUNCHERS if x.died_unasked()]
    if dead:
        x = dead[0]
        how = (f"exit code {x.proc.returncode}" if x.proc is not None else
               f"pid {x.borrowed_pid}, started by the tunebook process this one came from")
        _GAVE_UP = f"the launcher died ({how}): plain starts from then on in this process"
        print(f"tunebook: {_GAVE_UP}", file=sys.stderr)  # once: later starts just say it
        stop_all()
    if _GAVE_UP:
        return None, Choice(EXEC, _GAVE_UP)
    fit = [x for x in _LAUNCHERS if x.python == python and x.module == module and x.alive()
           and not x.differs(env)]
    launcher = _keep(fit[0]) if fit else _borrow(python, module, env)
    if launcher is None:
        # a short temporary folder: a Unix socket's path has at most ~100 bytes
        launcher = _keep(Launcher(python, module,
                                  Path(tempfile.mkdtemp(prefix="tunebook-launcher-")), preload))
        if not launcher.ensure(env):  # it cannot run here: no point paying its import again
            _LAUNCHERS.remove(launcher)
            _GAVE_UP = f"{launcher.error}: plain starts from then on in this process"
            print(f"tunebook: {_GAVE_UP}", file=sys.stderr)
            return None, Choice(EXEC, _GAVE_UP)
        _advertise(launcher.folder, True)  # for the processes this one starts
        if differs := launcher.differs(env):  # vLLM read something at import that env changes
            return None, Choice(EXEC, "set differently from what vLLM read when imported: "
                                      + ", ".join(differs))
    try:
        return launcher.start(argv, env, log, core_fork), choice
    except OSError as e:
        return None, Choice(EXEC, f"the launcher did not start it: {e}")


def _advertised() -> list[str]:
    return [f for f in os.environ.get(LAUNCHER_ENV, "").split(os.pathsep) if f]


def _advertise(folder: Path, up: bool) -> None:
    """LAUNCHER_ENV lists every launcher this process has up (and those it was given): a
    process it starts borrows the first that fits its engine. One sweep may hold two (engine
    configs whose environments vLLM reads differently at import, e.g. dev mode on and off)."""
    said = [f for f in _advertised() if f != str(folder)]
    said = [str(folder), *said] if up else said
    if said:
        os.environ[LAUNCHER_ENV] = os.pathsep.join(said)
    else:
        os.environ.pop(LAUNCHER_ENV, None)


def _borrow(python: str, module: str, env: dict[str, str]) -> Launcher | None:
    """A launcher of the tunebook process that started this one (LAUNCHER_ENV) that can fork
    this engine. An engine that must die with this process (DIE_WITH_PARENT_ENV) is not
    forked from one: it would be that launcher's child, not ours."""
    if env.get(DIE_WITH_PARENT_ENV):
        return None
    mine = {str(x.folder) for x in _LAUNCHERS}
    for folder in _advertised():
        if folder in mine:  # ours, or borrowed already: `fit` judged it
            continue
        x = Launcher.attach(Path(folder))
        if x is not None and x.python == python and x.module == module \
                and not x.differs(env):
            return _keep(x)
    return None


def _keep(x: Launcher) -> Launcher:
    """`x` among this process's launchers, as the most recently used; the least recently used
    is let go when there are MAX_LAUNCHERS (the oldest was once: a run of two releases let go
    of the launcher every other engine of the session forked from, imported again next)."""
    if x in _LAUNCHERS:
        _LAUNCHERS.remove(x)
    while len(_LAUNCHERS) >= MAX_LAUNCHERS:
        _LAUNCHERS.pop(0).stop()
    _LAUNCHERS.append(x)
    return x


@atexit.register
def stop_all() -> None:
    while _LAUNCHERS:
        _LAUNCHERS.pop().stop()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
