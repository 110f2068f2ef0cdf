"""How often a short run stalls: the scheduled-diff test's load (qwen3-tiny, the suite's shared
engine config, 8 users x 64 tokens in / 24 out, one prompt each, one warm-up) repeated on one
engine, with tunebook's /metrics sampler on and off in turn, on a box left alone.

    .venv/bin/python benchmarks/run_stalls.py --repeats 30 --rounds 2

A stalled run: its median TTFT past --stalled-ms (a run takes ~0.2 s; stalled ones ~1 s, most
requests' every token arriving at once). Per round and mode it prints the stalled runs and
each run's median TTFT; one engine start per sweep (forked, so ~10 s each after the first)."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from tunebook.inputs import params as P
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.servers import metrics

LOAD = {"users": [8], "input_len": 64, "output_len": 24, "prompts_per_user": 1,
        "num_warmups": 1}
ENGINE = {"model": "qwen3-tiny", "engine": {"max_model_len": 1024},
          "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1}}  # tests/conftest.py's SHARED_ENGINE


def _sweep(root: Path, repeats: int, sampler: bool) -> list[float]:
    enter, exit_ = metrics.Sampler.__enter__, metrics.Sampler.__exit__
    if not sampler:  # the row's gauge maxima go unsampled; nothing else changes
        metrics.Sampler.__enter__ = lambda self: self  # type: ignore[method-assign]
        metrics.Sampler.__exit__ = lambda self, *a: None  # type: ignore[method-assign]
    try:
        params = P.parse({"experiment": "stalls", **ENGINE, "load": LOAD, "repeats": repeats})
        Sweep(params, root, SweepOptions(progress=False)).run()
    finally:
        metrics.Sampler.__enter__, metrics.Sampler.__exit__ = enter, exit_
    df = pd.read_parquet(root / "stalls" / "results.parquet").sort_values("started_at")
    return [float(x) for x in df.median_ttft_ms]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stalled-ms", type=float, default=500.0)
    a = ap.parse_args()
    for r in range(a.rounds):
        for sampler in (False, True):
            root = Path(tempfile.mkdtemp(prefix="run-stalls-"))
            try:
                ttfts = _sweep(root, a.repeats, sampler)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            stalled = sum(t > a.stalled_ms for t in ttfts)
            print(f"round {r + 1}, sampler {'on' if sampler else 'off'}: {stalled} of "
                  f"{len(ttfts)} runs stalled; median TTFT ms {[round(t) for t in ttfts]}",
                  flush=True)


if __name__ == "__main__":
    main()
