"""The watchdog on process trees shaped like an engine's (no vLLM: a child titles itself with
setproctitle, as vLLM's engine core does): a titled child that dies is found, with how it died,
whether its parent left it a zombie or reaped it; a stopped one is hung, not dead; vLLM's own
log lines name a death the watchdog did not see; a record being written waits for a SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tunebook.measure.locks import Terminated, signals_deferred, sigterm_as_exception
from tunebook.servers import process, watchdog
from tunebook.servers.watchdog import Watchdog

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds here")

# a root (the "API server") with one child titled as vLLM titles its engine core; `reaps`:
# the root waits for its child (vLLM's monitor reaps a dead engine core), else leaves a zombie
ROOT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import setproctitle, time; "
                          "setproctitle.setproctitle('VLLM::EngineCore'); time.sleep(120)"])
while open(f"/proc/{child.pid}/comm").read().strip() != "VLLM::EngineCor":
    time.sleep(0.01)
print(child.pid, flush=True)
if sys.argv[1] == "reaps":
    child.wait()
time.sleep(120)
"""


def _tree(reaps: bool) -> tuple[subprocess.Popen, int]:
    root = subprocess.Popen([sys.executable, "-c", ROOT, "reaps" if reaps else "zombie"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    return root, int(root.stdout.readline())  # type: ignore[union-attr]


def _watching(root: subprocess.Popen, pid: int, timeout_s: float = 10.0) -> Watchdog:
    """A watchdog of `root`'s engine, scanned until it watches `pid`."""
    dog = Watchdog(root.pid, ("VLLM::",), root.poll)
    deadline = time.monotonic() + timeout_s
    while pid not in dog.watched:
        assert time.monotonic() < deadline, f"pid {pid} never watched"
        dog.scan(force=True)
        time.sleep(0.05)
    return dog


def _found(dog: Watchdog, timeout_s: float = 5.0) -> watchdog.Death:
    deadline = time.monotonic() + timeout_s
    while (d := dog.death()) is None:
        assert time.monotonic() < deadline, "the death was not found"
        time.sleep(0.01)
    return d


def _stop(root: subprocess.Popen) -> None:
    os.killpg(root.pid, signal.SIGKILL)
    root.wait()


def _pidfs_exit_info() -> bool:
    """Whether this kernel keeps a reaped process's exit status (Linux >= 6.15)."""
    p = subprocess.Popen(["true"])
    fd = os.pidfd_open(p.pid)
    p.wait()
    try:
        return watchdog._pidfd_status(fd) is not None
    finally:
        os.close(fd)


@pytest.mark.parametrize("reaps", [False, True], ids=["zombie", "reaped"])
def test_a_titled_child_killed_is_the_engines_death(reaps: bool) -> None:
    root, child = _tree(reaps)
    try:
        dog = _watching(root, child)
        assert dog.death() is None and dog.stopped() is None
        os.kill(child, signal.SIGSTOP)  # hung, not dead
        time.sleep(0.2)
        assert dog.death() is None
        assert dog.stopped() == f"engine core is stopped (pid {child}, VLLM::EngineCore)"
        os.kill(child, signal.SIGKILL)
        died = _found(dog)
        assert (died.role, died.pid, died.title) == ("engine core", child, "VLLM::EngineCore")
        if reaps and not _pidfs_exit_info():
            assert died.how == "exit status unknown"  # an older kernel: said, not guessed
        else:
            assert died.how == "SIGKILL", died
        assert str(died) == f"engine core exited: {died.how} (pid {child}, VLLM::EngineCore)"
        assert dog.death() is died  # kept
    finally:
        _stop(root)


# the engine core forks its worker, which carries the engine core's title until it sets its
# own (once the file argv[1] exists); when it dies, the engine core leaves it a zombie or, with
# argv[2] "reaps", reaps it at once (vLLM's executor watches its workers)
CORE = """
import os, sys, time, setproctitle
setproctitle.setproctitle('VLLM::EngineCore')
pid = os.fork()
if pid == 0:
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    setproctitle.setproctitle('VLLM::Worker')
    time.sleep(120)
print(os.getpid(), pid, flush=True)
if sys.argv[2] == "reaps":
    os.waitpid(pid, 0)
time.sleep(120)
"""
FORKS = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", *sys.argv[1:]])
time.sleep(120)
"""


@pytest.mark.parametrize("reaps", [False, True], ids=["zombie", "reaped"])
def test_a_worker_killed_after_it_titled_itself_is_the_worker(tmp_path: Path,
                                                              reaps: bool) -> None:
    """A scan saw the forked worker under the engine core's title; it set its own, and died
    before the next scan: the death names the worker, by the zombie's name, or, reaped at
    once, as what the engine core forks (both seen in the death matrix: a worker killed during
    its start was said to be the engine core)."""
    if reaps and not _pidfs_exit_info():
        pytest.skip("this kernel keeps no exit status of a reaped process (Linux < 6.15)")
    go = tmp_path / "title-yourself"
    root = subprocess.Popen([sys.executable, "-c", FORKS, CORE, str(go),
                             "reaps" if reaps else "zombie"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        core, worker = map(int, root.stdout.readline().split())  # type: ignore[union-attr]
        dog = _watching(root, worker)
        deadline = time.monotonic() + 10
        assert dog.watched[worker].role == "engine core"  # the title it was forked with
        go.touch()
        while Path(f"/proc/{worker}/comm").read_text().strip() != "VLLM::Worker":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(worker, signal.SIGKILL)  # no scan since
        while reaps and psutil.pid_exists(worker):  # reaped by the engine core
            assert time.monotonic() < deadline
            time.sleep(0.01)
        died = _found(dog)
        assert (died.role, died.pid, died.how) == ("worker", worker, "SIGKILL"), died
        title = "forked by VLLM::EngineCore" if reaps else "VLLM::Worker"
        assert str(died) == f"worker exited: SIGKILL (pid {worker}, {title})"
        assert dog.watched[core].role == "engine core"
    finally:
        _stop(root)


# a worker that runs a command through a shell while it starts, as vLLM's CPU worker runs
# `lscpu`: the fork carries the worker's title until it execs (once argv[1] exists); the
# worker reaps it at once, as subprocess.check_output does. argv[2]: what the shell runs
RUNS = """
import os, sys, time, setproctitle
setproctitle.setproctitle('VLLM::Worker')
pid = os.fork()
if pid == 0:
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    os.execv('/bin/sh', ['sh', '-c', sys.argv[2]])
print(os.getpid(), pid, flush=True)
os.waitpid(pid, 0)
time.sleep(120)
"""


@pytest.mark.parametrize("command", ["exit 0", "exec sleep 30"], ids=["exits", "runs-on"])
def test_a_command_the_worker_runs_is_not_the_engine(tmp_path: Path, command: str) -> None:
    """A scan caught the fork of a command between fork and exec, under the worker's title:
    its end is no death (once, on two busy cores, vLLM's `lscpu` ended a healthy start as
    "the engine exited during start-up"); one still running is let go at the next scan. The
    worker itself is still watched: killed, it is the engine's death."""
    go = tmp_path / "exec-now"
    root = subprocess.Popen([sys.executable, "-c", FORKS, RUNS, str(go), command],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        worker, helper = map(int, root.stdout.readline().split())  # type: ignore[union-attr]
        dog = _watching(root, helper)
        deadline = time.monotonic() + 10
        assert not dog.watched[helper].own_title and dog.watched[worker].own_title
        go.touch()
        if command == "exit 0":
            while psutil.pid_exists(helper):  # ended and reaped by the worker
                assert time.monotonic() < deadline
                time.sleep(0.01)
        else:
            while psutil.Process(helper).cmdline()[:1] != ["sleep"]:  # what a scan reads
                assert time.monotonic() < deadline
                time.sleep(0.01)
            dog.scan(force=True)
            os.kill(helper, signal.SIGKILL)
            time.sleep(0.2)
        assert dog.death() is None and helper not in dog.watched
        os.kill(worker, signal.SIGKILL)
        died = _found(dog)
        assert (died.role, died.pid, died.how) == ("worker", worker, "SIGKILL"), died
    finally:
        _stop(root)


def test_the_root_killed_and_a_stop_is_no_death() -> None:
    root, _ = _tree(reaps=True)
    try:
        dog = Watchdog(root.pid, ("VLLM::",), root.poll)
        os.kill(root.pid, signal.SIGKILL)
        died = _found(dog)
        # no title for the root: its command line names this machine's paths
        assert str(died) == f"API server exited: SIGKILL (pid {root.pid})"
    finally:
        _stop(root)
    root, _ = _tree(reaps=True)
    dog = Watchdog(root.pid, ("VLLM::",), root.poll)
    dog.close()  # what tunebook's own stop ends is no death
    _stop(root)
    assert dog.death() is None


def test_a_root_reaped_elsewhere_waits_for_its_reapers_word(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked API server is reaped by the launcher, which writes its exit status a moment
    later; with no zombie left and pidfs not saying (Linux < 6.15), the watchdog waits for
    that word rather than call a SIGKILL "exit status unknown" (a start then blamed the
    config: engine_failed for every point, no replacement)."""
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    reaped_at: list[float] = []
    said = lambda: (root.returncode if reaped_at and time.monotonic() > reaped_at[0] + 0.2  # noqa: E731
                    else None)
    dog = Watchdog(root.pid, ("VLLM::",), said)
    monkeypatch.setattr(watchdog, "_pidfd_status", lambda fd: None)
    os.kill(root.pid, signal.SIGKILL)
    root.wait()  # reaped by "the launcher": no zombie to read
    reaped_at.append(time.monotonic())
    assert _found(dog).how == "SIGKILL"


def test_a_zombie_seen_first_by_a_scan_is_still_found() -> None:
    """Killed between two scans: its parent leaves it a zombie with no command line, only
    its name (a forked engine core under a forked API server that never learns it died)."""
    root, child = _tree(reaps=False)
    try:
        dog = Watchdog(root.pid, ("VLLM::",), root.poll)
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        dog.scan(force=True)
        died = _found(dog)
        assert (died.role, died.how) == ("engine core", "SIGKILL"), died
    finally:
        _stop(root)


def test_vllms_own_lines_name_a_death_the_watchdog_did_not_see() -> None:
    log = ("(EngineCore pid=7) ERROR [multiproc_executor.py:316] Worker proc VllmWorker-0 died "
           "unexpectedly (exit code: -9), shutting down executor.\n"
           "RuntimeError: Engine core initialization failed. See root cause above. "
           "Failed core proc(s): {'EngineCore_DP0': 1}\n")
    died, line = process.logged_death(log)
    assert died is not None and (died.role, died.title, died.how) == \
        ("worker", "VllmWorker-0", "SIGKILL")
    assert line is not None and line.startswith("(EngineCore pid=7) ERROR")
    assert process.logged_death("Failed core proc(s): {'EngineCore_DP0': -9}")[0].how == \
        "SIGKILL"
    assert process.logged_death("Failed core proc(s): {'EngineCore_DP0': 1}") == (None, None)


def test_wait_status_in_words() -> None:
    assert watchdog.wait_status_text(9) == "SIGKILL"
    assert watchdog.wait_status_text(11 | 0x80) == "SIGSEGV (core dumped)"
    assert watchdog.wait_status_text(1 << 8) == "exit code 1"
    assert watchdog.returncode_text(-9) == "SIGKILL" and watchdog.returncode_text(2) == \
        "exit code 2"


def test_a_record_being_written_waits_for_a_sigterm(tmp_path: Path) -> None:
    """The scheduler's SIGTERM landing while a run's record is written: the record is whole
    on disk, then the SIGTERM is raised (it is never lost, nor the record)."""
    out = tmp_path / "record.json"
    with pytest.raises(Terminated), sigterm_as_exception():
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the handler had its chance: it only noted the signal
            out.write_text("whole")
        raise AssertionError("the SIGTERM was not raised after the block")
    assert out.read_text() == "whole"
