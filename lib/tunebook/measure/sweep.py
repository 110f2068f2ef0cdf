"""A sweep: the plan's runs, measured by an executor and stored, resumable.

Guarantees (see README "When things go wrong"):
- every attempted run leaves one JSON file, written atomically, never overwritten;
- an engine config that cannot start becomes recorded `engine_failed` rows with the log line
  that explains it, and the sweep goes on;
- Ctrl-C / SIGTERM mark the run in flight `interrupted`, stop the engine, then propagate;
- resume = run the same params again: runs with an `ok` attempt made with the installed vLLM
  version are skipped; one made with another version is run again (tunebook.inputs.plan.Resume).

The pieces: engines come from an engine supply (tunebook.measure.supply), each run is measured
by tunebook.measure.point.measure, and an executor (tunebook.measure.executors: here, or Ray)
drives them; this module checks and locks, reads what is stored, and stores what comes back.
Where tunebook's own time goes (benchmarks/sweep_overhead.py, docs/overhead.md): every sweep
sums the wall seconds of its steps in `SweepResult.steps`, and each run's JSON keeps its own
under `timings`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunebook.core import config, hardware, schema
from tunebook.inputs.params import SweepParams
from tunebook.inputs.plan import Plan, Resume, make_plan
from tunebook.measure import client, loads, progress
from tunebook.measure.executors import ray_address, ray_executor
from tunebook.measure.executors.base import Executor, Job
from tunebook.measure.executors.local import LocalExecutor
from tunebook.measure.locks import (
    experiment_lock,
    machine_lock,
    signals_deferred,
    sigterm_as_exception,
)
from tunebook.measure.point import Measured, PointContext
from tunebook.measure.progress import StepTimes
from tunebook.measure.supply import (
    EngineKeeper,
    FreshSupply,
    KeptSupply,
    Starts,
    SupplyContext,
    TogetherSupply,
)
from tunebook.models.presets import resolve_model
from tunebook.results import machines, measurements
from tunebook.results.compact import REQUESTS_SUFFIX
from tunebook.results.store import Store, replace_atomic, stamp, write_new
from tunebook.servers import kinds as server_kinds
from tunebook.servers.launcher import FAST_START
from tunebook.servers.shm import SHM_DIR, SHM_REAP_EVERY_S, reap_shared_memory


@dataclass
class SweepOptions:
    progress: bool = True
    on_result: Callable[[dict], None] | None = None  # after each stored run, with its row
    on_finish: Callable[[Store], object] | None = None  # once, however the sweep ends
    retry_failed: bool = True  # False: any stored attempt counts as done, not only an ok one
    wait_s: float | None = None  # for another sweep holding the machine (None: --wait's)
    keeper: EngineKeeper | None = None  # keep the last engine up for the next sweep
    # False: a caller running many one-point sweeps (tunebook.search.tune) records its inputs
    # and rebuilds the table once itself
    record_inputs: bool = True
    rebuild_table: bool = True
    # a Ray task's share of a sweep (tunebook.measure.executors.ray_worker): only these runs;
    # Ray's resources, not the machine lock, keep engines apart there
    only_runs: set[str] | None = None
    machine_lock: bool = True
    executor: Executor | None = None  # None: here, or Ray when --ray / params say so
    # a dated measurement (tunebook.results.measurements): only attempts that began at or
    # after this UTC time count as done, so the plan is measured again; None: every attempt
    # (resume). Unset, a papermill kernel's sweep takes it from TUNEBOOK_MEASURE_SINCE.
    since: str | None = None


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


class Sweep:
    """Runs a plan into a store (see SweepOptions for what a caller can change)."""

    def __init__(self, params: SweepParams, outputs: Path | str | None = None,
                 options: SweepOptions | None = None):
        self.params = params
        self.options = options or SweepOptions()
        self.plan = make_plan(params)
        # the entry points (cli, notebooks, the panel) settle this box's folder when they run
        self.store = Store(machines.experiments_root(outputs, settle=False) / params.experiment)
        self.steps = StepTimes()
        self.starts = Starts()  # the deadline rule's record: ok rows stored and made here
        address = ray_address(params) if self.options.keeper is None else None
        self.executor = self.options.executor or (ray_executor(address) if address else None)
        # How long to wait for another sweep holding the machine (`--wait` sets the env var,
        # which also reaches the papermill kernel).
        self.wait_s = config.wait_s() if self.options.wait_s is None else self.options.wait_s

    # -- what would run -------------------------------------------------------------------
    def resume(self, rows: list[dict[str, Any]] | None = None) -> Resume:
        """What the store settles for this plan under the installed vLLM (reads every run
        file once, unless given its `rows`). With retry_failed=False any attempt counts, not
        only an ok one."""
        statuses = (schema.STATUS_OK,) if self.options.retry_failed else None
        rows = self.store.rows() if rows is None else rows
        since = self.options.since or measurements.since_from_env()
        if since:  # a new dated measurement: what earlier ones measured is kept, not reused
            rows = [r for r in rows if measurements.inside(r, since)]
        return Resume.from_rows(rows, hardware.vllm_version(), statuses)

    def done(self) -> set[str]:
        """Run ids resume skips: done with the installed vLLM version."""
        return set(self.resume().done)

    def describe(self) -> str:
        text = self.plan.describe(self.resume())
        if self.params.figures_only:
            text += "\nfigures only (figures_only: true): nothing to run, no engine starts"
        where = self.executor.describe() if self.executor is not None else None
        if where:
            text += f"\n\n{where}"
        n = self.params.start_together
        if n > 1:
            text += (f"\n\nstart_together: {n} engine configs start at once, then each is "
                     "measured alone (the others wait idle) and stopped when its runs are done")
        return text

    # -- running ----------------------------------------------------------------------------
    def run(self) -> SweepResult:
        models = self.resolve(self.plan)
        with self.open() as session:
            return session.run(self.params, self.plan, models)

    def resolve(self, plan: Plan) -> dict:
        """Every model of the plan, draft models included, resolved before any engine starts;
        on Ray the node that runs a config must have its engine kind installed."""
        with self.steps.time("resolve models"):
            models = {e.model: resolve_model(e.model) for e in plan.engines}
            server_kinds.preflight([e.knobs for e in plan.engines], here=self.executor is None)
        return models

    @contextlib.contextmanager
    def open(self) -> Iterator[SweepSession]:
        """The sweep held open: checked, locked, its inputs recorded and its stored runs read,
        once. `run` hands it its own plan; the SLO search (tunebook.search.tune) hands it one
        point after another, each chosen from the last."""
        config.deadline()  # a malformed deadline is said now, before anything is written
        self.store.check_writable()
        if self.executor is None and (left := reap_shared_memory(every_s=SHM_REAP_EVERY_S)):
            print(f"tunebook: removed {len(left)} shared-memory segment(s) in "
                  f"{SHM_DIR} that engines which died had left (no process maps them)",
                  file=sys.stderr)
        opts = self.options
        machine = (contextlib.nullcontext() if opts.keeper or not opts.machine_lock
                   else machine_lock(self.wait_s))
        with experiment_lock(self.store.root), machine, sigterm_as_exception():
            if opts.keeper:
                opts.keeper.hold_machine(self.wait_s)
            if opts.record_inputs:
                with self.steps.time("record inputs"):
                    self.record_inputs()
            try:
                yield SweepSession(self)
            finally:
                if opts.on_finish is not None:
                    opts.on_finish(self.store)

    def record_inputs(self) -> None:
        """The params and the machine, beside the runs; the plan, replaced."""
        s = stamp()
        params_text = yaml.safe_dump(self.params.to_dict(), sort_keys=False)
        write_new(self.store.root / "inputs" / f"params__{s}.yaml", params_text.encode())
        # where it ran, readable without rows (a figures-only experiment: Fig 6.1's topology)
        facts = {**hardware.machine(), "gpu_topology": hardware.nvidia_smi_topo()}
        write_new(self.store.root / "inputs" / f"machine__{s}.json",
                  json.dumps(facts, indent=1, default=str).encode())
        replace_atomic(self.store.root / "plan.json",
                       json.dumps(self.plan.to_dict(), indent=1, default=str).encode())

    def local_executor(self) -> LocalExecutor:
        """Engine configs run here, from the supply the options ask for."""
        start = server_kinds.StartSettings(timeout_s=self.params.startup_timeout_s,
                                           fast_start=self.params.section(FAST_START))
        ctx = SupplyContext(self.store.engine_log_path, start, self.steps, self.starts)
        keeper = self.options.keeper
        supply = (KeptSupply(ctx, keeper) if keeper else
                  TogetherSupply(ctx, self.params.start_together)
                  if self.params.start_together > 1 else FreshSupply(ctx))
        return LocalExecutor(supply, PointContext(self.params, self.store.root, steps=self.steps))


class SweepSession:
    """An open sweep (Sweep.open): one executor, and the stored rows read once, to which what
    it stores is added, for every plan handed to it."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        with sweep.steps.time("resume (read stored runs)"):
            self.rows = sweep.store.rows()
        sweep.starts.stored_ok = [r for r in self.rows if r.get("status") == schema.STATUS_OK]
        self.executor = sweep.executor  # None: the local one, made at the first plan

    def run(self, params: SweepParams, plan: Plan, models: dict) -> SweepResult:
        """The runs of `plan` (made from `params`) that are not done yet, measured and stored;
        the others skipped."""
        sweep, opts = self.sweep, self.sweep.options
        resume = sweep.resume(self.rows)
        only = opts.only_runs
        todo = [r for r in plan.runs if r.run_id not in resume.done
                and (only is None or r.run_id in only)]
        rerun = [r for r in todo if r.run_id in resume.rerun]
        if rerun:  # said, not silent: these have ok results, from another vLLM
            old = sorted({v or "unrecorded" for r in rerun for v in resume.rerun[r.run_id]})
            print(f"{params.experiment}: {len(rerun)} run(s) done with vLLM "
                  f"{', '.join(old)} run again under the installed vLLM {resume.installed}",
                  file=sys.stderr)
        result = SweepResult(sweep.store, plan, skipped=len(plan.runs) - len(todo),
                             steps=sweep.steps)
        # no bar for a plan already done (a resumed search asks again for every stored point)
        bar = progress.bar(len(todo), f"{params.experiment}", opts.progress and bool(todo))
        work = [(cfg, [r for r in todo if r.engine.id == cfg.id]) for cfg in plan.engines]
        work = [(cfg, runs) for cfg, runs in work if runs]
        if self.executor is None:
            if loads.any_uses_vllm_client(r.point for r in todo):
                client.prefetch_client()  # imported while the first engine starts, at nice 19
            self.executor = sweep.local_executor()
        try:
            if work:
                self.executor.run(Job(params, work, models),
                                  StoreSink(sweep.store, result, opts.on_result, sweep.starts),
                                  bar)
        finally:
            self.rows.extend(result.rows)
            bar.close()
            if opts.rebuild_table:
                with sweep.steps.time("rebuild table"):
                    sweep.store.rebuild_table()
        return result


class StoreSink:
    """What an executor hands back, into the store: each run file written once, never over;
    counted; the sweep's on_result called with its row."""

    def __init__(self, store: Store, result: SweepResult,
                 on_result: Callable[[dict], None] | None, starts: Starts):
        self.store, self.result, self.on_result, self.starts = store, result, on_result, starts

    def save(self, measured: Measured) -> None:
        # a SIGTERM that lands while the record is written waits for it: once measured, a
        # run is kept (the engine dying and the scheduler's SIGTERM can come a moment apart)
        with signals_deferred(), self.result.steps.time("save run"):
            self.store.save_run(measured.record)
        self._count(measured.row)

    def save_file(self, name: str, data: bytes) -> None:
        with contextlib.suppress(FileExistsError):
            write_new(self.store.runs_dir / name, data)
        if not name.endswith(REQUESTS_SUFFIX):  # a run's arrays come before its JSON
            self._count(json.loads(data).get("row", {}))

    def save_log(self, name: str, data: bytes) -> None:
        path = self.store.root / "engines" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            write_new(path, data)

    def _count(self, row: dict[str, Any]) -> None:
        self.result.rows.append(row)
        if row.get("status") == schema.STATUS_OK:
            self.result.ok += 1
            self.starts.stored_ok.append(row)  # the next start's deadline check counts it
        else:
            self.result.failed += 1
        if self.on_result:
            self.on_result(row)


def run(params: SweepParams, outputs: Path | str | None = None,
        options: SweepOptions | None = None) -> SweepResult:
    return Sweep(params, outputs, options).run()
