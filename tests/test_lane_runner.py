"""make test's runner (scripts/RUNNER.py): the quick lane's niceness reaches the sessions
its processes start (papermill's kernels), which Linux schedules as groups of their own; the
engine lane collects only the modules with engine tests, and conftest refuses one it would miss."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RUNNER

REPO = Path(__file__).resolve().parents[1]

AUTOGROUPS = pytest.mark.skipif(not Path("/proc/self/autogroup").exists(),
                                reason="no scheduler autogroups on this kernel")


def _group_nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])


@AUTOGROUPS
def test_a_session_started_below_the_lane_is_niced_as_the_lane() -> None:
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    own = subprocess.Popen(sleep, start_new_session=True)  # as jupyter_client starts a kernel
    same = subprocess.Popen(sleep)  # in our session: niced with it, by its own niceness
    try:
        # (under make test the runner itself may have niced `own` already: this lane's)
        RUNNER._nice_sessions_of(os.getpid())
        assert _group_nice(own.pid) == RUNNER.QUICK_NICE
        # our session's group is left as it was (under make test, the engine lane's too)
        assert _group_nice(same.pid) == _group_nice(os.getpid())
    finally:
        for p in (own, same):
            p.kill()
            p.wait()


@AUTOGROUPS
def test_the_quick_lane_is_a_session_niced_as_a_group() -> None:
    """Its own pytest and what it starts in its session share one scheduler group, niced: in
    the runner's session (the engine lane's) a niced task still took its group's share."""
    lane = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            preexec_fn=RUNNER._quick_lane)
    try:
        assert os.getsid(lane.pid) == lane.pid != os.getsid(os.getpid())
        assert _group_nice(lane.pid) == RUNNER.QUICK_NICE
        assert os.getpriority(os.PRIO_PROCESS, lane.pid) == RUNNER.QUICK_NICE
    finally:
        lane.kill()
        lane.wait()


def test_the_engine_lane_collects_the_modules_with_engine_tests() -> None:
    files = [str(f.relative_to(REPO)) for f in RUNNER.engine_files(REPO / "tests")]
    assert "tests/measure/test_engine_deaths.py" in files  # the whole module marked
    assert "tests/present/test_deploy.py" in files  # one test marked with a decorator
    assert "tests/test_lane_runner.py" not in files and len(files) < 30
    # folders become their engine modules; files, node ids and options pass as they are
    args = RUNNER.engine_args(["tests/measure", "-x", "tests/core/test_knobs.py::test_a"])
    assert args[-2:] == ["-x", "tests/core/test_knobs.py::test_a"]
    assert "tests/measure/test_faults.py" in args[:-2]
    assert all(a.startswith("tests/measure/") for a in args[:-2])


def test_an_engine_test_the_engine_lane_would_not_collect_is_refused(tmp_path: Path) -> None:
    import conftest

    hidden = tmp_path / "test_hidden.py"  # marked through a name the scan cannot follow
    hidden.write_text("import pytest\nENGINE = getattr(pytest.mark, 'engine')\n")

    class Item:  # what the hook reads of a collected test
        path, nodeid = hidden, "test_hidden.py::test_x"

        def get_closest_marker(self, name: str) -> object | None:
            return object() if name == "engine" else None

    with pytest.raises(pytest.UsageError, match="test_hidden.py"):
        conftest.pytest_collection_modifyitems(None, [Item()])  # type: ignore[arg-type]
