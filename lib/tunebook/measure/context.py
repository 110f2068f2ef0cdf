"""What every run of a sweep shares, as the load kinds and the point see it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tunebook.inputs.params import SweepParams
from tunebook.measure.client import ClientCache
from tunebook.measure.progress import StepTimes
from tunebook.models.presets import ModelRef


@dataclass
class PointContext:
    """What every run of a sweep shares: its params, where its store is (records name logs
    relative to it), the model (each engine config's own: the executor sets it), vLLM's client
    cache (one tokenizer load per sweep) and the sweep's step clock."""

    params: SweepParams
    store_root: Path
    model: ModelRef | None = None
    client: ClientCache = field(default_factory=ClientCache)
    steps: StepTimes = field(default_factory=StepTimes)
