"""Where a sweep's engine configs run: here, one after the other (`local.LocalExecutor`), or
spread over a Ray cluster (`ray_cluster.RayExecutor`). An executor takes a `Job` (the params and
the engine configs with their runs to do) and a `Sink` that stores what comes back; it never
sees the sweep. A new executor is a module here with a `run(job, sink, bar)`, and its value of
params' `executor:` in tunebook.inputs.executor (which params reads; this folder sits above it).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tunebook.core import config
from tunebook.inputs import executor as spec
from tunebook.measure.executors.base import RAY_ENV, RAY_SLOTS_ENV

if TYPE_CHECKING:
    from tunebook.inputs.params import SweepParams
    from tunebook.measure.executors.base import Executor


def ray_address(params: SweepParams) -> str | None:
    """The Ray cluster a sweep runs on: `--ray [ADDRESS]` (TUNEBOOK_RAY, which reaches a
    papermill kernel too), else the params' `executor: ray[:ADDRESS]`; "local" starts one
    here; None runs the sweep here without Ray."""
    if os.environ.get(RAY_ENV):
        return os.environ[RAY_ENV]
    return spec.ray_address(params.section(spec.EXECUTOR))


def ray_executor(address: str) -> Executor:
    from tunebook.measure.executors.ray_cluster import RayExecutor

    slots = config.env_number(RAY_SLOTS_ENV, int, 1, "engines at once, 1 or more")
    return RayExecutor(None if address == "local" else address, int(slots) if slots else None)
