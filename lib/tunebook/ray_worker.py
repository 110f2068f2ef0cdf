"""`python -m tunebook.ray_worker SCRATCH`: the local sweep one Ray task runs on its node
(tunebook.ray_sweep.run_config starts it in its own process group and streams its run files
back). A module of its own so that data flows one way: sweep -> ray_sweep, ray_worker -> sweep.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import yaml

from tunebook import params as P
from tunebook.sweep import Sweep, Terminated


def _worker(scratch: Path) -> int:
    """Run the runs listed in SCRATCH/runs.json of SCRATCH/params.yaml into SCRATCH/outputs."""
    # the task's share runs here, whatever the params' executor says
    params = dataclasses.replace(P.parse(yaml.safe_load((scratch / "params.yaml").read_text())),
                                 executor="local")
    runs = set(json.loads((scratch / "runs.json").read_text()))
    sweep = Sweep(params, scratch / "outputs", progress=False, only_runs=runs,
                  machine_lock=False, record_inputs=False)
    try:
        sweep.run()
    except Terminated:
        return 143
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker(Path(sys.argv[1])))
