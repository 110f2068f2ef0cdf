"""Who may measure where: one sweep per experiment folder, one per machine (two engines would
share, and skew, the accelerator), and SIGTERM as an exception so `finally` blocks stop engines.

The locks are flocks: the kernel releases them when the holder dies, and the file says who
holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tunebook.core import config


class SweepLockedError(RuntimeError):
    pass


class Terminated(BaseException):
    """SIGTERM, turned into an exception so `finally` blocks stop the engine."""


@contextlib.contextmanager
def _flock(path: Path, what: str, advice: str, wait_s: float = 0.0) -> Iterator[None]:
    """An exclusive flock (released by the kernel if the holder dies), holder info inside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
                if time.monotonic() >= deadline:
                    raise SweepLockedError(f"{what} is in use by {holder}; {advice}") from None
                if not told:
                    print(f"waiting up to {wait_s:.0f} s: {what} is in use by {holder}",
                          file=sys.stderr)
                    told = True
                time.sleep(2.0)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({' '.join(sys.argv[:3])[:120]})".encode(), 0)
        yield
    finally:
        os.close(fd)


def experiment_lock(root: Path) -> contextlib.AbstractContextManager[None]:
    """One sweep per experiment folder at a time."""
    return _flock(root / ".lock", f"experiment {root.name}",
                  "wait for it or pick another experiment name")


def machine_lock(wait_s: float = 0.0) -> contextlib.AbstractContextManager[None]:
    """One sweep per machine at a time: two engines would share (and skew) the GPU/CPUs."""
    return _flock(config.state_dir() / "machine.lock", "this machine's accelerator",
                  "wait for that sweep (or pass --wait SECONDS)", wait_s)


@contextlib.contextmanager
def sigterm_as_exception() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGTERM and Ctrl-C held back while the block runs (a measured record being written:
    a signal in the middle would lose it), then delivered as they would have been."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: got.append(signum))
           for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if got:
            handler = old[got[0]]
            if callable(handler):
                handler(got[0], None)  # Terminated, KeyboardInterrupt (raised from here)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), got[0])
