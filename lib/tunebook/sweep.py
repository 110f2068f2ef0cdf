"""Orchestration: for each engine config, start one engine, run its load points, save each.

Guarantees (see README "When things go wrong"):
- every attempted run leaves one JSON file, written atomically, never overwritten;
- an engine config that cannot start becomes recorded `engine_failed` rows with the log line
  that explains it, and the sweep goes on;
- Ctrl-C / SIGTERM mark the run in flight `interrupted`, stop the engine, then propagate;
- resume = run the same params again: runs with an `ok` attempt made with the installed vLLM
  version are skipped; one made with another version is run again (see tunebook.plan.Resume).

Each load point: the prefix cache is reset first when the point asks (load.reset_prefix_cache;
a reset that fails makes the run `failed`, it is never skipped silently), the engine's /metrics
is read before and after and sampled while it runs (tunebook.metrics), then vLLM's benchmark
client (or Fig 3.3's probe, tunebook.probe) sends the requests.

Where tunebook's own time goes (benchmarks/sweep_overhead.py, docs/overhead.md): every sweep
sums the wall seconds of its steps in `SweepResult.steps`, and each run's JSON keeps its own
under `timings` (vLLM's client: its import, tokenizer, dataset sampling, and the whole call).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tunebook import config, disagg, hardware, peer, probe, schema
from tunebook import metrics as engine_metrics
from tunebook.engine import (
    Engine,
    EngineRequestError,
    EngineStartError,
    ServerOptions,
    resolve_draft,
)
from tunebook.load import (
    BLOCK_REUSE,
    PROMPT_DATASETS,
    ClientCache,
    bench_argv,
    metrics_row,
    point_seed,
    prefetch_client,
    request_arrays,
    run_bench,
)
from tunebook.models import ModelRef, resolve_model
from tunebook.params import SweepParams
from tunebook.plan import EngineConfig, Plan, PlannedRun, Resume, make_plan
from tunebook.store import Store, replace_atomic, stamp, utc_now, write_new

RAY_ENV, RAY_SLOTS_ENV = "TUNEBOOK_RAY", "TUNEBOOK_RAY_SLOTS"  # `--ray [ADDRESS]`, slots


def portable_argv(argv: list[str]) -> list[str]:
    """An engine's command line as stored with its runs: the model cache's path becomes
    `$TUNEBOOK_CACHE` (shared reports carry no machine paths; a folder's name keeps its preset
    and content hash)."""
    cache = config.model_cache_dir().expanduser()
    roots = sorted({str(cache), str(cache.resolve())}, key=len, reverse=True)
    out = []
    for a in argv:  # also inside an argument (a draft's folder in --speculative-config's JSON)
        for root in roots:
            a = a.replace(root, f"${config.CACHE_ENV}")
        out.append(a)
    return out


class Terminated(BaseException):
    """SIGTERM, turned into an exception so `finally` blocks stop the engine."""


class DeadlineNear(Terminated):
    """Too little time is left before config.deadline() (a lent device's per-call limit) for
    one more engine start and its runs: stopping before the start wastes no device time on
    an engine the limit would kill; a later call resumes from the stored runs."""


def run_seconds(row: dict[str, Any]) -> float:
    """A stored run's own wall time (its warm-ups and benchmark), from its clock fields."""
    try:
        t0, t1 = (datetime.fromisoformat(str(row[k]).replace("Z", "+00:00"))
                  for k in ("started_at", "finished_at"))
    except (KeyError, ValueError):
        return 0.0
    return max(0.0, (t1 - t0).total_seconds())


def time_needed(rows: list[dict[str, Any]], runs: int,
                machine_start_s: float | None = None) -> float | None:
    """Seconds that an engine start and `runs` runs on it took here before, from the stored
    ok rows: the slowest start (a cold compile) plus the median run, `runs` times. With no
    start stored (a fresh experiment), this machine's slowest start of the model
    (slowest_start) alone; None when neither is known: then nothing is known to wait for."""
    ok = [r for r in rows if r.get("status") == schema.STATUS_OK]
    starts = [float(r["startup_s"]) for r in ok if isinstance(r.get("startup_s"), int | float)]
    if not starts:
        return machine_start_s
    each = sorted(run_seconds(r) for r in ok)
    return max(starts) + each[len(each) // 2] * runs


STARTS_FILE = "engine-starts.json"  # in config.state_dir(): the slowest start per model here


def _starts_seen() -> dict[str, Any]:
    try:
        seen = json.loads((config.state_dir() / STARTS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return seen if isinstance(seen, dict) else {}


def note_start(model: str, seconds: Any) -> None:
    """Remember this machine's slowest engine start of `model` (what a deadline waits for in
    an experiment that has stored none yet); best effort: a state dir it cannot write is
    no reason to fail a sweep."""
    if not isinstance(seconds, int | float) or seconds <= (slowest_start(model) or 0.0):
        return
    seen = {**_starts_seen(), model: round(float(seconds), 1)}
    path = config.state_dir() / STARTS_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomic(path, json.dumps(seen, indent=1).encode())
    except OSError:
        pass


def slowest_start(model: str) -> float | None:
    v = _starts_seen().get(model)
    return float(v) if isinstance(v, int | float) else None


class SweepLockedError(RuntimeError):
    pass


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


@dataclass
class SweepResult:
    store: Store
    plan: Plan
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    steps: StepTimes = field(default_factory=StepTimes)

    @property
    def exit_code(self) -> int:
        return 0 if self.failed == 0 else 1


@contextlib.contextmanager
def _flock(path: Path, what: str, advice: str, wait_s: float = 0.0) -> Iterator[None]:
    """An exclusive flock (released by the kernel if the holder dies), holder info inside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
                if time.monotonic() >= deadline:
                    raise SweepLockedError(f"{what} is in use by {holder}; {advice}") from None
                if not told:
                    print(f"waiting up to {wait_s:.0f} s: {what} is in use by {holder}",
                          file=sys.stderr)
                    told = True
                time.sleep(2.0)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({' '.join(sys.argv[:3])[:120]})".encode(), 0)
        yield
    finally:
        os.close(fd)


def experiment_lock(root: Path) -> contextlib.AbstractContextManager[None]:
    """One sweep per experiment folder at a time."""
    return _flock(root / ".lock", f"experiment {root.name}",
                  "wait for it or pick another experiment name")


def machine_lock(wait_s: float = 0.0) -> contextlib.AbstractContextManager[None]:
    """One sweep per machine at a time: two engines would share (and skew) the GPU/CPUs."""
    return _flock(config.state_dir() / "machine.lock", "this machine's accelerator",
                  "wait for that sweep (or pass --wait SECONDS)", wait_s)


@contextlib.contextmanager
def sigterm_as_exception() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _batch() -> bool:
    """Unattended (papermill, cron, a pipe): text progress that does not flood the output."""
    return config.batch() or (
        not sys.stderr.isatty() and "ipykernel" not in sys.modules)


def _progress(total: int, desc: str, enabled: bool):  # -> tqdm
    if _batch():
        from tqdm import tqdm  # plain text, at most one line every 30 s
        return tqdm(total=total, desc=desc, disable=not enabled, mininterval=30.0)
    from tqdm.auto import tqdm  # a widget bar in JupyterLab, a live bar in a terminal
    return tqdm(total=total, desc=desc, disable=not enabled, mininterval=0.5)


def _phase_reporter(bar: Any, label: str) -> Callable[[str, float], None]:
    """Engine start phases into the bar; in batch mode only when the phase changes."""
    last = {"phase": ""}

    def report(phase: str, elapsed_s: float) -> None:
        if _batch() and phase == last["phase"]:
            return
        last["phase"] = phase
        bar.set_description(f"[{label}] engine: {phase} ({elapsed_s:.0f}s)")

    return report


class EngineKeeper:
    """Keeps one engine up between sweeps (the tuning panel): a sweep whose engine config
    matches the kept one reuses it — load settings change without a restart — and a different
    config stops it first. While it holds an engine it holds the machine lock, so no other
    sweep starts a second engine beside it. `stop()` (or the kernel's exit) releases both."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.config_id: str | None = None
        self.starts = 0  # engines started through this keeper (a restart counts)
        self._lock: contextlib.ExitStack | None = None
        # options of the last engine kept per config: a replacement (the engine died, or a
        # sweep needed more) starts with them too, so the next sweep that needed them does
        # not pay for another start
        self._options: dict[str, ServerOptions] = {}

    def hold_machine(self, wait_s: float) -> None:
        if self._lock is None:
            stack = contextlib.ExitStack()
            stack.enter_context(machine_lock(wait_s))
            self._lock = stack

    def take(self, cfg: EngineConfig, options: ServerOptions | None = None) -> Engine | None:
        """The kept engine if it runs `cfg` with at least `options` and is alive; otherwise
        stop it and return None."""
        if self.engine is not None and self.config_id == cfg.id and self.engine.alive() \
                and self.engine.options.covers(options or ServerOptions()):
            return self.engine
        self._stop_engine()
        return None

    def widen(self, cfg: EngineConfig, options: ServerOptions) -> ServerOptions:
        """What a fresh engine of `cfg` is started with: `options` and those of the engines
        of `cfg` kept before."""
        return options.union(self._options.get(cfg.id, ServerOptions()))

    def keep(self, cfg: EngineConfig, engine: Engine) -> None:
        if self.engine is not None and self.engine is not engine:
            self._stop_engine()
        self.engine, self.config_id = engine, cfg.id
        self._options[cfg.id] = self.widen(cfg, engine.options)

    def _stop_engine(self) -> None:
        if self.engine is not None:
            self.engine.stop()
        self.engine = self.config_id = None

    def stop(self) -> None:
        self._stop_engine()
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class Sweep:
    """Runs a plan into a store. `on_result(row)` is called after each saved run, and
    `on_finish(store)` once the sweep ends, however it ends (e.g. `tunebook.index.rebuild`,
    which never raises); with a `keeper` the last engine stays up for the next sweep (see
    EngineKeeper)."""

    def __init__(self, params: SweepParams, outputs: Path | str | None = None,
                 progress: bool = True, on_result: Callable[[dict], None] | None = None,
                 retry_failed: bool = True, wait_s: float | None = None,
                 keeper: EngineKeeper | None = None,
                 on_finish: Callable[[Store], object] | None = None,
                 record_inputs: bool = True, rebuild_table: bool = True,
                 only_runs: set[str] | None = None, machine_lock: bool = True,
                 executor: Any | None = None):
        self.params = params
        self.plan = make_plan(params)
        self._stored_ok: list[dict[str, Any]] = []  # read by _run: what a deadline waits for
        self.store = Store(Path(outputs or config.outputs_dir()) / params.experiment)
        self.progress = progress
        self.on_result = on_result
        self.on_finish = on_finish
        self.retry_failed = retry_failed
        self.keeper = keeper
        # False: a caller running many one-point sweeps (tunebook.slo_search) records its
        # inputs and rebuilds the table once itself
        self.record_inputs = record_inputs
        self.rebuild_table = rebuild_table
        # a Ray task's share of a sweep (tunebook.ray_sweep): only these runs; Ray's resources,
        # not the machine lock, keep engines apart there
        self.only_runs = only_runs
        self.machine_lock = machine_lock
        # runs elsewhere: tunebook.ray_sweep.RayExecutor (`--ray`, or TUNEBOOK_RAY in the env,
        # which reaches a papermill kernel too)
        address = os.environ.get(RAY_ENV) or (
            {"ray": "local"}.get(params.executor) or params.executor.removeprefix("ray:")
            if params.executor != "local" else None)
        if executor is None and address and keeper is None:
            from tunebook.ray_sweep import RayExecutor

            slots = config.env_number(RAY_SLOTS_ENV, int, 1, "engines at once, 1 or more")
            executor = RayExecutor(None if address == "local" else address,
                                   int(slots) if slots else None)
        self.executor = executor
        self.steps = StepTimes()
        self.client = ClientCache()  # one tokenizer load per sweep, not one per run
        # How long to wait for another sweep holding the machine (`--wait` sets the env var,
        # which also reaches the papermill kernel).
        self.wait_s = wait_s if wait_s is not None else config.wait_s()

    # -- what would run -------------------------------------------------------------------
    def resume(self, rows: list[dict[str, Any]] | None = None) -> Resume:
        """What the store settles for this plan under the installed vLLM (reads every run
        file once, unless given its `rows`). With retry_failed=False any attempt counts, not
        only an ok one."""
        statuses = (schema.STATUS_OK,) if self.retry_failed else None
        return Resume.from_rows(self.store.rows() if rows is None else rows,
                                hardware.vllm_version(), statuses)

    def done(self) -> set[str]:
        """Run ids resume skips: done with the installed vLLM version."""
        return set(self.resume().done)

    def describe(self) -> str:
        text = self.plan.describe(self.resume())
        if self.params.figures_only:
            text += "\nfigures only (figures_only: true): nothing to run, no engine starts"
        if self.executor is not None:
            text += ("\n\non Ray: one task per engine config, "
                     + (f"cluster {self.executor.address}" if self.executor.address else
                        f"a local cluster of {self.executor.slots or 1} engine slot(s)")
                     + "; rows come back to this store (tunebook.ray_sweep)")
        n = self.params.start_together
        if n > 1:
            text += (f"\n\nstart_together: {n} engine configs start at once, then each is "
                     "measured alone (the others wait idle) and stopped when its runs are done")
        return text

    # -- running ----------------------------------------------------------------------------
    def run(self) -> SweepResult:
        # every model of the grid, draft models included, resolves before any engine starts
        with self.steps.time("resolve models"):
            models = {e.model: resolve_model(e.model) for e in self.plan.engines}
            for e in self.plan.engines:
                resolve_draft(e.knobs)
            if self.executor is None:  # on Ray the node that runs a config must have it
                peer.require_installed([e.knobs for e in self.plan.engines])
        config.deadline()  # a malformed deadline is said now, before anything is written
        self.store.check_writable()
        machine = (contextlib.nullcontext() if self.keeper or not self.machine_lock
                   else machine_lock(self.wait_s))
        with experiment_lock(self.store.root), machine, sigterm_as_exception():
            if self.keeper:
                self.keeper.hold_machine(self.wait_s)
            if self.record_inputs:
                with self.steps.time("record inputs"):
                    self._record_inputs()
            try:
                return self._run(models)
            finally:
                if self.on_finish is not None:
                    self.on_finish(self.store)

    def _record_inputs(self) -> None:
        s = stamp()
        params_text = yaml.safe_dump(self.params.to_dict(), sort_keys=False)
        write_new(self.store.root / "inputs" / f"params__{s}.yaml", params_text.encode())
        # where it ran, readable without rows (a figures-only experiment: Fig 6.1's topology)
        facts = {**hardware.machine(), "gpu_topology": hardware.nvidia_smi_topo()}
        write_new(self.store.root / "inputs" / f"machine__{s}.json",
                  json.dumps(facts, indent=1, default=str).encode())
        replace_atomic(self.store.root / "plan.json",
                       json.dumps(self.plan.to_dict(), indent=1, default=str).encode())

    def _run(self, models: dict[str, ModelRef]) -> SweepResult:
        with self.steps.time("resume (read stored runs)"):
            rows = self.store.rows()
            resume = self.resume(rows)
        self._stored_ok = [r for r in rows if r.get("status") == schema.STATUS_OK]
        todo = [r for r in self.plan.runs if r.run_id not in resume.done
                and (self.only_runs is None or r.run_id in self.only_runs)]
        rerun = [r for r in todo if r.run_id in resume.rerun]
        if rerun:  # said, not silent: these have ok results, from another vLLM
            old = sorted({v or "unrecorded" for r in rerun for v in resume.rerun[r.run_id]})
            print(f"{self.params.experiment}: {len(rerun)} run(s) done with vLLM "
                  f"{', '.join(old)} run again under the installed vLLM {resume.installed}",
                  file=sys.stderr)
        result = SweepResult(self.store, self.plan, skipped=len(self.plan.runs) - len(todo),
                             steps=self.steps)
        bar = _progress(len(todo), f"{self.params.experiment}", self.progress)
        work = [(cfg, [r for r in todo if r.engine.id == cfg.id]) for cfg in self.plan.engines]
        work = [(cfg, runs) for cfg, runs in work if runs]
        together = 1 if self.keeper else self.params.start_together
        if self.executor is not None and work:
            try:
                self.executor.run(self, work, result, bar)
            finally:
                bar.close()
                if self.rebuild_table:
                    self.store.rebuild_table()
            return result
        if any(r.point.dataset != BLOCK_REUSE for r in todo):
            prefetch_client()  # imported while the first engine starts, at nice 19
        try:
            for batch in batches(work, together):
                if len(batch) == 1:
                    cfg, runs = batch[0]
                    self._run_engine(cfg, runs, models[cfg.model], result, bar)
                else:
                    self._run_batch(batch, models, result, bar)
        finally:
            bar.close()
            if self.rebuild_table:
                with self.steps.time("rebuild table"):
                    self.store.rebuild_table()
        return result

    def _check_deadline(self, cfg: EngineConfig, runs: int) -> None:
        """DeadlineNear when config.deadline() leaves less than this store's record of a
        start and `runs` runs (time_needed); nothing stored or no deadline: go ahead."""
        deadline = config.deadline()
        if deadline is None:
            return
        need = time_needed(self._stored_ok, runs, slowest_start(cfg.model))
        left = deadline - time.time()
        if need is not None and left < need:
            raise DeadlineNear(
                f"{left:.0f} s left before {config.DEADLINE_ENV}; a start and {runs} run(s) "
                f"took up to {need:.0f} s here: {cfg.label} not started (run again to resume)")

    def _engine(self, cfg: EngineConfig, runs: list[PlannedRun], model: ModelRef) -> Engine:
        options = server_options(runs)
        if self.keeper:
            options = self.keeper.widen(cfg, options)
        if disagg.is_pair(cfg.knobs):  # prefill + decode engines and a proxy (Fig 6.2)
            return disagg.DisaggPair(  # type: ignore[return-value] - an Engine to the sweep
                model, cfg.knobs, cfg.env, self.store.engine_log_path(cfg.id),
                startup_timeout_s=self.params.startup_timeout_s, options=options)
        return Engine(model, cfg.knobs, cfg.env, self.store.engine_log_path(cfg.id),
                      startup_timeout_s=self.params.startup_timeout_s, options=options)

    def _run_batch(self, batch: list[tuple[EngineConfig, list[PlannedRun]]],
                   models: dict[str, ModelRef], result: SweepResult, bar: Any) -> None:
        """`start_together`: the engines of several configs of one model start at once
        (starts are mostly CPU-bound imports, compilation and graph capture), then each is
        measured alone while the others wait idle, and stopped when its runs are done. Rows
        record how many engines started together: their `startup_s` was measured under that
        contention."""
        self._check_deadline(batch[0][0], sum(len(runs) for _, runs in batch))
        engines = {cfg.id: self._engine(cfg, runs, models[cfg.model]) for cfg, runs in batch}
        n = sum(2 if isinstance(e, disagg.DisaggPair) else 1 for e in engines.values())
        for engine in engines.values():
            engine.started_together = n  # a disaggregated pair is two engines
        errors: dict[str, BaseException] = {}

        def start(cfg_id: str) -> None:
            try:
                engines[cfg_id].start()
            except BaseException as e:  # noqa: BLE001 - recorded below, in the main thread
                errors[cfg_id] = e

        threads = [threading.Thread(target=start, args=(cfg.id,), daemon=True,
                                    name=f"start-{cfg.id}") for cfg, _ in batch]
        t0 = time.monotonic()
        try:
            for t in threads:
                t.start()
            started_at = time.monotonic()
            shown = None
            while any(t.is_alive() for t in threads):
                up = sum(e.alive() and e.facts is not None for e in engines.values())
                if not _batch() or up != shown:  # unattended logs: only when it changes
                    shown = up
                    bar.set_description(f"starting {len(batch)} engines together: {up} "
                                        f"ready ({wait_seconds(t0):.0f}s)")
                for t in threads:  # short joins: Ctrl-C and SIGTERM reach this thread
                    t.join(timeout=0.5)
            self.steps.add("engine start", time.monotonic() - started_at, len(threads))
            for cfg, _ in batch:
                if cfg.id not in errors:
                    note_start(cfg.model, engines[cfg.id].startup_s)
            for cfg, runs in batch:
                engine, error = engines[cfg.id], errors.get(cfg.id)
                if error is not None and not isinstance(error, EngineStartError):
                    raise error
                self._run_engine(cfg, runs, models[cfg.model], result, bar,
                                 started=engine, start_error=error)
        finally:
            with self.steps.time("engine stop"):
                for engine in engines.values():
                    engine.stop()
            for t in threads:
                t.join(timeout=30)

    def _run_engine(self, cfg: EngineConfig, runs: list[PlannedRun], model: ModelRef,
                    result: SweepResult, bar: Any, started: Engine | None = None,
                    start_error: BaseException | None = None) -> None:
        """Runs `runs` on one engine of `cfg`: the kept one, `started` (started with others,
        or `start_error` when that failed), or a fresh one; an engine that dies mid-way is
        replaced by a fresh one for what is left."""
        pending = list(runs)
        options = server_options(runs)
        while pending:
            kept = self.keeper.take(cfg, options) if self.keeper else None
            engine = kept or started or self._engine(cfg, runs, model)
            bar.set_description(f"[{cfg.label}] " + ("engine kept up" if kept else
                                                     "starting engine"))
            try:
                if start_error is not None:
                    raise start_error
                if not kept and started is None:
                    self._check_deadline(cfg, len(pending))
                    if self.keeper:
                        self.keeper.starts += 1
                    with self.steps.time("engine start"):
                        engine.start(on_phase=_phase_reporter(bar, cfg.label))
                    note_start(cfg.model, engine.startup_s)
            except EngineStartError as e:
                for run in pending:
                    self._save(run, model, engine, result, status=schema.STATUS_ENGINE_FAILED,
                               error=e.diagnosis.error, error_line=e.diagnosis.line,
                               error_hint=e.diagnosis.hint, extra={"log_tail": e.log_tail})
                    bar.update(1)
                return
            finally:
                started, start_error = None, None  # a replacement engine starts alone
            clean = False
            try:
                while pending:
                    run = pending[0]
                    bar.set_description(f"[{cfg.label}] {run.point.label}")
                    self._one(run, model, engine, result)
                    pending.pop(0)
                    bar.update(1)
                    if not engine.alive():
                        break  # the engine died: start a fresh one for what is left
                clean = True
            finally:
                # Kept only after a clean pass: an interrupt or crash always stops the engine.
                if self.keeper is not None and clean and engine.alive():
                    self.keeper.keep(cfg, engine)
                else:
                    with self.steps.time("engine stop"):
                        engine.stop()

    def _one(self, run: PlannedRun, model: ModelRef, engine: Engine,
             result: SweepResult) -> None:
        point = run.point
        seed = point_seed(point)
        timeout_s = self.params.run_timeout_for(run.part)
        started = utc_now()
        row_extra: dict[str, Any] = {"prefix_cache_reset": False}
        timings: dict[str, float] = {}  # this run's steps, kept in its JSON
        if point.reset_prefix_cache:
            with self._timed("prefix-cache reset", timings):
                reset = engine.reset_prefix_cache()
            if not reset.ok:  # measured on a warm cache the point would flatter: not run
                self._save(run, model, engine, result, status=schema.STATUS_FAILED,
                           started=started, seed=seed, row_extra=row_extra,
                           error=f"prefix cache reset failed after {reset.attempts} "
                                 f"attempt(s): {reset.detail}"[:500],
                           error_hint="load.reset_prefix_cache needs the engine's dev mode "
                                      "(tunebook sets VLLM_SERVER_DEV_MODE=1) and no request "
                                      "in flight; set it false to measure on a warm cache")
                return
            row_extra["prefix_cache_reset"] = True
        scrape_errors: list[str] = []
        pair = engine if isinstance(engine, disagg.DisaggPair) else None
        try:  # a pair counts the KV that crosses from its prefill to its decode engine
            tally = pair.begin_point() if pair else None
        except EngineRequestError as e:
            tally = None
            scrape_errors.append(f"disaggregation tally: {e}"[:200])
        with self._timed("metrics scrapes", timings):
            before = self._scrape(engine, scrape_errors)
        log_from = engine.log_offsets()
        sampler = engine_metrics.Sampler(engine.metrics_text)
        try:
            with sampler:
                if point.dataset == BLOCK_REUSE:
                    with self._timed("block-reuse probe", timings):
                        found = probe.run(engine, point, seed, timeout_s=timeout_s,
                                          vocab_size=(model.config or {}).get("vocab_size"))
                else:
                    argv = bench_argv(point, engine.base_url, "tunebook-model",
                                      model.tokenizer, seed)
                    client: dict[str, float] = {}
                    try:
                        res, printed = run_bench(argv, api_key=engine.api_key,
                                                 timeout_s=timeout_s, cache=self.client,
                                                 timings=client)
                    finally:
                        self._client_steps(client, timings)
        except (KeyboardInterrupt, Terminated) as e:
            self._save(run, model, engine, result, status=schema.STATUS_INTERRUPTED,
                       started=started, seed=seed, row_extra=row_extra,
                       error=f"interrupted ({type(e).__name__})")
            raise
        except Exception as e:  # noqa: BLE001 - any client failure is recorded, not fatal
            died = _exited(engine)
            status = schema.STATUS_INTERRUPTED if died else schema.STATUS_FAILED
            why = f" (engine exited, code {engine.proc.returncode})" if died else ""
            self._save(run, model, engine, result, status=status, started=started, seed=seed,
                       row_extra=row_extra, error=f"{type(e).__name__}: {e}{why}"[:500],
                       extra={"engine_log_tail": engine.log_tail()})
            return
        with self._timed("metrics scrapes", timings):
            after = self._scrape(engine, scrape_errors)
        row_extra.update(engine_metrics.row(before, after, sampler))
        pair_record = None
        if pair and tally:
            pair_cols, pair_record = pair.end_point(tally)
            row_extra.update(pair_cols)
        extra: dict[str, Any] = {
            "timings": timings,
            "engine_metrics": engine_metrics.record(before, after, sampler, scrape_errors),
            # byte ranges of the shared engine logs that this load wrote (Figs 8.2, 8.3)
            "log_span": {k: [v, engine.log_offsets().get(k, v)] for k, v in log_from.items()}}
        if pair_record is not None:
            extra["disagg"] = pair_record
        status = schema.STATUS_OK
        error = None
        if point.dataset == BLOCK_REUSE:
            metrics, error = found.row, found.error
            extra.update(found.record)
            if error:
                status = schema.STATUS_FAILED
        else:
            metrics = metrics_row(res, point)
            texts = point.dataset in PROMPT_DATASETS
            extra.update({"requests": request_arrays(res, texts), "bench_output": printed[-4000:]})
            if not metrics.get("completed"):
                status, error = schema.STATUS_FAILED, _first_error(res) or "no request completed"
            elif metrics.get("failed_requests"):
                # vLLM's metrics leave failed requests out: the numbers would flatter this run.
                status = schema.STATUS_FAILED
                error = (f"{metrics['failed_requests']} request(s) failed: "
                         f"{_first_error(res)}")[:500]
        if not engine.alive() or (status != schema.STATUS_OK and _exited(engine)):
            status, error = schema.STATUS_INTERRUPTED, "engine exited during the run"
        self._save(run, model, engine, result, status=status, started=started, seed=seed,
                   metrics=metrics, row_extra=row_extra, error=error, extra=extra)

    @contextlib.contextmanager
    def _timed(self, step: str, timings: dict[str, float]) -> Iterator[None]:
        """A step of one run: into the sweep's StepTimes and the run's `timings`."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            s = time.monotonic() - t0
            self.steps.add(step, s)
            key = step.replace("-", "_").replace(" ", "_") + "_s"
            timings[key] = timings.get(key, 0.0) + s

    _CLIENT_STEPS = {"client_s": "client (vLLM's, whole call)",
                     "client_import_s": "client: import vllm.benchmarks.serve",
                     "client_tokenizer_s": "client: tokenizer",
                     "client_samples_s": "client: dataset sampling"}

    def _client_steps(self, client: dict[str, float], timings: dict[str, float]) -> None:
        timings.update(client)
        for key, step in self._CLIENT_STEPS.items():
            if key in client:
                self.steps.add(step, client[key])

    @staticmethod
    def _scrape(engine: Engine, errors: list[str]) -> engine_metrics.Snapshot | None:
        """One /metrics snapshot; a failure is noted in the run's JSON, the point goes on."""
        try:
            return engine_metrics.Snapshot.from_text(engine.metrics_text())
        except (EngineRequestError, engine_metrics.MetricsParseError) as e:
            errors.append(str(e)[:200])
            return None

    def _save(self, run: PlannedRun, model: ModelRef, engine: Engine, result: SweepResult, *,
              status: str, started: str | None = None, seed: int | None = None,
              metrics: dict | None = None, row_extra: dict | None = None,
              error: str | None = None, error_line: str | None = None,
              error_hint: str | None = None, extra: dict | None = None) -> None:
        facts = engine.facts.as_row() if engine.facts else {}
        phases = engine.phases.as_row() if getattr(engine, "phases", None) else {}
        row: dict[str, Any] = {
            "schema_version": schema.SCHEMA_VERSION, "run_id": run.run_id,
            "experiment": self.params.experiment, "status": status,
            "engine_config_id": run.engine.id, "engine_label": run.engine.label,
            "repeat": run.repeat, "part": run.part or None,
            "started_at": started or utc_now(), "finished_at": utc_now(),
            "model": run.engine.model, "load_format": model.load_format,
            **run.point.as_row(), "seed": seed,
            **(metrics or {}), **(row_extra or {}), **facts, **phases,
            "startup_s": engine.startup_s,
            "engines_started_together": engine.started_together,
            "disaggregated": isinstance(engine, disagg.DisaggPair),
            "error": error, "error_line": error_line, "error_hint": error_hint,
            **hardware.machine(),
            **run.engine.knobs,
        }
        record = {
            "row": row,
            "engine": {
                # no secrets in argv (the key is in the environment), and no machine paths:
                # the model folder is named relative to the model cache
                "argv": portable_argv(engine.argv[1:]),
                "env": run.engine.env,
                "log": os.path.relpath(engine.log_path, self.store.root),
                "process_tree": engine.process_tree,
                **({"pair": engine.record()} if isinstance(engine, disagg.DisaggPair) else {}),
            },
            "params_source": self.params.source,
            **(extra or {}),
        }
        with self.steps.time("save run"):
            self.store.save_run(record)
        result.rows.append(row)
        if status == schema.STATUS_OK:
            result.ok += 1
            self._stored_ok.append(row)  # the next start's deadline check counts this run
        else:
            result.failed += 1
        if self.on_result:
            self.on_result(row)


def batches(work: list[tuple[EngineConfig, list[PlannedRun]]], size: int
            ) -> list[list[tuple[EngineConfig, list[PlannedRun]]]]:
    """Engine configs in groups that start together: configs of one model (engines of one
    size share the accelerator predictably), in plan order, at most `size` per group. One at a
    time (size 1) keeps the plan's order exactly."""
    if size == 1:
        return [[item] for item in work]
    by_model: dict[str, list[tuple[EngineConfig, list[PlannedRun]]]] = {}
    for item in work:
        by_model.setdefault(item[0].model, []).append(item)
    return [group[i:i + size] for group in by_model.values()
            for i in range(0, len(group), size)]


def server_options(runs: list[PlannedRun]) -> ServerOptions:
    """What the engine must be started with for these runs: dev mode when any resets the
    prefix cache, prompt-token details when any is the block-reuse probe."""
    return ServerOptions(
        dev_mode=any(r.point.reset_prefix_cache for r in runs),
        prompt_tokens_details=any(r.point.dataset == BLOCK_REUSE for r in runs))


def _exited(engine: Engine, grace_s: float = 2.0) -> bool:
    """Whether the engine's server exited. A run that went wrong asks with a grace: the client
    sees a killed server's connections drop a moment before its process can be reaped, and
    that run is `interrupted` (the engine died), not `failed`."""
    deadline = time.monotonic() + grace_s
    while engine.alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _first_error(res: dict) -> str | None:
    return next((e for e in res.get("errors", []) if e), None)


def run(params: SweepParams, outputs: Path | str | None = None, **kw: Any) -> SweepResult:
    return Sweep(params, outputs, **kw).run()


def wait_seconds(t0: float) -> float:
    return time.monotonic() - t0
