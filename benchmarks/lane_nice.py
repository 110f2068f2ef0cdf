"""Does a niced process that starts a session of its own still take an engine's cores?

make test runs its quick lane at nice 19 beside the engine lane (scripts/test_lanes.py). Linux
schedules each session as one group at the group's nice value (sched_autogroup_enabled), and
papermill's kernels start sessions of their own, as do tunebook's engines. This times a fixed
amount of CPU work in a session of its own (two processes, as an engine keeps about two busy:
its OpenMP thread and its API server) against two niced CPU loops started four ways:

- none: the box left alone;
- same session: `nice -n 19` in this process's session (where the lane's own pytest runs);
- own sessions: each loop `setsid` as well (as jupyter_client starts a kernel);
- own sessions, reniced: the same, then scripts/test_lanes.py's `_nice_sessions_of` (make
  test's runner does it every 0.5 s).

Each way ROUNDS times, interleaved; printed: the work's wall seconds (min of its rounds) and
its ratio to `none`. One run, on a box left alone: the ratios are what to compare.

    .venv/bin/python benchmarks/lane_nice.py [--rounds 2] [--work 30000000]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lanes", REPO / "scripts" / "test_lanes.py")
lanes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lanes)

LOOP = [sys.executable, "-c", "while True: pass"]
WAYS = ("none", "same session", "own sessions", "own sessions, reniced")


def _work(n: int) -> float:
    """Wall seconds for two processes of a session of their own to count to n each."""
    code = f"import os\nfor _ in range(2):\n    if os.fork() == 0:\n        sum(range({n}))\n" \
           "        os._exit(0)\nfor _ in range(2):\n    os.wait()\n"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code], start_new_session=True, check=True)
    return time.monotonic() - t0


def _loops(way: str) -> list[subprocess.Popen]:
    if way == "none":
        return []
    procs = [subprocess.Popen(["nice", "-n", str(lanes.QUICK_NICE), *LOOP],
                              start_new_session=way != "same session") for _ in range(2)]
    if way == "own sessions, reniced":
        time.sleep(0.2)  # `nice` has exec'd the loop
        lanes._nice_sessions_of(os.getpid())
    return procs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", type=int, default=30_000_000)
    a = ap.parse_args()
    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    enabled = autogroup.read_text().strip() if autogroup.exists() else "n/a"
    print(f"sched_autogroup_enabled: {enabled}; {os.cpu_count()} CPUs")
    took: dict[str, list[float]] = {w: [] for w in WAYS}
    for _ in range(a.rounds):
        for way in WAYS:
            procs = _loops(way)
            try:
                took[way].append(_work(a.work))
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    alone = min(took["none"])
    print(f"{'niced loops':<24} {'work s (min)':>12} {'÷ none':>8}   rounds")
    for way in WAYS:
        print(f"{way:<24} {min(took[way]):>12.2f} {min(took[way]) / alone:>8.2f}   "
              + " ".join(f"{t:.2f}" for t in took[way]))


if __name__ == "__main__":
    main()
