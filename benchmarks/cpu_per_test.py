"""A pytest plugin: CPU seconds of the whole machine (/proc/stat) and wall seconds per test
(setup, call and teardown together), for finding where make test's time goes. Whole machine,
so run one lane alone on a box left alone: an engine's processes, a kernel, a background replot
count in the test that runs while they work.

    PYTHONPATH=benchmarks CPU_PER_TEST_OUT=/tmp/engine.json \\
        .venv/bin/python -m pytest -q -m engine -p cpu_per_test tests
    PYTHONPATH=benchmarks CPU_PER_TEST_OUT=/tmp/quick.json \\
        .venv/bin/python -m pytest -q -m "not engine" -p cpu_per_test tests

The JSON: {"rows": [{"id", "core_s", "wall_s"}, ...], "total_wall", "total_core"}. Per file,
two runs side by side: `python benchmarks/cpu_per_test.py BEFORE.json AFTER.json`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from busy_time import not_idle_seconds  # benchmarks/ is on PYTHONPATH for the plugin

_rows: list[dict] = []
_t0: tuple[float, float] = (0.0, 0.0)


def pytest_sessionstart(session: pytest.Session) -> None:
    global _t0
    _t0 = (time.monotonic(), not_idle_seconds())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    b0, w0 = not_idle_seconds(), time.monotonic()
    yield
    _rows.append({"id": item.nodeid, "core_s": not_idle_seconds() - b0,
                  "wall_s": time.monotonic() - w0})


def pytest_sessionfinish(session: pytest.Session) -> None:
    w0, b0 = _t0
    with open(os.environ.get("CPU_PER_TEST_OUT", "cpu_per_test.json"), "w") as f:
        json.dump({"rows": _rows, "total_wall": time.monotonic() - w0,
                   "total_core": not_idle_seconds() - b0}, f)


def _per_file(path: str) -> tuple[Counter, dict]:
    with open(path) as f:
        data = json.load(f)
    files: Counter = Counter()
    for row in data["rows"]:
        files[row["id"].split("::")[0]] += row["core_s"]
    return files, data


if __name__ == "__main__":  # before/after, per file: CPU seconds
    (before, b), (after, a) = (_per_file(p) for p in sys.argv[1:3])
    print("| file | CPU s before | after |\n|---|---|---|")
    for name in sorted(before | after, key=lambda n: -before[n]):
        if max(before[name], after[name]) >= 2:
            print(f"| {name} | {before[name]:.1f} | {after[name]:.1f} |")
    print(f"| **all (session)** | {b['total_core']:.0f} (wall {b['total_wall']:.0f}) | "
          f"{a['total_core']:.0f} (wall {a['total_wall']:.0f}) |")
