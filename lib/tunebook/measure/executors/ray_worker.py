"""`python -m tunebook.measure.executors.ray_worker SCRATCH`: the local sweep one Ray task runs
on its node (ray_cluster.run_config starts it in its own process group and streams its run files
back: each run's Parquet file of per-request arrays, which its store writes first, then the JSON
that names it). A module of its own so that data flows one way: sweep -> ray_cluster,
ray_worker -> sweep.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

from tunebook.inputs import params as P
from tunebook.inputs.executor import EXECUTOR
from tunebook.measure.locks import Terminated
from tunebook.measure.sweep import Sweep, SweepOptions


def _watch_parent(poll_s: float = 1.0) -> None:
    """SIGTERM to this process when the Ray worker that started it is gone (a driver killed
    hard takes its local cluster down with SIGKILL, and this process, in its own session, would
    live on with its engine): the sweep then marks its run interrupted and stops the engine."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker(scratch: Path) -> int:
    """Run the runs listed in SCRATCH/runs.json of SCRATCH/params.yaml into SCRATCH/outputs."""
    # the task's share runs here, whatever the params' executor says
    params = P.parse(yaml.safe_load((scratch / "params.yaml").read_text()))
    params = dataclasses.replace(params, sections={
        k: v for k, v in params.sections.items() if k != EXECUTOR.key})
    runs = set(json.loads((scratch / "runs.json").read_text()))
    _watch_parent()
    sweep = Sweep(params, scratch / "outputs", SweepOptions(
        progress=False, only_runs=runs, machine_lock=False, record_inputs=False))
    try:
        sweep.run()
    except Terminated:
        return 143
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(Path(sys.argv[1])))
