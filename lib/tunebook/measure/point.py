"""Measuring one run on a started server: `measure(server, run, ctx) -> Measured`, the run's
record (its result row and everything kept beside it), whatever happened.

- The prefix cache is reset first when the point asks (load.reset_prefix_cache; a reset that
  fails makes the run `failed`, it is never skipped silently).
- The server's /metrics is read before and after and sampled while it runs
  (tunebook.servers.metrics), and the server watches what else it counts (a pair: the KV that
  crossed between its engines).
- vLLM's benchmark client (tunebook.measure.client), or Fig 3.3's probe (tunebook.measure.probe),
  sends the requests.
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
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunebook.core import hardware, schema
from tunebook.inputs import cost
from tunebook.inputs.load import BLOCK_REUSE, PROMPT_DATASETS, bench_argv, point_seed
from tunebook.inputs.params import SweepParams
from tunebook.inputs.plan import PlannedRun
from tunebook.measure import energy, probe
from tunebook.measure.client import (
    ClientCache,
    LoadError,
    metrics_row,
    request_arrays,
    run_bench,
)
from tunebook.measure.locks import Terminated
from tunebook.measure.progress import StepTimes
from tunebook.models.presets import ModelRef
from tunebook.results.store import utc_now
from tunebook.servers import metrics as engine_metrics
from tunebook.servers.base import (
    SERVED_NAME,
    EngineDiedError,
    EngineRequestError,
    EngineStartError,
    NoWatch,
    Server,
)


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
        **(out.metrics or {}), **(out.row_extra or {}), **server.row(),
        **cost.columns(ctx.params.section(cost.SECTION), run.engine.knobs, out.metrics or {}),
        "error": out.error, "error_line": out.error_line, "error_hint": out.error_hint,
        **hardware.machine(),
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


CLIENT_STEPS = {"client_s": "client (vLLM's, whole call)",
                "client_import_s": "client: import vllm.benchmarks.serve",
                "client_tokenizer_s": "client: tokenizer",
                "client_samples_s": "client: dataset sampling"}


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


def _said(error: str) -> str:
    """What a failed request died of: the last line of its traceback ("Type: message"), or
    the server's own words (vLLM's client stores a traceback, or a reason like 'Bad Request')."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else error.strip()


def error_summary(res: dict) -> str | None:
    """The failed requests of a run in a few words: the first one's exception and message,
    and, when they died of several things, how many of each (`2x ServerDisconnectedError,
    1x TimeoutError`). None when no request failed; the tracebacks stay in the run's JSON."""
    said = [_said(e) for e in res.get("errors", []) if e]
    if not said:
        return None
    kinds = Counter(s.split(":", 1)[0].rsplit(".", 1)[-1] for s in said)
    if len(kinds) == 1:
        return said[0]
    return said[0] + " (" + ", ".join(f"{n}x {k}" for k, n in kinds.most_common()) + ")"


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
    meter = energy.EnergySampler(*energy.open_counter()) \
        if point.dataset != BLOCK_REUSE else None
    try:
        with sampler, meter or contextlib.nullcontext():
            if point.dataset == BLOCK_REUSE:
                with _timed("block-reuse probe", timings, ctx.steps):
                    vocab = ((ctx.model.config if ctx.model else None) or {}).get("vocab_size")
                    found = probe.run(server, point, out.seed, timeout_s=_timeout(run, ctx),
                                      vocab_size=vocab)
            else:
                res, printed = _bench(server, run, ctx, out.seed, timings)
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
        **sections}
    out.status = schema.STATUS_OK
    if point.dataset == BLOCK_REUSE:
        out.metrics, out.error = found.row, found.error
        out.extra.update(found.record)
        if out.error:
            out.status = schema.STATUS_FAILED
    else:
        texts = point.dataset in PROMPT_DATASETS
        out.extra.update({"requests": request_arrays(res, texts),
                          "bench_output": printed[-4000:]})
        try:
            out.metrics = metrics_row(res, point)
            out.row_extra.update(energy.row(meter, res, out.metrics.get("total_output_tokens")))
            if meter is not None and meter.counter is not None:
                out.extra["energy"] = {"devices": meter.counter.devices,
                                       "samples": len(meter.samples),
                                       "errors": meter.errors[:5]}
        except Exception as e:  # noqa: BLE001 - a result tunebook cannot read: a failed row,
            # with vLLM's arrays kept for a later reading, not a crashed sweep
            out.status = schema.STATUS_FAILED
            out.error = (f"tunebook could not read vLLM's result: {type(e).__name__}: {e} "
                         f"(its keys: {', '.join(sorted(res))})")[:500]
        else:
            if not out.metrics.get("completed"):
                out.status = schema.STATUS_FAILED
                out.error = (error_summary(res) or "no request completed")[:500]
            elif out.metrics.get("failed_requests"):
                # vLLM's metrics leave failed requests out: the numbers would flatter this run
                out.status = schema.STATUS_FAILED
                out.error = (f"{out.metrics['failed_requests']} request(s) failed: "
                             f"{error_summary(res)}")[:500]
    if (not server.alive() or out.status != schema.STATUS_OK) \
            and (died := exited(server)) is not None:  # at once when it is gone already
        return _lost(run, server, ctx, out, died)
    return Measured(record_of(run, server, ctx, out))


def _timeout(run: PlannedRun, ctx: PointContext) -> float:
    return ctx.params.run_timeout_for(run.part)


def _bench(server: Server, run: PlannedRun, ctx: PointContext, seed: int | None,
           timings: dict[str, float]) -> tuple[dict, str]:
    """vLLM's benchmark client on the server; its steps into the run's timings."""
    assert ctx.model is not None, "the executor sets each config's model"
    argv = bench_argv(run.point, server.base_url, SERVED_NAME, ctx.model.tokenizer, seed)
    client: dict[str, float] = {}
    try:
        return run_bench(argv, api_key=server.api_key, timeout_s=_timeout(run, ctx),
                         cache=ctx.client, timings=client, death=server.death)
    finally:
        timings.update(client)
        for key, step in CLIENT_STEPS.items():
            if key in client:
                ctx.steps.add(step, client[key])
