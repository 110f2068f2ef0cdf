"""`make test`: the suite as two pytest sessions at once, one per lane.

- engine: the tests marked `engine` (real vLLM engines). Most of their time is waiting: engine
  starts, run timeouts, kills and their replacements. They used about two thirds of two cores
  (1.28 of 2 over 441 s, measured per test with psutil on the 2-core box).
- quick: everything else (about 1,400 tests and the background replots), ~140 s alone.

One after the other they took the sum (~590 s in a fresh clone); side by side the quick lane
fills the cores the engine lane leaves idle. Each lane keeps its own session fixtures (shared
engine, replots, state dir) and its own order (conftest), exactly as `pytest -m engine` and
`pytest -m "not engine"` run them; each has its own temp folder, kept until the next run.

Tests marked `quiet` (they compare measurements of separate runs: a busy core between two of
them reads as a step) wait for the quick lane to end: the engine lane is told of a file that
appears when it does (QUICK_DONE_ENV; conftest's `quiet_box`). In CI the quick lane once took
353 s beside the engine lane (222–228 s on the 2-core box here), and the diff test, ordered
after most engine tests, measured its second and third runs on either side of its end.

The quick lane prints live; the engine lane's output follows as it goes once the quick lane is
done (its log: TMP/tunebook-tests-*/engine.log). The exit code is the first lane's failure, or 0.
Extra arguments go to both sessions (`python scripts/test_lanes.py tests/servers`)."""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Lane:
    name: str
    marks: str  # pytest's -m expression
    nice: int = 0  # the quick lane's 19, the lowest: it takes what the engine lanes leave idle


# The quick lane prints live; the others' logs follow it, in this order.
LANES = (
    Lane("quick", "not engine", nice=19),
    # engine tests that mostly wait (kills, replacements, run timeouts) and share no engine
    Lane("apart", "engine and apart"),
    Lane("engine", "engine and not apart"),
)
NO_TESTS = 5  # pytest's exit code when a lane selected nothing (a path of one lane's tests)
QUIET_AFTER_ENV = "TUNEBOOK_QUIET_AFTER"  # files that appear as the other lanes end (os.pathsep)


def _command(lane: Lane, root: Path, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-ra", "-m", lane.marks,
            f"--basetemp={root / lane.name}", *args]


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
    done = {lane.name: root / f"{lane.name}.done" for lane in LANES}
    for f in done.values():
        f.unlink(missing_ok=True)
    # the engine lane's quiet tests wait for every other lane to end
    quiet_after = os.pathsep.join(str(done[lane.name]) for lane in LANES
                                  if lane.name != "engine")
    t0 = time.monotonic()
    procs: dict[str, subprocess.Popen] = {}
    ended: dict[str, float] = {}
    logs = {lane.name: root / f"{lane.name}.log" for lane in LANES[1:]}
    try:
        for lane in LANES[1:]:
            with logs[lane.name].open("wb") as out:
                procs[lane.name] = subprocess.Popen(
                    _command(lane, root, args), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, QUIET_AFTER_ENV: quiet_after},
                    preexec_fn=functools.partial(os.nice, lane.nice))
        first = LANES[0]
        try:
            codes = {first.name: subprocess.run(
                _command(first, root, args), cwd=REPO,
                preexec_fn=functools.partial(os.nice, first.nice)).returncode}
        finally:  # ended, however: quiet tests must not wait on it
            done[first.name].touch()
        ended[first.name] = time.monotonic() - t0
        for lane in LANES[1:]:
            print(f"\n[{lane.name} lane so far and as it goes ({logs[lane.name]})]", flush=True)
            _follow(logs[lane.name], procs[lane.name])
            done[lane.name].touch()
            codes[lane.name] = procs[lane.name].returncode
            ended[lane.name] = time.monotonic() - t0
    except KeyboardInterrupt:  # Ctrl-C reached every session (one process group): let them end
        for p in procs.values():
            p.send_signal(signal.SIGINT)
            p.wait()
        raise
    wall_s = time.monotonic() - t0
    said = ", ".join(f"{n} exit {codes[n]} at {ended[n]:.0f} s" for n in codes)
    print(f"[lanes: {said}; the suite in {wall_s:.0f} s]", flush=True)
    failed = [c for c in codes.values() if c not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if set(codes.values()) == {NO_TESTS} else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
