"""Measuring one run on a started server: `measure(server, run, ctx) -> Measured`, the run's
record (its result row and everything kept beside it), whatever happened.

- The prefix cache is reset first when the point asks (load.reset_prefix_cache; a reset that
  fails makes the run `failed`, it is never skipped silently).
- The server's /metrics is read before and after and sampled while it runs
  (tunebook.servers.metrics), and the server watches what else it counts (a pair: the KV that
  crossed between its engines).
- the point's load kind (tunebook.measure.loads: vLLM's benchmark client, Fig 3.3's probe)
  sends the requests and reads them back; this module never asks which kind it is.
- Ctrl-C / SIGTERM: the record says `interrupted` and carries the interrupt, which the caller
  raises once the record is stored. A client failure is `failed`; a server that died under it
  makes the run `interrupted` (run again on resume), found by the server's watchdog within a
  fraction of a second and said as which process died and how ("engine core exited:
  SIGKILL"); one that stopped answering ends the run at its timeout, said so. Either way
  `Measured.engine_lost` tells the executor to replace the engine.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tunebook.core import hardware, schema
from tunebook.inputs import cost
from tunebook.inputs.load import point_seed
from tunebook.inputs.plan import PlannedRun
from tunebook.measure import energy, loads
from tunebook.measure.client import LoadError
from tunebook.measure.context import PointContext
from tunebook.measure.locks import Terminated
from tunebook.measure.progress import StepTimes
from tunebook.results.store import utc_now
from tunebook.servers import metrics as engine_metrics
from tunebook.servers.base import (
    EngineDiedError,
    EngineRequestError,
    EngineStartError,
    NoWatch,
    Server,
)


@dataclass
class Outcome:
    """How a run ended, and what it measured (the row's and the record's parts)."""

    status: str
    started: str | None = None
    seed: int | None = None
    metrics: dict[str, Any] | None = None
    row_extra: dict[str, Any] | None = None
    error: str | None = None
    error_line: str | None = None
    error_hint: str | None = None
    extra: dict[str, Any] | None = None


@dataclass
class Measured:
    """A run's record, to store; `interrupt` (Ctrl-C, SIGTERM) is raised once it is stored;
    `engine_lost` says why its engine cannot serve the next run (it died, or hung)."""

    record: dict[str, Any]
    interrupt: BaseException | None = None
    engine_lost: str | None = None

    @property
    def row(self) -> dict[str, Any]:
        return self.record["row"]


def record_of(run: PlannedRun, server: Server, ctx: PointContext, out: Outcome) -> dict:
    """A run's record: the row (tunebook.core.schema's columns) and what is kept beside it."""
    row: dict[str, Any] = {
        "schema_version": schema.SCHEMA_VERSION, "run_id": run.run_id,
        "experiment": ctx.params.experiment, "status": out.status,
        "engine_config_id": run.engine.id, "engine_label": run.engine.label,
        "repeat": run.repeat, "part": run.part or None,
        "started_at": out.started or utc_now(), "finished_at": utc_now(),
        "model": run.engine.model, "load_format": ctx.model.load_format if ctx.model else None,
        **run.point.as_row(), "seed": out.seed,
        **hardware.machine(),  # before the server's: an engine of another vLLM names it
        **(out.metrics or {}), **(out.row_extra or {}), **server.row(),
        **cost.columns(ctx.params.section(cost.SECTION), run.engine.knobs, out.metrics or {}),
        "error": out.error, "error_line": out.error_line, "error_hint": out.error_hint,
        **run.engine.knobs,
    }
    return {"row": row, "engine": server.record(ctx.store_root),
            "params_source": ctx.params.source, **(out.extra or {})}


def start_failed(runs: list[PlannedRun], server: Server, error: EngineStartError,
                 ctx: PointContext) -> list[Measured]:
    """The records of runs whose engine did not start: `engine_failed`, with the log line
    that explains it and the fix."""
    d = error.diagnosis
    out = Outcome(schema.STATUS_ENGINE_FAILED, error=d.error, error_line=d.line,
                  error_hint=d.hint, extra={"log_tail": error.log_tail})
    return [Measured(record_of(run, server, ctx, out)) for run in runs]


@contextlib.contextmanager
def _timed(step: str, timings: dict[str, float], steps: StepTimes) -> Iterator[None]:
    """A step of one run: into the sweep's StepTimes and the run's `timings`."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        s = time.monotonic() - t0
        steps.add(step, s)
        key = step.replace("-", "_").replace(" ", "_") + "_s"
        timings[key] = timings.get(key, 0.0) + s


def _scrape(server: Server, errors: list[str]) -> engine_metrics.Snapshot | None:
    """One /metrics snapshot; a failure is noted in the run's JSON, the point goes on."""
    try:
        return engine_metrics.Snapshot.from_text(server.metrics_text())
    except (EngineRequestError, engine_metrics.MetricsParseError) as e:
        errors.append(str(e)[:200])
        return None


def exited(server: Server, grace_s: float = 2.0) -> str | None:
    """What of the server died, if it did. A run that went wrong asks with a grace: the client
    sees a killed server's connections drop a moment before the process has exited, and that
    run is `interrupted` (the engine died), not `failed`."""
    deadline = time.monotonic() + grace_s
    while server.alive():  # alive() asks the watchdog too
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    return server.death() or "the engine exited"


def _lost(run: PlannedRun, server: Server, ctx: PointContext, out: Outcome, what: str,
          said: str = "the engine died: ") -> Measured:
    """The run's record when its engine died or hung under it: `interrupted` (run again on
    resume), saying which process and how (`said` + `what`), and when tunebook found it."""
    out.status, out.error = schema.STATUS_INTERRUPTED, (said + what)[:500]
    out.extra = {**(out.extra or {}), "engine_lost": {"why": what, "found_at": time.time()},
                 "engine_log_tail": server.log_tail()}
    return Measured(record_of(run, server, ctx, out), engine_lost=what)


def measure(server: Server, run: PlannedRun, ctx: PointContext) -> Measured:
    """Run one planned run on a started server; its record, whatever happened. Ctrl-C or
    SIGTERM anywhere in it (the reset, a scrape, the client) makes it `interrupted`."""
    out = Outcome(schema.STATUS_FAILED, started=utc_now(), seed=point_seed(run.point),
                  row_extra={"prefix_cache_reset": False})
    try:
        return _measure(server, run, ctx, out)
    except (KeyboardInterrupt, Terminated) as e:
        out.status, out.error = schema.STATUS_INTERRUPTED, f"interrupted ({type(e).__name__})"
        return Measured(record_of(run, server, ctx, out), interrupt=e)


def _measure(server: Server, run: PlannedRun, ctx: PointContext, out: Outcome) -> Measured:
    point = run.point
    timings: dict[str, float] = {}  # this run's steps, kept in its JSON
    if point.reset_prefix_cache:
        with _timed("prefix-cache reset", timings, ctx.steps):
            reset = server.reset_prefix_cache()
        if not reset.ok and (died := exited(server, grace_s=0.5)) is not None:
            return _lost(run, server, ctx, out, died)
        if not reset.ok:  # measured on a warm cache the point would flatter: not run
            out.error = (f"prefix cache reset failed after {reset.attempts} "
                         f"attempt(s): {reset.detail}")[:500]
            out.error_hint = ("load.reset_prefix_cache needs the engine's dev mode (tunebook "
                              "sets VLLM_SERVER_DEV_MODE=1) and no request in flight; set it "
                              "false to measure on a warm cache")
            return Measured(record_of(run, server, ctx, out))
        out.row_extra = {"prefix_cache_reset": True}
    scrape_errors: list[str] = []
    try:
        watch = server.watch_point()
    except EngineRequestError as e:
        watch = NoWatch()
        scrape_errors.append(str(e)[:200])
    with _timed("metrics scrapes", timings, ctx.steps):
        before = _scrape(server, scrape_errors)
    log_from = server.log_offsets()
    sampler = engine_metrics.Sampler(server.metrics_text)
    kind = loads.kind_for(point)
    # the GPUs' energy over the measured window: a kind whose result says when its requests
    # ran (vLLM's client) is measured; one that does not (the probe's two requests) is not
    meter = energy.EnergySampler(*energy.open_counter()) if kind.uses_vllm_client else None
    try:
        with sampler, meter or contextlib.nullcontext(), (
                _timed(kind.step, timings, ctx.steps) if kind.step
                else contextlib.nullcontext()):
            sent = kind.send(server, run, ctx, out.seed, timings)
    except EngineDiedError as e:  # the watchdog saw it while the client ran
        return _lost(run, server, ctx, out, e.death)
    except Exception as e:  # noqa: BLE001 - any client failure is recorded, not fatal
        if (died := exited(server)) is not None:
            return _lost(run, server, ctx, out, died)
        if isinstance(e, LoadError) and (stuck := server.hung()) is not None:
            return _lost(run, server, ctx, out, f"{stuck} ({e})", said="")
        out.error = f"{type(e).__name__}: {e}"[:500]
        out.extra = {"engine_log_tail": server.log_tail()}
        return Measured(record_of(run, server, ctx, out))
    with _timed("metrics scrapes", timings, ctx.steps):
        after = _scrape(server, scrape_errors)
    out.row_extra.update(engine_metrics.row(before, after, sampler))
    watched, sections = watch.end()
    out.row_extra.update(watched)
    out.extra = {
        "timings": timings,
        "engine_metrics": engine_metrics.record(before, after, sampler, scrape_errors),
        # byte ranges of the shared engine logs that this load wrote (Figs 8.2, 8.3)
        "log_span": {k: [v, server.log_offsets().get(k, v)] for k, v in log_from.items()},
        **sections, **sent.extra}
    out.metrics, out.error = sent.metrics, sent.error
    out.status = schema.STATUS_FAILED if sent.error else schema.STATUS_OK
    if sent.result is not None and sent.metrics is not None:
        out.row_extra.update(energy.row(meter, sent.result,
                                        sent.metrics.get("total_output_tokens")))
        if meter is not None and meter.counter is not None:
            out.extra["energy"] = {"devices": meter.counter.devices,
                                   "samples": len(meter.samples), "errors": meter.errors[:5]}
    if (not server.alive() or out.status != schema.STATUS_OK) \
            and (died := exited(server)) is not None:  # at once when it is gone already
        return _lost(run, server, ctx, out, died)
    return Measured(record_of(run, server, ctx, out))
