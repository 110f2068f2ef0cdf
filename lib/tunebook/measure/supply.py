"""Engine supply: a started server for each engine config of a sweep, and what becomes of it
after its runs.

- `FreshSupply`: a new server per config, stopped when its runs are done (a replacement when
  one dies mid-way);
- `KeptSupply`: an `EngineKeeper` keeps the last server up between sweeps (the tuning panel,
  the SLO search): a later sweep of the same config reuses it, so load settings change without
  a restart;
- `TogetherSupply` (`start_together: N`): the servers of N configs of one model start at once,
  then each is measured alone while the others wait idle.

Every supply owns the start records: this machine's slowest start of each model, and the
deadline rule (`Starts.check`): no server is started that the stored runs say cannot finish
before config.deadline() (a lent device's per-call limit).
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from tunebook.core import config, schema
from tunebook.core.threads import Background
from tunebook.inputs.plan import EngineConfig, PlannedRun
from tunebook.measure import loads, progress
from tunebook.measure.locks import Terminated, machine_lock
from tunebook.measure.progress import StepTimes
from tunebook.models.presets import ModelRef
from tunebook.results.store import replace_atomic
from tunebook.servers.base import EngineStartError, Server, ServerOptions
from tunebook.servers.kinds import StartSettings, server_for

Work = list[tuple[EngineConfig, list[PlannedRun]]]  # engine configs and their runs to do


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


@dataclass
class Starts:
    """The deadline rule over this experiment's stored ok rows (the sweep adds each new ok
    row: the next start's check counts it)."""

    stored_ok: list[dict[str, Any]] = field(default_factory=list)

    def check(self, cfg: EngineConfig, runs: int) -> None:
        """DeadlineNear when config.deadline() leaves less than this store's record of a
        start and `runs` runs (time_needed); nothing stored or no deadline: go ahead."""
        deadline = config.deadline()
        if deadline is None:
            return
        need = time_needed(self.stored_ok, runs, slowest_start(cfg.model))
        left = deadline - time.time()
        if need is not None and left < need:
            raise DeadlineNear(
                f"{left:.0f} s left before {config.DEADLINE_ENV}; a start and {runs} run(s) "
                f"took up to {need:.0f} s here: {cfg.label} not started (run again to resume)")


def server_options(runs: list[PlannedRun]) -> ServerOptions:
    """What the engine must be started with for these runs: dev mode when any resets the
    prefix cache, and what their load kinds need (tunebook.measure.loads)."""
    return loads.server_options(r.point for r in runs)


@dataclass
class SupplyContext:
    """What any supply needs to start a server: where engine logs go, how servers start (the
    sweep's settings, built once from its params; each start adds the server options its
    runs need), the sweep's step clock and its start records."""

    engine_logs: Any  # engine config id -> log path (Store.engine_log_path)
    start: StartSettings
    steps: StepTimes
    starts: Starts


@dataclass
class Supplied:
    """A server for a config: started, or `error` says why its start failed (the server still
    says what was tried: its argv, its log)."""

    server: Server
    error: EngineStartError | None = None


class FreshSupply:
    """A new server per engine config, stopped when its runs are done."""

    def __init__(self, ctx: SupplyContext):
        self.ctx = ctx

    def batches(self, work: Work) -> list[Work]:
        return [[item] for item in work]

    @contextlib.contextmanager
    def prepared(self, batch: Work, models: dict[str, ModelRef], bar: Any) -> Iterator[None]:
        """Around one batch's configs (a supply that starts them together does so here)."""
        yield

    def get(self, cfg: EngineConfig, runs: list[PlannedRun], model: ModelRef,
            bar: Any) -> Supplied:
        bar.set_description(f"[{cfg.label}] starting engine")
        server = self.new(cfg, model, self.options_for(cfg, runs))
        self.ctx.starts.check(cfg, len(runs))
        return self._start(cfg, server, bar)

    def options_for(self, cfg: EngineConfig, runs: list[PlannedRun]) -> ServerOptions:
        """What a fresh server of `cfg` is started with for these runs."""
        return server_options(runs)

    def release(self, cfg: EngineConfig, server: Server, clean: bool) -> None:
        """After the config's runs (`clean`: all measured, no interrupt or crash)."""
        with self.ctx.steps.time("engine stop"):
            server.stop()

    def new(self, cfg: EngineConfig, model: ModelRef, options: ServerOptions) -> Server:
        log = Path(self.ctx.engine_logs(cfg.id))
        return server_for(model, cfg.knobs, cfg.env, log,
                          replace(self.ctx.start, options=options))

    def _start(self, cfg: EngineConfig, server: Server, bar: Any) -> Supplied:
        try:
            with self.ctx.steps.time("engine start"):
                server.start(on_phase=progress.phase_reporter(bar, cfg.label))
        except EngineStartError as e:
            return Supplied(server, e)
        note_start(cfg.model, server.startup_s)
        return Supplied(server)


class EngineKeeper:
    """Keeps one engine up between sweeps (the tuning panel): a sweep whose engine config
    matches the kept one reuses it — load settings change without a restart — and a different
    config stops it first. While it holds an engine it holds the machine lock, so no other
    sweep starts a second engine beside it. `stop()` (or the kernel's exit) releases both."""

    def __init__(self) -> None:
        self.engine: Server | None = None
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

    def take(self, cfg: EngineConfig, options: ServerOptions | None = None) -> Server | None:
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

    def keep(self, cfg: EngineConfig, engine: Server) -> None:
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


class KeptSupply(FreshSupply):
    """The keeper's engine when it runs the config with the options the runs need; otherwise
    a fresh one, which the keeper keeps after a clean pass."""

    def __init__(self, ctx: SupplyContext, keeper: EngineKeeper):
        super().__init__(ctx)
        self.keeper = keeper

    def get(self, cfg: EngineConfig, runs: list[PlannedRun], model: ModelRef,
            bar: Any) -> Supplied:
        kept = self.keeper.take(cfg, server_options(runs))
        if kept is not None:
            bar.set_description(f"[{cfg.label}] engine kept up")
            return Supplied(kept)
        bar.set_description(f"[{cfg.label}] starting engine")
        server = self.new(cfg, model, self.options_for(cfg, runs))
        self.ctx.starts.check(cfg, len(runs))
        self.keeper.starts += 1
        return self._start(cfg, server, bar)

    def options_for(self, cfg: EngineConfig, runs: list[PlannedRun]) -> ServerOptions:
        """The runs' needs and those of the engines of `cfg` kept before (a replacement keeps
        the options of the engine it replaces)."""
        return self.keeper.widen(cfg, server_options(runs))

    def release(self, cfg: EngineConfig, server: Server, clean: bool) -> None:
        # Kept only after a clean pass: an interrupt or crash always stops the engine.
        if clean and server.alive():
            self.keeper.keep(cfg, server)
        else:
            super().release(cfg, server, clean)


def batches(work: Work, size: int) -> list[Work]:
    """Engine configs in groups that start together: configs of one model (engines of one
    size share the accelerator predictably), in plan order, at most `size` per group. One at a
    time (size 1) keeps the plan's order exactly."""
    if size == 1:
        return [[item] for item in work]
    by_model: dict[str, Work] = {}
    for item in work:
        by_model.setdefault(item[0].model, []).append(item)
    return [group[i:i + size] for group in by_model.values()
            for i in range(0, len(group), size)]


class TogetherSupply(FreshSupply):
    """`start_together`: the engines of several configs of one model start at once (starts are
    mostly CPU-bound imports, compilation and graph capture), then each is measured alone
    while the others wait idle, and stopped when its runs are done. Rows record how many
    engines started together: their `startup_s` was measured under that contention."""

    def __init__(self, ctx: SupplyContext, size: int):
        super().__init__(ctx)
        self.size = size
        self._ready: dict[str, tuple[Server, BaseException | None]] = {}

    def batches(self, work: Work) -> list[Work]:
        return batches(work, self.size)

    @contextlib.contextmanager
    def prepared(self, batch: Work, models: dict[str, ModelRef], bar: Any) -> Iterator[None]:
        if len(batch) == 1:
            yield
            return
        self.ctx.starts.check(batch[0][0], sum(len(runs) for _, runs in batch))
        servers = {cfg.id: self.new(cfg, models[cfg.model], server_options(runs))
                   for cfg, runs in batch}
        n = sum(s.engines for s in servers.values())  # a disaggregated pair is two engines
        for server in servers.values():
            server.started_together = n
        errors: dict[str, BaseException] = {}

        def start(cfg_id: str) -> None:
            try:
                servers[cfg_id].start()
            except BaseException as e:  # noqa: BLE001 - handed to get(), in the main thread
                errors[cfg_id] = e

        t0 = time.monotonic()
        starts: list[Background] = []
        try:
            starts = [Background(functools.partial(start, cfg.id), f"start-{cfg.id}")
                      for cfg, _ in batch]
            shown = None
            while any(b.running() for b in starts):
                up = sum(s.alive() and s.facts is not None for s in servers.values())
                if not progress.batch() or up != shown:  # unattended logs: when it changes
                    shown = up
                    bar.set_description(f"starting {len(batch)} engines together: {up} "
                                        f"ready ({time.monotonic() - t0:.0f}s)")
                for b in starts:  # short waits: Ctrl-C and SIGTERM reach this thread
                    b.wait(0.5)
            self.ctx.steps.add("engine start", time.monotonic() - t0, len(starts))
            for cfg, _ in batch:
                if cfg.id not in errors:
                    note_start(cfg.model, servers[cfg.id].startup_s)
            self._ready = {cid: (s, errors.get(cid)) for cid, s in servers.items()}
            yield
        finally:
            self._ready = {}
            with self.ctx.steps.time("engine stop"):
                for server in servers.values():
                    server.stop()
            for b in starts:  # a start stopped under it ends soon after
                b.wait(30)

    def get(self, cfg: EngineConfig, runs: list[PlannedRun], model: ModelRef,
            bar: Any) -> Supplied:
        if cfg.id not in self._ready:  # alone, or a replacement: it starts alone
            return super().get(cfg, runs, model, bar)
        server, error = self._ready.pop(cfg.id)
        bar.set_description(f"[{cfg.label}] starting engine")
        if error is not None and not isinstance(error, EngineStartError):
            raise error
        return Supplied(server, error)
