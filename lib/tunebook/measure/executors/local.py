"""Engine configs run here, one after the other (or a few started together): for each, a
server from the engine supply, each run measured on it and stored, then the server released.
A server that dies (during its start, a run, or between two) is replaced by a fresh one for the
runs left; one whose engines keep dying before any run is measured gives up after MAX_DEATHS."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from tunebook.inputs.plan import EngineConfig, PlannedRun
from tunebook.measure.executors.base import Job, Sink
from tunebook.measure.point import PointContext, measure, start_failed
from tunebook.measure.supply import FreshSupply
from tunebook.servers.base import EngineDiedAtStartError, EngineStartError
from tunebook.servers.startup import Diagnosis

MAX_DEATHS = 3  # engines of one config that may die in a row with no run measured on them


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
        deaths: list[str] = []  # this config's engines that died, in order (rows carry them)
        in_a_row = 0  # engines that died with no run measured on them, since the last run
        server = None
        while pending:
            if server is not None and in_a_row >= MAX_DEATHS:
                for measured in start_failed(pending, server, gave_up(server, deaths), ctx):
                    sink.save(measured)
                    bar.update(1)
                return
            supplied = self.supply.get(cfg, pending, ctx.model, bar)
            server = supplied.server
            server.replaces = tuple(deaths)
            error = supplied.error
            if isinstance(error, EngineDiedAtStartError):
                in_a_row += 1
                deaths.append(_said(cfg, f"{error.death}, during its start", bar))
                continue
            if error is not None:
                for measured in start_failed(pending, server, error, ctx):
                    sink.save(measured)
                    bar.update(1)
                return
            lost: str | None = None
            try:
                while pending:
                    if (died := server.death()) is not None:  # between two runs: none lost
                        lost, in_a_row = f"{died}, between two runs", in_a_row + 1
                        break
                    bar.set_description(f"[{cfg.label}] {pending[0].point.label}")
                    measured = measure(server, pending[0], ctx)
                    sink.save(measured)
                    if measured.interrupt is not None:
                        raise measured.interrupt
                    pending.pop(0)
                    bar.update(1)
                    in_a_row = 0
                    if measured.engine_lost is not None:
                        lost = f"{measured.engine_lost}, during {measured.row['run_id']}"
                        break
            finally:
                self.supply.release(cfg, server, clean=lost is None and server.alive())
            if lost is not None:
                deaths.append(_said(cfg, lost, bar))


def gave_up(server: Any, deaths: list[str]) -> EngineStartError:
    """Why a config's runs are left: its engines kept dying before a run was measured."""
    return EngineStartError(Diagnosis(
        f"{len(deaths)} engines of this config died in a row before a run could be measured; "
        f"the last: {deaths[-1]}", None,
        "look at the machine's memory (dmesg: the OOM killer) and what else runs there; "
        "the runs are run again on resume"), server.log_path, server.log_tail())


def _said(cfg: EngineConfig, death: str, bar: Any) -> str:
    """A death, told where the sweep's progress goes (papermill's log, a terminal, cron's
    mail); kept for the rows of the engine that replaces it."""
    print(f"tunebook: [{cfg.label}] the engine died: {death}; a new engine runs the rest",
          file=sys.stderr, flush=True)
    return death
