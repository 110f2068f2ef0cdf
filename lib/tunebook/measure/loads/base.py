"""What every load kind is: it says which load points it sends, what it needs of the server, and
how it sends one point and reads it back. tunebook.measure.point calls it without knowing
which kind it is."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunebook.inputs.load import LoadPoint
from tunebook.servers.base import Server, ServerOptions

if TYPE_CHECKING:
    from tunebook.inputs.plan import PlannedRun
    from tunebook.measure.context import PointContext


@dataclass
class Sent:
    """What one load point sent and read back."""

    metrics: dict[str, Any] | None  # the row's measured columns
    extra: dict[str, Any] = field(default_factory=dict)  # kept in the run's JSON
    error: str | None = None  # why the point does not count (its row: failed)
    # vLLM's benchmark result, for what is read over its measured window (energy); None for a
    # kind that has none
    result: dict[str, Any] | None = None


class LoadKind(ABC):
    name: str = ""
    # the sweep imports vLLM's benchmark client while the first engine starts
    uses_vllm_client: bool = False
    # the sweep's step a point of this kind is timed as (None: the kind times its own steps)
    step: str | None = None

    @abstractmethod
    def claims(self, point: LoadPoint) -> bool:
        """Whether this kind sends `point`."""

    def server_options(self, point: LoadPoint) -> ServerOptions:
        """What the server must be started with for this kind's points."""
        return ServerOptions()

    @abstractmethod
    def send(self, server: Server, run: PlannedRun, ctx: PointContext, seed: int | None,
             timings: dict[str, float]) -> Sent:
        """Send one point on a started server and read it back; a failure of the client
        itself raises (the caller records it, and asks whether the server died)."""
