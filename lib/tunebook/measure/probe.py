"""Fig 3.3's probe: how much of a prompt the prefix cache serves when it shares only its first
k tokens with one seen before.

One load point (`dataset: block_reuse`) sends two requests, one after the other, to
`/v1/completions` with the prompt as a list of token ids (so token boundaries are exact, no
tokenizer round trip):

1. a base prompt of `input_len` random token ids;
2. a prompt with the base's first `prefix_len` tokens, then a fresh random tail whose first token
   differs from the base's token at that position (so exactly k tokens are shared).

It reads `usage.prompt_tokens_details.cached_tokens` of each (the server needs
`--enable-prompt-tokens-details`; the sweep adds it when this dataset is planned). The sweep
resets the prefix cache before each point, so the base finds nothing cached (checked: otherwise
the point fails) and the second finds what the base left: vLLM caches whole blocks only, so the
rule Fig 3.3 checks is cached_tokens == (k // block_size) * block_size.

A measurement of two tiny requests, not a load generator: loopback, the engine's API key,
bounded timeouts.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any

from tunebook.inputs.load import LoadPoint
from tunebook.servers.base import SERVED_NAME, Server

# Token ids are drawn from [LOW_ID, min(vocab, HIGH_ID)): ordinary tokens of any real vocabulary,
# clear of the special tokens that most tokenizers put at either end.
LOW_ID, HIGH_ID = 100, 10_000


class ProbeError(RuntimeError):
    pass


@dataclass(frozen=True)
class Prompts:
    base: list[int]
    second: list[int]


def prompts(input_len: int, shared: int, seed: int, vocab_size: int | None = None) -> Prompts:
    """The base prompt and one sharing exactly its first `shared` tokens (same length)."""
    if not 0 <= shared < input_len:
        raise ValueError(f"shared tokens must be in [0, {input_len}), got {shared}")
    high = min(vocab_size or HIGH_ID, HIGH_ID)
    if high - LOW_ID < 2:
        raise ValueError(f"vocabulary of {vocab_size} tokens is too small for the probe")
    rng = random.Random(seed)
    base = [rng.randrange(LOW_ID, high) for _ in range(input_len)]
    tail = [rng.randrange(LOW_ID, high) for _ in range(input_len - shared)]
    while tail[0] == base[shared]:  # the first token after the shared part must differ
        tail[0] = rng.randrange(LOW_ID, high)
    return Prompts(base, base[:shared] + tail)


def _complete(engine: Server, ids: list[int], output_len: int, timeout_s: float) -> dict:
    body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": output_len, "temperature": 0,
            "ignore_eos": True}
    status, raw = engine.request("POST", "/v1/completions", body, timeout_s=timeout_s)
    if status != 200:
        raise ProbeError(f"/v1/completions: HTTP {status}: "
                         f"{raw.decode(errors='replace')[:300]}")
    return json.loads(raw)


def cached_tokens(response: dict) -> int:
    """usage.prompt_tokens_details.cached_tokens of a completion response."""
    details = (response.get("usage") or {}).get("prompt_tokens_details")
    if not details or details.get("cached_tokens") is None:
        raise ProbeError("the engine reported no usage.prompt_tokens_details.cached_tokens: "
                         "it must be started with --enable-prompt-tokens-details")
    return int(details["cached_tokens"])


@dataclass(frozen=True)
class Result:
    row: dict[str, Any]  # the row's columns
    record: dict[str, Any]  # what goes into the run's JSON
    error: str | None  # why the point does not count (the numbers are kept all the same)


def run(engine: Server, point: LoadPoint, seed: int, timeout_s: float,
        vocab_size: int | None = None) -> Result:
    """Send the two prompts. A request that fails raises (ProbeError, EngineRequestError)."""
    p = prompts(point.input_len, point.prefix_len, seed, vocab_size)
    t0 = time.monotonic()
    responses, latencies = [], []
    for ids in (p.base, p.second):
        t = time.monotonic()
        responses.append(_complete(engine, ids, point.output_len, timeout_s))
        latencies.append(time.monotonic() - t)
    base_cached, second_cached = (cached_tokens(r) for r in responses)
    usage = [r.get("usage") or {} for r in responses]
    row = {
        "completed": len(responses), "failed_requests": 0,
        "duration_s": time.monotonic() - t0,
        "total_input_tokens": sum(int(u.get("prompt_tokens") or 0) for u in usage),
        "total_output_tokens": sum(int(u.get("completion_tokens") or 0) for u in usage),
        "cached_tokens": second_cached,
    }
    record = {"probe": {"shared_tokens": point.prefix_len, "prompt_tokens": point.input_len,
                        "base_cached_tokens": base_cached, "cached_tokens": second_cached,
                        "latencies_s": latencies, "usage": usage}}
    error = None
    if base_cached:
        error = (f"the base prompt found {base_cached} tokens cached after the reset: the "
                 "prefix cache was not cold, so cached_tokens may not come from the base alone")
    return Result(row, record, error)
