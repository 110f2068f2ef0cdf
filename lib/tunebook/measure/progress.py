"""What a sweep shows and counts as it goes: a progress bar (a widget in JupyterLab, a live bar
in a terminal, a line every 30 s unattended), engine start phases on it, and the wall seconds of
each of its steps (benchmarks/sweep_overhead.py breaks them down)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from tunebook.core import config


class StepTimes:
    """Wall seconds a sweep spent in each of its steps, and how often each ran: what the
    overhead benchmark breaks down (engine starts included, as tunebook's clock sees them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, step: str, seconds: float, calls: int = 1) -> None:
        self.seconds[step] = self.seconds.get(step, 0.0) + seconds
        self.calls[step] = self.calls.get(step, 0) + calls

    @contextlib.contextmanager
    def time(self, step: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(step, time.monotonic() - t0)


def batch() -> bool:
    """Unattended (papermill, cron, a pipe): text progress that does not flood the output."""
    return config.batch() or (
        not sys.stderr.isatty() and "ipykernel" not in sys.modules)


def bar(total: int, desc: str, enabled: bool):  # -> tqdm
    if batch():
        from tqdm import tqdm  # plain text, at most one line every 30 s
        return tqdm(total=total, desc=desc, disable=not enabled, mininterval=30.0)
    from tqdm.auto import tqdm  # a widget bar in JupyterLab, a live bar in a terminal
    return tqdm(total=total, desc=desc, disable=not enabled, mininterval=0.5)


def phase_reporter(progress: Any, label: str) -> Callable[[str, float], None]:
    """Engine start phases into the bar; in batch mode only when the phase changes."""
    last = {"phase": ""}

    def report(phase: str, elapsed_s: float) -> None:
        if batch() and phase == last["phase"]:
            return
        last["phase"] = phase
        progress.set_description(f"[{label}] engine: {phase} ({elapsed_s:.0f}s)")

    return report
