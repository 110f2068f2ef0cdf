"""How much does a box's state move between measurements, against its runs' spread?

Runs MEASUREMENTS sweeps of REPEATS runs each of one config (qwen3-tiny, one sequence at a
time, eager: tests/present/test_diff_engines.py's slow config) on ONE kept engine, nothing
changed between them, and prints each measurement's runs of output_tok_s, the spread of the
runs inside a measurement against that of the measurements' means, the lowest mean ÷ the
highest, and how often each of tunebook.present.history's two rules marks a false step
between neighbours (every neighbour pair is a no-change pair here): the repeats pooled
(tunebook diff's rule, used where something recorded changed) and the measurements (used
where nothing did). tunebook.present.history's docstring cites this:

    .venv/bin/python benchmarks/box_noise.py [--measurements 7] [--repeats 5]

One run, on a box left alone: the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from pathlib import Path

from tunebook.inputs import params as P
from tunebook.measure.supply import EngineKeeper
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.results import stats

SPEC = {"model": "qwen3-tiny", "engine": {"max_model_len": 1024, "max_num_seqs": 1,
                                          "enforce_eager": True},
        "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1},
        "load": {"users": [8], "input_len": 64, "output_len": 24, "prompts_per_user": 1,
                 "num_warmups": 1}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measurements", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="box-noise-"))
    kept = EngineKeeper()
    groups: list[list[float]] = []
    try:
        for i in range(a.measurements):
            params = P.parse({**SPEC, "experiment": f"m{i}", "repeats": a.repeats},
                             source="box_noise")
            Sweep(params, out, SweepOptions(progress=False, keeper=kept)).run()
            rows = [json.loads(f.read_text())["row"]
                    for f in sorted((out / f"m{i}" / "runs").glob("*.json"))]
            rows.sort(key=lambda r: str(r.get("started_at")))
            groups.append([float(r["output_tok_s"]) for r in rows if r.get("output_tok_s")])
            print(f"measurement {i}: " + ", ".join(f"{v:.0f}" for v in groups[-1]))
    finally:
        kept.stop()
    means = [statistics.fmean(g) for g in groups]
    within = statistics.fmean(statistics.stdev(g) / statistics.fmean(g) for g in groups)
    between = statistics.stdev(means) / statistics.fmean(means)
    print(f"runs inside a measurement: mean CV {within:.1%}; the measurements' means: CV "
          f"{between:.1%} (what runs alone predict: {within / math.sqrt(a.repeats):.1%}); "
          f"lowest mean / highest {min(means) / max(means):.2f}x")
    pairs = list(zip(groups, groups[1:], strict=False))
    by_runs = sum(not stats.ratio(stats.Interval.of(b), stats.Interval.of(x), method="delta",
                                  dof="hsu").contains(1.0) for x, b in pairs)
    by_measurements = sum(not stats.pooled_ratio(
        [statistics.fmean(b)], [statistics.fmean(g) for g in groups[:k + 1]]).contains(1.0)
        for k, (_, b) in enumerate(pairs))
    print(f"neighbour pairs (no change between any): {len(pairs)}; a step at 95 % by the "
          f"repeats pooled: {by_runs}; by the measurements (each new one against all "
          f"before it): {by_measurements}")


if __name__ == "__main__":
    main()
