"""Engine configs run here, one after the other (or a few started together): for each, a
server from the engine supply, each run measured on it and stored, then the server released.
A server that dies mid-way is replaced by a fresh one for the runs left."""

from __future__ import annotations

import dataclasses
from typing import Any

from tunebook.inputs.plan import EngineConfig, PlannedRun
from tunebook.measure.executors.base import Job, Sink
from tunebook.measure.point import PointContext, measure, start_failed
from tunebook.measure.supply import FreshSupply


class LocalExecutor:
    def __init__(self, supply: FreshSupply, ctx: PointContext):
        self.supply = supply
        self.ctx = ctx  # its model is each config's own (run_config)

    def describe(self) -> str | None:
        return None

    def run(self, job: Job, sink: Sink, bar: Any) -> None:
        for batch in self.supply.batches(job.work):
            with self.supply.prepared(batch, job.models, bar):
                for cfg, runs in batch:
                    ctx = dataclasses.replace(self.ctx, model=job.models[cfg.model])
                    self.run_config(cfg, runs, ctx, sink, bar)

    def run_config(self, cfg: EngineConfig, runs: list[PlannedRun], ctx: PointContext,
                   sink: Sink, bar: Any) -> None:
        pending = list(runs)
        while pending:
            supplied = self.supply.get(cfg, pending, ctx.model, bar)
            server = supplied.server
            if supplied.error is not None:
                for measured in start_failed(pending, server, supplied.error, ctx):
                    sink.save(measured)
                    bar.update(1)
                return
            clean = False
            try:
                while pending:
                    bar.set_description(f"[{cfg.label}] {pending[0].point.label}")
                    measured = measure(server, pending[0], ctx)
                    sink.save(measured)
                    if measured.interrupt is not None:
                        raise measured.interrupt
                    pending.pop(0)
                    bar.update(1)
                    if not server.alive():
                        break  # the server died: a fresh one for what is left
                clean = True
            finally:
                self.supply.release(cfg, server, clean)
