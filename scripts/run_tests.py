"""`make test`: the suite as three pytest sessions at once (lanes), on a 2-core machine too.

Why: an engine start is mostly one core's work (imports, model set-up), so while the engine tests
ran one after another the machine's two cores were about half idle (vmstat over a fresh-clone
run: 50-65 % idle through the engine tests). The lanes fill that core:

    quick    -m "not engine"              the tests without an engine, and the background replots
    engines  -m "engine and not own_lane" the session's shared engine and the tests on it
    own      -m "own_lane"                tests that start every process they use (the Ray
                                          cluster's sweeps, the plain-vs-launcher starts)

Each lane is its own pytest session: its own temp folder (under one folder, kept when a lane
fails), its own TUNEBOOK_STATE_DIR (conftest), its own shared engine and launcher where it needs
them. A lane's tests run in the order conftest gives them, as in one session.

Arguments go to every lane (`-x`, `-k EXPR`, `--durations=20`). The engines lane, the longest,
prints as it goes; the others print whole when they end. Exit code: 0 when every lane passed
(a lane that `-k` left without tests counts as passed), else the first lane's failure code.

`python -m pytest tests` still runs the whole suite in one session.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LANES = (("quick", "not engine"), ("engines", "engine and not own_lane"), ("own", "own_lane"))
LIVE = "engines"
NO_TESTS = 5  # pytest's exit code when nothing was selected


def main(args: list[str]) -> int:
    root = Path(tempfile.mkdtemp(prefix="tunebook-tests-"))
    t0 = time.monotonic()
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    for name, expr in LANES:
        cmd = [sys.executable, "-m", "pytest", "-q", "-ra", "-m", expr,
               "--basetemp", str(root / name), *args, "tests"]
        if name == LIVE:
            procs[name] = subprocess.Popen(cmd, cwd=REPO)
        else:
            logs[name] = root / f"{name}.log"
            with logs[name].open("wb") as out:
                procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=out,
                                               stderr=subprocess.STDOUT)
    codes: dict[str, int] = {}
    took: dict[str, float] = {}
    try:
        while len(codes) < len(procs):
            for name, p in procs.items():
                if name not in codes and p.poll() is not None:
                    codes[name], took[name] = p.returncode, time.monotonic() - t0
                    if name in logs:
                        expr = dict(LANES)[name]
                        print(f"\n===== lane {name} (-m {expr!r}): exit {p.returncode} after "
                              f"{took[name]:.0f} s =====", flush=True)
                        sys.stdout.write(logs[name].read_text(errors="replace"))
                        sys.stdout.flush()
            time.sleep(0.5)
    except KeyboardInterrupt:
        for p in procs.values():
            p.terminate()  # each session stops its engines on the way out
        for p in procs.values():
            p.wait()
        raise
    summary = ", ".join(f"{n} exit {codes[n]} in {took[n]:.0f} s" for n, _ in LANES)
    print(f"\nlanes: {summary}; all done in {time.monotonic() - t0:.0f} s", flush=True)
    failed = [n for n, _ in LANES if codes[n] not in (0, NO_TESTS)]
    if all(c == NO_TESTS for c in codes.values()):
        return NO_TESTS
    if failed:
        print(f"failed lanes: {', '.join(failed)}; their temp folders are under {root}")
        return codes[failed[0]]
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
