"""Every process of an engine watched, whatever the engine itself notices.

vLLM watches its own processes, and not always: an engine core forked from a forked API server
hands the pipe its API server watches to the worker it forks in turn, so when the engine core
dies the API server never learns it (the engine core stays a zombie, the worker keeps running,
requests wait forever). So tunebook watches them itself. A `Watchdog` holds a pidfd of each
vital process of one engine: its API server (the process tunebook started) and every process
the server titles as its own (vLLM: `VLLM::EngineCore`, `VLLM::Worker`; SGLang: `sglang::…`),
found while the engine starts. Any of them exiting is the engine's death, reported with which
process it was and how it ended:

- a pidfd becomes readable when its process exits (Linux ≥ 5.3): `death()` polls them without
  waiting, so asking costs microseconds and can be done between every step of a load point;
- how it ended: a zombie's status from /proc/PID/stat (field 52), else pidfs' exit information
  (PIDFD_GET_INFO, Linux ≥ 6.15) once its parent has reaped it; "exit status unknown" where
  neither can say (an older kernel, after the parent reaped it).

A hung engine is not dead: `stopped()` names a process of it stopped by a signal (SIGSTOP, a
debugger), which the run timeout then reports instead of a bare timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import struct
import time
from dataclasses import dataclass
from typing import Any

import psutil

# pidfs (include/uapi/linux/pidfd.h): PIDFD_GET_INFO = _IOWR(0xFF, 11, struct pidfd_info), the
# struct's first version 64 bytes: mask u64, cgroupid u64, 12 u32 ids, exit_code s32 at 60.
_PIDFD_INFO_SIZE = 64
_PIDFD_GET_INFO = (3 << 30) | (_PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 1 << 3
_STAT_EXIT_CODE = 52  # /proc/PID/stat's field (1-based): the status in waitpid's form
# deaths that start a cascade, not follow one (a SIGTERM is how a process is asked to stop),
# and no engine config's fault: a process killed from outside (the OOM killer) or crashed
KILLED_BY = ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE")
ROOT_STATUS_WAIT_S = 1.0  # the root's reaper writes its exit status within ms of it
SCAN_EVERY_S = 1.0  # how often a start looks for the processes its server has made meanwhile


def wait_status_text(status: int) -> str:
    """A waitpid status in words: 'SIGKILL', 'SIGSEGV (core dumped)', 'exit code 1'."""
    sig = status & 0x7F
    if sig == 0:
        return f"exit code {(status >> 8) & 0xFF}"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    return name + (" (core dumped)" if status & 0x80 else "")


def returncode_text(code: int) -> str:
    """subprocess's returncode in words (-9: 'SIGKILL')."""
    if code < 0:
        return wait_status_text(-code)
    return f"exit code {code}"


def _still(pid: int, started: float) -> psutil.Process | None:
    """The process `pid` if it is still the one created at `started` (pids are reused)."""
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - started) <= 0.5 else None
    except psutil.Error:
        return None


def _zombie_status(pid: int, started: float) -> int | None:
    """The exit status of `pid` while it is a zombie (not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 on
        if fields[0] != "Z" or _still(pid, started) is None:
            return None
        return int(fields[_STAT_EXIT_CODE - 3])
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def _pidfd_status(pidfd: int) -> int | None:
    """pidfs' record of how the process of `pidfd` ended (kept after it was reaped)."""
    buf = bytearray(_PIDFD_INFO_SIZE)
    struct.pack_into("Q", buf, 0, _PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf, True)
    except OSError:  # a kernel before 6.15, or not yet reaped
        return None
    mask = struct.unpack_from("Q", buf, 0)[0]
    return struct.unpack_from("i", buf, 60)[0] if mask & _PIDFD_INFO_EXIT else None


@dataclass(frozen=True)
class Death:
    """One process of an engine that exited: which, and how."""

    role: str  # "API server", "engine core", "worker", or a kind's own title
    title: str  # its process title (VLLM::EngineCore)
    pid: int
    how: str  # "SIGKILL", "exit code 1", "exit status unknown"
    found_at: float  # time.time() when tunebook saw it

    def __str__(self) -> str:
        said = ", ".join(x for x in (f"pid {self.pid}" if self.pid else "", self.title) if x)
        return f"{self.role} exited: {self.how}" + (f" ({said})" if said else "")

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "title": self.title, "pid": self.pid, "how": self.how,
                "found_at": self.found_at, "text": str(self)}


@dataclass
class _Watched:
    pid: int
    started: float  # create_time: a pid reused by another process is not this one
    role: str
    title: str
    pidfd: int | None
    # its parent's title when a scan found it: a fork carries its parent's title until it
    # sets its own (a worker) or execs another program (vLLM's engine core and worker run
    # `lscpu` through a shell while they start)
    parent_title: str = ""

    @property
    def own_title(self) -> bool:
        """Whether it has shown a title of its own (not only the one it was forked with)."""
        return self.title != self.parent_title


class Watchdog:
    """The vital processes of one engine (`root`, the process tunebook started, and those of
    its process group titled with one of `titles`), each held by a pidfd. `scan()` adds the
    ones made since the last scan (a start calls it while it waits), `death()` says whether
    one has exited. Not thread-safe by itself: a server calls it from the thread that measures
    it (the load client's waits, the start's loop)."""

    def __init__(self, root: int, titles: tuple[str, ...], exit_of_root: Any = None):
        self.root = root
        self.titles = titles
        # the root's exit status from whoever reaps it (subprocess, the launcher): pidfs
        # may not have it yet when its parent is us
        self.exit_of_root = exit_of_root
        self.watched: dict[int, _Watched] = {}
        self._death: Death | None = None
        self._last_scan = 0.0
        self._closed = False
        self._add(root, "API server")  # untitled: its command line names machine paths

    # -- finding the processes -------------------------------------------------------------
    def _add(self, pid: int, role: str, title: str = "", parent_title: str = "") -> None:
        try:
            started = psutil.Process(pid).create_time()
        except psutil.Error:
            started = 0.0
        try:
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):  # gone already, or no pidfds (not Linux ≥ 5.3)
            pidfd = None
        self.watched[pid] = _Watched(pid, started, role, title, pidfd, parent_title)

    def _engines(self, w: _Watched) -> bool:
        """Still one of the engine's processes: the root, or titled as the kind titles its own
        (a fork that ran another program is not)."""
        return w.pid == self.root or w.title.startswith(self.titles)

    def _drop(self, w: _Watched) -> None:
        """No longer one of the engine's processes (it ran another program)."""
        if w.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(w.pidfd)
        self.watched.pop(w.pid, None)

    def scan(self, force: bool = False) -> None:
        """Watch the processes of the engine's group titled as the kind titles its own."""
        now = time.monotonic()
        if self._closed or (not force and now - self._last_scan < SCAN_EVERY_S):
            return
        self._last_scan = now
        try:
            members = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return
        for w in list(self.watched.values()):  # a forked process titles itself after its fork
            if w.pid != self.root:
                with contextlib.suppress(psutil.Error):
                    w.title = _title(psutil.Process(w.pid)) or w.title
                    w.role = _role_of(w.title)
                if not self._engines(w):
                    self._drop(w)
        for p in members:
            if p.pid in self.watched:
                continue
            try:
                # a zombie has no command line left, but keeps its name (setproctitle sets
                # both): one that died between two scans is still found, and how it ended
                title = _title(p) or p.name()
                if os.getpgid(p.pid) != self.root or not title.startswith(self.titles):
                    continue
                parent = _title(psutil.Process(p.ppid()))
            except (psutil.Error, OSError):
                continue
            self._add(p.pid, _role_of(title), title, parent)

    # -- asking ----------------------------------------------------------------------------
    def death(self) -> Death | None:
        """The first watched process found exited (kept: asked again, the same answer)."""
        if self._death is not None or self._closed:
            return self._death
        fds = {w.pidfd: w for w in self.watched.values() if w.pidfd is not None}
        if fds:
            try:
                ready, _, _ = select.select(list(fds), [], [], 0)
            except (OSError, ValueError):
                ready = []
            gone = [fds[fd] for fd in ready]
        else:
            gone = []
        gone += [w for w in self.watched.values() if w.pidfd is None and not _running(w)]
        found = []
        for w in gone:
            how = self._how(w)
            if title := _last_title(w):  # a forked child may have titled itself since a scan
                w.title, w.role = title, _role_of(title)
            # a command its parent ran, not the engine (a scan caught it between fork and
            # exec: once, on two busy cores, vLLM's `lscpu` failed a start): it ran another
            # program, or it never showed a title of its own and ended by itself (killed, it
            # counts: a worker killed before it titled itself)
            untitled_fork = w.pid != self.root and not w.own_title
            if not self._engines(w) or (untitled_fork and not how.startswith(KILLED_BY)):
                self._drop(w)
                continue
            if untitled_fork:
                # killed and reaped before any scan saw a title of its own (the zombie's name
                # would have said it): named by what its parent forks
                w.role, w.title = _forked_by(w.parent_title), f"forked by {w.parent_title}"
            found.append((w, how))
        if found:
            # several at once: the one a signal killed is the cause (the others exited because
            # it did: vLLM's own monitors end the rest), the first found of those
            w, how = min(found, key=lambda f: not f[1].startswith(KILLED_BY))
            self._death = Death(w.role, w.title, w.pid, how, time.time())
        return self._death

    def _how(self, w: _Watched) -> str:
        status = _zombie_status(w.pid, w.started)
        if status is None and w.pidfd is not None:
            status = _pidfd_status(w.pidfd)
        if status is not None:
            return wait_status_text(status)
        if w.pid == self.root and self.exit_of_root is not None:
            # its reaper (the launcher, for a forked API server) says how a moment after the
            # pidfd says it is gone: wait that moment rather than call a kill "unknown"
            deadline = time.monotonic() + ROOT_STATUS_WAIT_S
            while (code := self.exit_of_root()) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if code is not None:
                return returncode_text(code)
        return "exit status unknown"

    def stopped(self) -> str | None:
        """A watched process stopped by a signal (SIGSTOP, SIGTSTP, a debugger): the engine is
        hung, not dead."""
        for w in self.watched.values():
            try:
                if psutil.Process(w.pid).status() in (psutil.STATUS_STOPPED,
                                                      psutil.STATUS_TRACING_STOP):
                    return f"{w.role} is stopped (pid {w.pid}, {w.title})"
            except psutil.Error:
                continue
        return None

    def close(self) -> None:
        """Let go of the pidfds (the engine was stopped: what ends now is no death)."""
        self._closed = True
        for w in self.watched.values():
            if w.pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(w.pidfd)
                w.pidfd = None


def _title(p: psutil.Process) -> str:
    """Its title, as setproctitle set it (VLLM::EngineCore); '' for a zombie."""
    try:
        cmd = p.cmdline()
    except psutil.ZombieProcess:
        return ""
    return cmd[0].split()[0] if cmd and cmd[0].strip() else ""


def _last_title(w: _Watched) -> str:
    """The title a watched process had when it exited, while it is a zombie (its name: the
    title's first 15 characters, kept by the kernel); '' once reaped. A worker forked by the
    engine core carries the engine core's title until it sets its own: a scan between the two
    saw the old one (once, a worker killed during its start was said to be the engine core)."""
    if w.pid == 0 or w.title == "":
        return ""
    try:
        name = p.name() if (p := _still(w.pid, w.started)) is not None else ""
    except psutil.Error:
        return ""
    # the name is the title cut to 15 characters: the full title where it still agrees
    return w.title if w.title.startswith(name) else name


def _forked_by(parent_title: str) -> str:
    """The role of a process known only as a fork of a process titled `parent_title`: vLLM's
    engine core forks its workers (a command it runs execs another program: not watched)."""
    parent = _role_of(parent_title)
    return "worker" if parent == "engine core" else f"a process the {parent} forked"


def _role_of(title: str) -> str:
    low = title.lower()
    if "enginecor" in low or "scheduler" in low:  # the name a zombie keeps: 15 characters
        return "engine core"
    if "worker" in low:
        return "worker"
    return title


def _running(w: _Watched) -> bool:
    try:
        return (p := _still(w.pid, w.started)) is not None and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
