"""Stopping an engine's process group leaves no shared memory behind: what its processes had
mapped under /dev/shm/psm_* (vLLM's message queues) is unlinked once the group is gone, and
nothing else is. A group killed before it could close its segments (its resource tracker
killed with it) used to leave them there."""

from __future__ import annotations

import subprocess
import sys
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from tunebook.servers import process, shm

pytestmark = pytest.mark.skipif(not shm.SHM_DIR.is_dir(), reason="no /dev/shm here")

# A process group that creates a segment and maps it until killed, as vLLM's API server and
# engine core do, and that does not stop within its grace (as an API server stuck in a blocking
# poll): SIGKILL ends it, and its resource tracker with it (which ignores SIGTERM and would
# otherwise unlink the segment once its pipe closes). Without the fix the segment stayed.
HOLDER = """
from multiprocessing import shared_memory
import signal, sys, time
m = shared_memory.SharedMemory(create=True, size=1 << 20)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
m.buf[:4] = b"tune"
print(m.name, flush=True)
time.sleep(120)
"""


def test_a_killed_group_leaves_no_segment_and_others_stay() -> None:
    other = shared_memory.SharedMemory(create=True, size=4096)  # not the group's
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        name = proc.stdout.readline().strip()
        seg = shm.SHM_DIR / name
        assert name.startswith(shm.SHM_PREFIX) and seg.exists()
        assert shm.shared_memory_of(process._group_members(proc.pid)) == {seg}
        process.kill_group(proc.pid, grace_s=0.5)
        proc.wait(timeout=10)
        assert not seg.exists()
        assert Path(shm.SHM_DIR / other.name.lstrip("/")).exists()
        # a segment some process outside the group still maps (a launcher the engine was
        # forked from) keeps its name
        mine = shm.SHM_DIR / other.name.lstrip("/")
        assert shm.mapped_by_any({mine, seg}) == {mine}
    finally:
        proc.kill()
        other.close()
        other.unlink()


def test_the_files_an_engines_log_names_are_its_leftovers(tmp_path: Path) -> None:
    """vLLM's file store (<tmp>/vllm_dist_<uuid>, never removed by vLLM) is found by the line
    its worker logs, in any engine's log, and nothing else is touched."""
    from tunebook.servers.vllm import Engine

    store, other = tmp_path / "vllm_dist_0123abcd", tmp_path / "vllm_dist_notes.txt"
    store.write_text("x")
    other.write_text("y")
    log = (f"(Worker pid=9) INFO [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 "
           f"distributed_init_method=file://{store} backend=gloo\n"
           f"a line that names {other} otherwise\n")
    process.remove_leftovers(Engine.leftover_files, log)
    assert not store.exists() and other.exists()
    process.remove_leftovers(None, log)  # a kind that leaves nothing behind
