"""How often a short run stalls: the scheduled-diff test's load (qwen3-tiny, the suite's shared
engine config, 8 users x 64 tokens in / 24 out, one prompt each, one warm-up) repeated on one
engine, on a box left alone, for each of:

- the engine's session: `owner` (tunebook's way: the engine is a process group in the session
  of the process that runs vLLM's client) or `own` (a session of its own, as tunebook started
  engines before; Linux schedules each session as one group);
- tunebook's /metrics sampler `on` or `off`.

    .venv/bin/python benchmarks/run_stalls.py --repeats 40 --rounds 2

Both sessions are plain starts (`own` is the same Popen with start_new_session), one engine
start per sweep. A stalled run: its median TTFT past --stalled-ms (a run takes ~0.2 s; stalled
ones ~1 s, most requests' every token arriving at once). It prints each sweep's stalled runs
and median TTFTs, then the totals."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from tunebook.inputs import params as P
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.servers import metrics, process
from tunebook.servers.launcher import FAST_START_ENV

LOAD = {"users": [8], "input_len": 64, "output_len": 24, "prompts_per_user": 1,
        "num_warmups": 1}
ENGINE = {"model": "qwen3-tiny", "engine": {"max_model_len": 1024},
          "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1}}  # tests/conftest.py's SHARED_ENGINE
MODES = ("owner-off", "owner-on", "own-off", "own-on")


def _own_session(popen: Any) -> Any:
    """subprocess.Popen as tunebook called it for an engine before: a session of its own."""
    def start(*a: Any, **kw: Any) -> Any:
        if kw.get("process_group") == 0:  # only what tunebook now puts in the owner's session
            del kw["process_group"]
            kw["start_new_session"] = True
        return popen(*a, **kw)
    return start


def _sweep(root: Path, repeats: int, mode: str) -> list[float]:
    session, sampler = mode.split("-")
    enter, exit_, popen = metrics.Sampler.__enter__, metrics.Sampler.__exit__, subprocess.Popen
    if sampler == "off":  # the row's gauge maxima go unsampled; nothing else changes
        metrics.Sampler.__enter__ = lambda self: self  # type: ignore[method-assign]
        metrics.Sampler.__exit__ = lambda self, *a: None  # type: ignore[method-assign]
    if session == "own":
        process.subprocess.Popen = _own_session(popen)  # type: ignore[misc]
    try:
        params = P.parse({"experiment": "stalls", **ENGINE, "load": LOAD, "repeats": repeats})
        Sweep(params, root, SweepOptions(progress=False)).run()
    finally:
        metrics.Sampler.__enter__, metrics.Sampler.__exit__ = enter, exit_
        process.subprocess.Popen = popen  # type: ignore[misc]
    df = pd.read_parquet(root / "stalls" / "results.parquet").sort_values("started_at")
    return [float(x) for x in df.median_ttft_ms]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES), help="of " + ", ".join(MODES))
    ap.add_argument("--stalled-ms", type=float, default=500.0)
    a = ap.parse_args()
    os.environ[FAST_START_ENV] = "0"  # plain starts: the same Popen for both sessions
    totals = dict.fromkeys(a.modes.split(","), 0)
    for r in range(a.rounds):
        for mode in totals:
            root = Path(tempfile.mkdtemp(prefix="run-stalls-"))
            try:
                ttfts = _sweep(root, a.repeats, mode)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            stalled = sum(t > a.stalled_ms for t in ttfts)
            totals[mode] += stalled
            print(f"round {r + 1}, {mode}: {stalled} of {len(ttfts)} runs stalled; "
                  f"median TTFT ms {[round(t) for t in ttfts]}", flush=True)
    print("stalled runs: " + ", ".join(f"{m} {n} of {a.rounds * a.repeats}"
                                       for m, n in totals.items()))


if __name__ == "__main__":
    main()
