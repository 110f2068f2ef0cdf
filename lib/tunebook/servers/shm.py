"""The shared-memory segments engines leave in /dev/shm (vLLM's message queues): which ones a
group of processes maps, which ones a live process still uses, and removing the rest.

A killed engine's resource tracker, which would unlink them, dies with it: on a GPU box, where
the queues are touched, they are real memory. kill_group (tunebook.servers.process) removes
what the group it stopped had mapped; `reap_shared_memory` finds what engines that died on
their own left (a sweep calls it before it starts anything)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "psm_"  # multiprocessing.shared_memory's names: vLLM's message queues


def shared_memory_of(members: list[psutil.Process]) -> set[Path]:
    """The multiprocessing shared-memory segments (/dev/shm/psm_*) these processes map."""
    found = set()
    for p in members:
        try:
            with open(f"/proc/{p.pid}/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    at = line.find(f"{SHM_DIR}/{SHM_PREFIX}")
                    if at >= 0 and not line.rstrip().endswith("(deleted)"):
                        found.add(Path(line[at:].rstrip()))
        except OSError:  # gone already, or not ours to read
            continue
    return found


def mapped_by_any(paths: set[Path]) -> set[Path]:
    """Those of `paths` that some live process still maps (read only when segments are
    left: a clean stop unlinks its own)."""
    if not paths:
        return set()
    names = {p: str(p).encode() for p in paths}
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            data = maps.read_bytes()
        except OSError:
            continue
        mapped |= {p for p, name in names.items() if name in data}
    return mapped


SHM_MIN_AGE_S = 60.0  # a segment younger than this may be one a process is about to map


SHM_REAP_EVERY_S = 600.0  # a kernel that runs sweep after sweep looks again at most this often
_shm_reaped_at: float | None = None


def reap_shared_memory(min_age_s: float = SHM_MIN_AGE_S, every_s: float = 0.0,
                       since: float | None = None, until: float | None = None) -> list[Path]:
    """Unlink the /dev/shm/psm_* segments engines that died on their own left behind (their
    resource tracker died with them): this user's, older than `min_age_s`, that no live
    process maps or holds open. kill_group cleans up after the stops tunebook makes; this
    finds the rest (a sweep calls it before it starts anything, at most once `every_s`).
    `since`, `until` (time.time()): only segments made between them (an engine that died:
    its own, made after it was spawned and before its death was found — a replacement that
    starts while it is being stopped makes segments it has not mapped yet, which must stay)."""
    global _shm_reaped_at
    if _shm_reaped_at is not None and time.monotonic() - _shm_reaped_at < every_s:
        return []
    _shm_reaped_at = time.monotonic()
    now, uid = time.time(), os.getuid()
    found = set()
    for path in SHM_DIR.glob(f"{SHM_PREFIX}*"):
        try:
            st = path.stat()
        except OSError:
            continue
        made = max(st.st_mtime, st.st_ctime)
        if st.st_uid == uid and now - made >= min_age_s and (since is None or made >= since) \
                and (until is None or made <= until):
            found.add(path)
    left = found - mapped_by_any(found) - open_by_any(found)
    for path in left:
        path.unlink(missing_ok=True)
    return sorted(left)


def open_by_any(paths: set[Path]) -> set[Path]:
    """Those of `paths` some live process holds open (opened, not mapped yet)."""
    if not paths:
        return set()
    names = {str(p): p for p in paths}
    held = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target in names:
            held.add(names[target])
    return held
