"""The tuning job's wall clock, cold to answer (issue 51, part 2): `tunebook tune PARAMS` into a
fresh outputs folder with tunebook's compile cache emptied and vLLM's cache root fresh, timed
from the command's start to its exit, and where that time went — engine starts (each phase:
imports, weights, compile, CUDA graphs, …, from the rows' start_*_s), load points (every
stored run's own clock: warm-ups and benchmark) and the rest (tunebook's own: planning,
engine stops, the report). Not a test: one run.

    .venv/bin/python benchmarks/tune_wallclock.py params/slo.yaml --out /tmp/tune-wallclock \
        [--drop-caches] [-- -p search.budget.minutes 5]
    # on the lent H200, through scripts/h200_run.sh:
    bash scripts/h200_run.sh \
        '@545:bench tune_wallclock.py params/slo-h200-space3.yaml --drop-caches'

`--drop-caches` (root only) also empties the kernel's page cache first, so the model's files
are read from disk as on a machine that just booted. Writes OUT/wallclock.md and .json.

`--resume` continues a job that an earlier call of this script left unfinished in the same OUT
(the lent GPU's calls end at 10 minutes; `tunebook tune` resumes its stored search): each call
is a leg, timed apart and added up. A leg on a fresh machine starts as cold as the first (no
compile cache, no page cache), where one unbroken job would have reused what its earlier starts
compiled, so the sum is an upper bound of the one-go job's wall clock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from tunebook.core import hardware
from tunebook.inputs import params as P
from tunebook.measure.supply import run_seconds
from tunebook.results.store import Store
from tunebook.servers import compile_cache
from tunebook.servers.start_phases import PHASES, phases_frame


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("params", type=Path)
    ap.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="tune-wallclock-")))
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="continue the unfinished job in OUT: one more leg")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.tune_args = argv[cut + 1:]  # after --: more `tunebook tune` arguments
    params = P.load(args.params)  # bad params fail here, before anything is emptied
    outputs = args.out / "outputs"
    legs: list[dict] = []
    if args.resume:
        try:
            earlier = json.loads((args.out / "wallclock.json").read_text())
        except (OSError, ValueError) as e:
            print(f"--resume: no earlier leg in {args.out} ({e})", file=sys.stderr)
            return 2
        legs = earlier.get("legs") or [{k: earlier[k] for k in
                                        ("wall_s", "exit_code", "drop_caches")}]
        if legs[-1]["exit_code"] == 0:
            print(f"--resume: the job in {args.out} has ended (exit 0)", file=sys.stderr)
            return 2
    elif outputs.exists() and any(outputs.iterdir()):
        print(f"{outputs} is not empty: a cold run needs a fresh folder (or --resume)",
              file=sys.stderr)
        return 2
    outputs.mkdir(parents=True, exist_ok=True)
    if compile_cache.enabled():
        compile_cache.clear()
    env = {**os.environ, "VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix="vllm-cache-")}
    if args.drop_caches:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    cmd = [sys.executable, "-m", "tunebook.cli", "tune", str(args.params), "--outputs",
           str(outputs), "-q", *args.tune_args]
    t0 = time.monotonic()
    rc = subprocess.run(cmd, env=env, check=False).returncode
    legs.append({"wall_s": round(time.monotonic() - t0, 1), "exit_code": rc,
                 "drop_caches": args.drop_caches})
    wall_s = sum(leg["wall_s"] for leg in legs)
    exps = [d.parent for d in outputs.rglob("runs")
            if d.is_dir() and d.parent.name.startswith(params.experiment)]
    rows = [r for e in exps for r in Store(e).rows()]
    # one row per engine start (by its log), with its phases
    starts = pd.concat([phases_frame(list(Store(e).records(requests=False)), e) for e in exps]
                       or [pd.DataFrame()], ignore_index=True)
    start_s = float(starts["startup_s"].sum()) if len(starts) else 0.0
    points_s = sum(run_seconds(r) for r in rows)
    phases = {p: round(float(starts[f"start_{p}_s"].sum()), 1) if f"start_{p}_s" in starts
              else 0.0 for p in PHASES}
    m = hardware.machine()
    # the command as run from the checkout, without this machine's paths
    shown = [os.path.relpath(c) if c.startswith("/") else c for c in cmd[1:]]
    out = {"command": " ".join(shown), "exit_code": rc, "wall_s": round(wall_s, 1),
           "legs": legs,
           "engine_starts": len(starts), "starts_s": round(start_s, 1),
           "start_phases_s": phases, "points": len(rows), "points_s": round(points_s, 1),
           "other_s": round(wall_s - start_s - points_s, 1), "drop_caches": args.drop_caches,
           "machine": m.get("hardware"), "vllm": m.get("vllm_package")}
    legs_s = " + ".join(f"{g['wall_s']:.0f}" for g in legs)
    share = {k: out[k] / wall_s if wall_s else 0.0 for k in ("starts_s", "points_s", "other_s")}
    text = (f"# The tuning job, cold to answer\n\n`{out['command']}` on {out['machine']}, "
            f"{out['vllm']} (page cache {'dropped' if args.drop_caches else 'kept'}): exit "
            f"{rc} after **{wall_s / 60:.1f} min**"
            + (f" in {len(legs)} calls ({legs_s} s; "
               "each began cold on a fresh machine: an upper bound of one unbroken run)"
               if len(legs) > 1 else "") + ".\n\n| where | seconds | share |\n|---|---|---|\n"
            f"| {len(starts)} engine starts | {start_s:.0f} | {share['starts_s']:.0%} |\n"
            + "".join(f"| … {p} | {v:.0f} | {v / wall_s:.0%} |\n" for p, v in phases.items()
                      if v and wall_s)
            + f"| {len(rows)} load points (runs) | {points_s:.0f} | {share['points_s']:.0%} |\n"
            f"| the rest (tunebook: plans, stops, report) | {out['other_s']:.0f} | "
            f"{share['other_s']:.0%} |\n")
    (args.out / "wallclock.md").write_text(text)
    (args.out / "wallclock.json").write_text(json.dumps(out, indent=1))
    print(text)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
