"""Sweeps spread over a Ray cluster: one Ray task per engine config, many at once.

vLLM itself runs multi-node on Ray, so Ray places tunebook's engines too — not a home-made
scheduler, and never two engines on one GPU (that would distort every number):

- **The driver** (this process) does what a local sweep does around the runs: resolves every
  model and checks the store before anything starts, holds the experiment lock, records the
  inputs, reads what is stored (resume), and writes every row it gets back atomically into the
  experiment's store — the same files, names and run ids as a local sweep.
- **Each task** asks Ray for what its engine needs — whole GPUs (tensor × pipeline parallel),
  or on a CPU cluster one `tunebook_engine_slot` (a custom resource, so two engines never share
  cores: the task pins its engine to its slot's cores) — and runs an ordinary local sweep of
  that config's runs in a subprocess (its own process group) on the node Ray picked, into a
  scratch store there. Each finished run file streams back to the driver as it lands, so a
  lost node loses at most the run in flight. Rows carry the node's own hardware facts (`host`,
  GPU), so a mixed cluster keeps each row's machine.
- **Ctrl-C / SIGTERM** on the driver cancels the tasks; each task then sends SIGTERM to its
  subprocess, which marks its run interrupted and stops its engine's process group: no orphan.
  An engine that dies mid-run is the local sweep's case: the run is stored `interrupted`, and
  the next sweep resumes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tunebook.core import config
from tunebook.measure.executors.base import RAY_ENV, RAY_SLOTS_ENV, Job, Sink
from tunebook.results.compact import REQUESTS_FILE
from tunebook.servers.base import DIE_WITH_PARENT_ENV, api_key

SLOT_RESOURCE = "tunebook_engine_slot"
POLL_S = 0.5


@dataclass(frozen=True)
class Slot:
    """Where one engine may run on a node: its index, and the CPU cores it is pinned to
    (CPU clusters; on GPU nodes Ray's CUDA_VISIBLE_DEVICES places it)."""

    index: int
    cores: str | None


def gpus_needed(knobs: dict[str, Any]) -> int:
    """Whole GPUs an engine config needs: tensor × pipeline parallel."""
    return int(knobs.get("tensor_parallel_size") or 1) * int(
        knobs.get("pipeline_parallel_size") or 1)


@contextlib.contextmanager
def claim_slot(slots: int, root: Path) -> Iterator[Slot]:
    """Take the first free of this node's `slots` (a file lock each): Ray counts the slots,
    this says which cores are ours."""
    root.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per = max(1, (cores or 1) // max(1, slots))
    deadline = time.monotonic() + 600
    while True:
        for i in range(slots):
            f = (root / f"slot-{i}.lock").open("w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            try:
                yield Slot(i, f"{i * per}-{i * per + per - 1}" if per > 1 else str(i * per))
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no free engine slot of {slots} under {root} in 600 s")
        time.sleep(POLL_S)


def worker_env(slot: Slot | None, state_dir: Path, gpu: bool) -> dict[str, str]:
    """The subprocess's environment: its own state folder (engine pid files, the machine lock of
    its slot), the driver's API key (vLLM 0.26 hashes it into compile caches), its cores."""
    env = {k: v for k, v in config.user_environ().items()
           if k not in (RAY_ENV, RAY_SLOTS_ENV)}  # the task's sweep runs here
    env.update({config.STATE_DIR_ENV: str(state_dir), "TUNEBOOK_BATCH": "1",
                DIE_WITH_PARENT_ENV: "1"})  # a driver killed hard leaves no engine running
    if slot is not None and not gpu and slot.cores is not None:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", slot.cores)
    return env


def _stop_flag() -> Any:
    """A Ray actor the driver sets to stop its tasks (Ctrl-C / SIGTERM). Cooperative, unlike
    ray.cancel: a task that sees it stops its sweep (the run in flight is marked interrupted,
    the engine stopped) and still streams that row and its logs back."""
    import ray

    @ray.remote(num_cpus=0)
    class StopFlag:
        def __init__(self) -> None:
            self.stop = False

        def set(self) -> None:
            self.stop = True

        def get(self) -> bool:
            return self.stop

    return StopFlag.remote()


def _asked_to_stop(flag: Any) -> bool:
    if flag is None:
        return False
    import ray

    try:
        return bool(ray.get(flag.get.remote(), timeout=5))
    except Exception:  # noqa: BLE001 - the driver is gone: stop
        return True


def new_run_files(runs: Path, sent: set[str]) -> Iterator[tuple[str, str, bytes]]:
    """The run files in `runs` not yet in `sent` (added to it), as items to stream: for each
    run ("requests", name, bytes) of its Parquet file first when its JSON names one, then
    ("run", name, bytes) of the JSON. The order the store writes them in: the driver never
    holds a JSON whose arrays are still to come. The local sweep writes the Parquet file
    before the JSON, so a JSON that is there has its file there too."""
    for f in sorted(runs.glob("*.json")) if runs.is_dir() else []:
        if f.name in sent:
            continue
        sent.add(f.name)
        data = f.read_bytes()
        try:
            ref = json.loads(data).get(REQUESTS_FILE)
        except (ValueError, AttributeError):
            ref = None
        name = ref.get("name") if isinstance(ref, dict) else None
        if isinstance(name, str) and Path(name).name == name and (runs / name).is_file():
            yield "requests", name, (runs / name).read_bytes()
        yield "run", f.name, data


def run_config(params_yaml: str, run_ids: list[str], api_key: str, slots: int,
               gpu: bool, stop: Any = None) -> Iterator[tuple[str, str, bytes]]:
    """A Ray task's body (a generator: each item streams back as it is yielded): run these
    runs of one engine config in a local sweep on this node; yield each run's files as they
    land (`new_run_files`: ("requests", name, bytes) of its arrays' Parquet file, then ("run",
    name, bytes) of its JSON), then ("log", name, bytes) for the engine logs, then ("exit",
    str(rc), b""). When `stop` (a _stop_flag) is set, SIGTERM the sweep and keep streaming
    until it has exited (its interrupted row comes back too)."""
    scratch = Path(tempfile.mkdtemp(prefix="tunebook-ray-"))
    try:
        (scratch / "params.yaml").write_text(params_yaml)
        (scratch / "runs.json").write_text(json.dumps(run_ids))
        params = yaml.safe_load(params_yaml)
        exp = scratch / "outputs" / params["experiment"]
        slot_cm = (contextlib.nullcontext(None) if gpu
                   else claim_slot(slots, Path(tempfile.gettempdir()) / "tunebook-ray-slots"))
        with slot_cm as slot:
            state = scratch / "state"
            state.mkdir()
            key = state / "api_key"
            key.write_text(api_key)
            key.chmod(0o600)
            proc = subprocess.Popen(
                [sys.executable, "-m", "tunebook.measure.executors.ray_worker", str(scratch)],
                env=worker_env(slot, state, gpu), start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=(scratch / "worker.log").open("wb"))
            sent: set[str] = set()
            stopping = False
            try:
                while True:
                    done = proc.poll() is not None
                    if not done and not stopping and _asked_to_stop(stop):
                        stopping = True  # the sweep marks its run interrupted, stops its engine
                        os.killpg(proc.pid, signal.SIGTERM)
                    yield from new_run_files(exp / "runs", sent)
                    if done:
                        break
                    time.sleep(POLL_S)
            finally:
                if proc.poll() is None:  # cancelled: the sweep stops its engine, marks its run
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(60)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            for f in sorted((exp / "engines").glob("*")) if (exp / "engines").is_dir() else []:
                yield "log", f.name, f.read_bytes()
            err = (scratch / "worker.log").read_bytes()[-4000:]
            yield "exit", str(proc.returncode), err
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class RayExecutor:
    """Runs a sweep's engine configs on Ray (`--ray`, or `executor: ray` in params)."""

    def __init__(self, address: str | None = None, slots: int | None = None):
        self.address = address
        self.slots = slots

    def describe(self) -> str:
        return ("on Ray: one task per engine config, "
                + (f"cluster {self.address}" if self.address else
                   f"a local cluster of {self.slots or 1} engine slot(s)")
                + "; rows come back to this store (tunebook.measure.executors.ray_cluster)")

    def init(self) -> int:
        """Connect (an address) or start a local cluster; the engine slots per node."""
        import ray

        if not ray.is_initialized():
            # ray.init installs Ray's C++ failure handler for SIGTERM, which logs and aborts:
            # the driver would die without cancelling a task or stopping an engine. Put back
            # the handlers it had (the sweep's: SIGTERM -> Terminated, Ctrl-C -> interrupt).
            handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:  # a local cluster: one slot unless told (CPU: engines must not share cores)
                ray.init(resources={SLOT_RESOURCE: float(self.slots or 1)},
                         include_dashboard=False, log_to_driver=False)
            for sig, handler in handlers.items():
                if handler is not None and threading.current_thread() is threading.main_thread():
                    signal.signal(sig, handler)
        total = ray.cluster_resources().get(SLOT_RESOURCE, 0.0)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        per_node = [n["Resources"].get(SLOT_RESOURCE, 0.0) for n in nodes]
        return int(max(per_node, default=total) or 1)

    def run(self, job: Job, sink: Sink, bar: Any) -> None:
        """Submit one task per engine config of the job, hand each run file to the sink as
        it streams back, cancel everything on Ctrl-C / SIGTERM."""
        import ray

        slots = self.init()
        gpu = bool(ray.cluster_resources().get("GPU"))
        params_yaml = yaml.safe_dump(job.params.to_dict(), sort_keys=False)
        key = api_key()
        experiment = job.params.experiment
        work = job.work
        task = ray.remote(run_config)
        stop = _stop_flag()
        gens = []
        for cfg, runs in work:
            opts: dict[str, Any] = ({"num_gpus": gpus_needed(cfg.knobs), "num_cpus": 1} if gpu
                                    else {"num_cpus": 0, "resources": {SLOT_RESOURCE: 1}})
            gens.append((cfg, task.options(num_returns="streaming", max_retries=0,
                                           **opts).remote(params_yaml,
                                                          [r.run_id for r in runs], key,
                                                          slots, gpu, stop)))
        items: queue.Queue = queue.Queue()

        def pump(cfg: Any, gen: Any) -> None:
            try:
                for ref in gen:
                    items.put((cfg, ray.get(ref)))
            except Exception as e:  # noqa: BLE001 - the task died: say so, keep the rest
                items.put((cfg, ("error", type(e).__name__, str(e).encode())))
            finally:
                items.put((cfg, None))

        threads = [threading.Thread(target=pump, args=g, daemon=True) for g in gens]
        for t in threads:
            t.start()
        open_tasks = len(threads)

        def drain(until: float | None) -> None:
            """Take what the tasks send until each has ended (or until `until`)."""
            nonlocal open_tasks
            while open_tasks and (until is None or time.monotonic() < until):
                try:
                    cfg, item = items.get(timeout=0.5)
                except queue.Empty:
                    continue
                if item is None:
                    open_tasks -= 1
                else:
                    self._take(experiment, cfg, item, sink, bar)

        try:  # a local cluster started here stops with the sweep (ray.shutdown below)
            drain(None)
        except BaseException:
            # ask the tasks to stop; each still sends its interrupted row and logs
            with contextlib.suppress(Exception):
                stop.set.remote()
            drain(time.monotonic() + 90)
            for _, gen in gens:  # whatever did not stop in time
                with contextlib.suppress(Exception):
                    ray.cancel(gen)
            raise
        finally:
            if not self.address:
                ray.shutdown()

    @staticmethod
    def _take(experiment: str, cfg: Any, item: tuple[str, str, bytes], sink: Sink,
              bar: Any) -> None:
        kind, name, data = item
        if kind == "requests":  # a run's arrays, just before its JSON
            sink.save_file(name, data)
        elif kind == "run":
            sink.save_file(name, data)
            bar.update(1)
        elif kind == "log":
            sink.save_log(name, data)
        elif kind == "exit" and name not in ("0",):
            print(f"{experiment}: the Ray task of [{cfg.label}] ended with "
                  f"exit code {name}: {data.decode(errors='replace')[-800:]}", file=sys.stderr)
        elif kind == "error":
            print(f"{experiment}: the Ray task of [{cfg.label}] failed: {name}: "
                  f"{data.decode(errors='replace')[-800:]}", file=sys.stderr)
