"""Forked engine starts of two models side by side: what a model costs a start.

Each round starts an eager engine of each model in turn (the default fast start: forked from
tunebook's launcher, whose own import the first start of the run pays), then asks it for 24
greedy tokens, then stops it. Printed per start: startup_s, the machine's CPU seconds during
the start (/proc/stat: run it on a box left alone) and the 24 tokens' seconds. One run; the
ratio of the rounds after the first is what to compare.

    .venv/bin/python benchmarks/model_starts.py [--models qwen3-tiny smollm2-135m-layers6] \
        [--rounds 3]

Why the tests whose subject is not the model run conftest.SMALL_TOKENIZER_MODEL:
docs/suite-time.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from busy_time import not_idle_seconds  # beside this script

from tunebook.models.presets import resolve_model
from tunebook.servers.base import SERVED_NAME
from tunebook.servers.vllm import Engine

KNOBS = {"max_model_len": 512, "enforce_eager": True}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen3-tiny", "smollm2-135m-layers6"])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="model-starts-"))
    os.environ.setdefault("TUNEBOOK_STATE_DIR", str(tmp / "state"))
    print("| round | model | startup_s | CPU s during the start | 24 tokens, s |")
    print("|---|---|---|---|---|")
    for r in range(args.rounds):
        for model in args.models:
            e = Engine(resolve_model(model), KNOBS, ENV, tmp / f"{model}-{r}.log",
                       startup_timeout_s=600)
            b0 = not_idle_seconds()
            e.start()
            cpu_s = not_idle_seconds() - b0
            try:
                t0 = time.monotonic()
                status, _ = e.request("POST", "/v1/completions", {
                    "model": SERVED_NAME, "prompt": "Hello there, how", "max_tokens": 24,
                    "temperature": 0}, timeout_s=60)
                tokens_s = time.monotonic() - t0
            finally:
                e.stop()
            if status != 200:
                raise SystemExit(f"{model}: HTTP {status} (log: {e.log_path})")
            print(f"| {r} | {model} | {e.startup_s:.1f} | {cpu_s:.1f} | {tokens_s:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
