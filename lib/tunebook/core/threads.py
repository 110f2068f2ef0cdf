"""Work on a background thread that the main thread waits for without `Thread.join`.

CPython 3.11's `Thread.join` has a trap (bpo-45274's handling in `_wait_for_tstate_lock`): when
a signal handler's exception (Ctrl-C's KeyboardInterrupt, tunebook's `Terminated`) interrupts
the join, it releases the thread's state lock and marks the thread stopped although it still
runs, so `is_alive()` says False and whatever should stop it is skipped (seen: vLLM's client
kept its streams open and the API server waited 20 s for them at every stop). Waiting on an
Event the thread sets as it ends is interruptible the same way and leaves the thread's state
alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Background:
    """`target` running on a daemon thread; `done` is set when it returns or raises."""

    def __init__(self, target: Callable[[], None], name: str):
        self.done = threading.Event()

        def run() -> None:
            try:
                target()
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once the work has ended; False after `timeout_s` with it still running."""
        return self.done.wait(timeout_s)

    def running(self) -> bool:
        return not self.done.is_set()
