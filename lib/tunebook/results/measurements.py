"""Dated measurements of one experiment: a scheduled run measures the whole plan again and
keeps what the earlier ones measured (asv's habit: every run of a benchmark suite is kept,
keyed by when and with what it ran).

`measurements.json` in the experiment lists them: when each began and ended, with the vLLM
version, tunebook's commit and the machine. A measurement's runs are the attempts that started
inside its window (from its start to the next one's), so no row needs a new column and older
rows keep their meaning. `begin` starts a measurement, or returns the last one when it never
finished (an interrupted scheduled run resumes it: resume semantics as before); `finish` marks
it done once every planned run of it is ok.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tunebook.core import hardware
from tunebook.core.files import replace_atomic
from tunebook.results.store import utc_now

FILE = "measurements.json"
SINCE_ENV = "TUNEBOOK_MEASURE_SINCE"  # a papermill kernel's sweep: count attempts from here


@dataclass
class Measurement:
    started: str  # UTC ISO: attempts that began at or after this belong to it
    finished: str | None = None
    vllm: str | None = None
    tunebook_commit: str | None = None
    machine: str | None = None


def read(root: Path) -> list[Measurement]:
    try:
        data = json.loads((root / FILE).read_text())
    except (OSError, ValueError):
        return []
    return [Measurement(**{k: m.get(k) for k in Measurement.__dataclass_fields__})
            for m in data.get("measurements", []) if isinstance(m, dict) and m.get("started")]


def _write(root: Path, ms: list[Measurement]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    replace_atomic(root / FILE, json.dumps({"measurements": [asdict(m) for m in ms]},
                                           indent=1).encode())


def begin(root: Path) -> tuple[Measurement, bool]:
    """(the measurement to run, whether it is new): the last one when it never finished."""
    ms = read(root)
    if ms and ms[-1].finished is None:
        return ms[-1], False
    m = hardware.machine()
    new = Measurement(utc_now(), None, hardware.vllm_version(), m.get("tunebook_commit"),
                      m.get("hardware"))
    _write(root, [*ms, new])
    return new, True


def finish(root: Path, started: str) -> None:
    ms = read(root)
    for m in ms:
        if m.started == started and m.finished is None:
            m.finished = utc_now()
    _write(root, ms)


def window(root: Path, started: str) -> tuple[str, str | None]:
    """[start, end) of a measurement: its start to the next one's (None: still open)."""
    starts = [m.started for m in read(root)]
    later = [s for s in starts if s > started]
    return started, min(later) if later else None


def previous(root: Path, started: str) -> Measurement | None:
    earlier = [m for m in read(root) if m.started < started and m.finished is not None]
    return earlier[-1] if earlier else None


def inside(row: dict[str, Any], since: str | None = None, until: str | None = None) -> bool:
    """Whether a row's attempt began in [since, until) (None: unbounded on that side): the
    one rule for which measurement, or which window of a diff, an attempt belongs to."""
    started = str(row.get("started_at") or "")
    return (since is None or started >= since) and (until is None or started < until)


def since_from_env() -> str | None:
    return os.environ.get(SINCE_ENV) or None


def describe(m: Measurement) -> dict[str, Any]:
    return asdict(m)
