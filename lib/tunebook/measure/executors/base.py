"""What every executor shares: the `Job` it is given, the `Sink` it hands results to, and the
`Executor` protocol itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tunebook.inputs.params import SweepParams
    from tunebook.inputs.plan import EngineConfig, PlannedRun
    from tunebook.measure.point import Measured
    from tunebook.models.presets import ModelRef

RAY_ENV, RAY_SLOTS_ENV = "TUNEBOOK_RAY", "TUNEBOOK_RAY_SLOTS"  # `--ray [ADDRESS]`, slots


@dataclass
class Job:
    params: SweepParams
    work: list[tuple[EngineConfig, list[PlannedRun]]]  # engine configs, their runs to do
    models: dict[str, ModelRef]  # every model of the work, resolved


class Sink(Protocol):
    """Where an executor hands what it measured (the sweep's store)."""

    def save(self, measured: Measured) -> None:
        """A run measured here: store its record."""

    def save_file(self, name: str, data: bytes) -> None:
        """A run file measured elsewhere, as it came back: a run's JSON, or the Parquet file
        of its per-request arrays (`<run>.requests.parquet`), which comes first."""

    def save_log(self, name: str, data: bytes) -> None:
        """An engine log made elsewhere."""


class Executor(Protocol):
    def run(self, job: Job, sink: Sink, bar: Any) -> None: ...

    def describe(self) -> str | None:
        """What a dry run says about where the configs run (None: here, nothing to say)."""
