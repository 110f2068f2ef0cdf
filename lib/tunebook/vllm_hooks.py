"""Code that runs inside vLLM's engine-core process (never imported by tunebook itself).

`BlockTableScheduler` is vLLM's own scheduler plus one JSON line per scheduler step: the tokens
each request got, whether they were prompt (prefill) or output (decode) tokens, and the KV-cache
block ids each request was given — its block table, built step by step (Fig 8.3; Fig 8.2's
cross-check of vLLM's iteration log). Start an engine with

    engine: {scheduler_cls: tunebook.vllm_hooks.BlockTableScheduler}

(`AsyncBlockTableScheduler` when async scheduling is on). The engine log's folder gets
`<log>.blocks.jsonl` (tunebook.servers.vllm sets BLOCK_TABLE_ENV to that path).

Interface read: `SchedulerOutput` (vllm.v1.core.sched.output) — `num_scheduled_tokens`,
`scheduled_new_reqs[*].block_ids/num_computed_tokens/prompt_token_ids`,
`scheduled_cached_reqs.req_ids/new_block_ids/num_computed_tokens`, `finished_req_ids`,
`preempted_req_ids` — the object the scheduler hands to the model runner, the same in vLLM
0.26 and 0.32. vLLM calls this interface "not public": `check_interface` names what is missing
and the hook stops recording (the engine serves on) instead of guessing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

BLOCK_TABLE_ENV = "TUNEBOOK_BLOCK_TABLE_LOG"
MAX_STEPS = 200_000  # a long sweep stops recording rather than fill the disk
NEEDED = {
    "SchedulerOutput": ("num_scheduled_tokens", "scheduled_new_reqs", "scheduled_cached_reqs",
                        "finished_req_ids"),
    "NewRequestData": ("req_id", "block_ids", "num_computed_tokens", "prompt_token_ids"),
    "CachedRequestData": ("req_ids", "new_block_ids", "num_computed_tokens"),
}


def check_interface(out: Any) -> list[str]:
    """What this hook reads and the SchedulerOutput lacks (empty: all there)."""
    missing = [f"SchedulerOutput.{a}" for a in NEEDED["SchedulerOutput"] if not hasattr(out, a)]
    if not missing:
        cached = out.scheduled_cached_reqs
        missing += [f"CachedRequestData.{a}" for a in NEEDED["CachedRequestData"]
                    if not hasattr(cached, a)]
        for new in out.scheduled_new_reqs[:1]:
            missing += [f"NewRequestData.{a}" for a in NEEDED["NewRequestData"]
                        if not hasattr(new, a)]
    return missing


def _ids(block_ids: Any) -> list[int]:
    """Block ids of the first KV-cache group (full attention: the only one for Qwen3)."""
    return list(block_ids[0]) if block_ids else []


class _Recorder:
    """The recorder, mixed in before a vLLM scheduler class: it wraps that class's
    `__init__` and `schedule` (cooperative `super()`), so both schedulers share one copy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rec_init()

    def schedule(self, *args: Any, **kwargs: Any):  # -> SchedulerOutput
        out = super().schedule(*args, **kwargs)
        self._record(out)
        return out

    def _rec_init(self) -> None:
        path = os.environ.get(BLOCK_TABLE_ENV)
        self._rec_file = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        self._rec_step = 0
        self._rec_prompt_len: dict[str, int] = {}
        if self._rec_file:
            pool = getattr(getattr(self, "kv_cache_manager", None), "block_pool", None)
            self._write({"kind": "pool", "t": time.time(),
                         "num_blocks": getattr(pool, "num_gpu_blocks", None),
                         "block_size": getattr(self, "block_size", None),
                         "token_budget": getattr(self, "max_num_scheduled_tokens", None),
                         "max_num_seqs": getattr(self, "max_num_running_reqs", None)})

    def _write(self, obj: dict[str, Any]) -> None:
        self._rec_file.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def _record(self, out: Any) -> None:
        if self._rec_file is None:
            return
        if not out.total_num_scheduled_tokens:
            # an empty step still reports the requests that finished since the last one
            if getattr(out, "finished_req_ids", None):
                self._write({"kind": "finished", "t": time.time(),
                             "ids": sorted(out.finished_req_ids)})
            return
        if self._rec_step == 0 and (missing := check_interface(out)):
            self._write({"kind": "error", "missing": missing})
            self._rec_file.close()
            self._rec_file = None
            return
        self._rec_step += 1
        if self._rec_step > MAX_STEPS:
            return
        computed: dict[str, int] = {}
        blocks: dict[str, list[int]] = {}
        for new in out.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
            blocks[new.req_id] = _ids(new.block_ids)
            if new.prompt_token_ids is not None:
                self._rec_prompt_len[new.req_id] = len(new.prompt_token_ids)
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            computed[rid] = cached.num_computed_tokens[i]
            added = cached.new_block_ids[i]
            if added:
                blocks[rid] = _ids(added)
        reqs = []
        for rid, n in out.num_scheduled_tokens.items():
            prompt = self._rec_prompt_len.get(rid)
            done = computed.get(rid, 0)
            # prompt tokens still to compute when the step starts: those go first
            prefill = max(0, min(n, (prompt or 0) - done))
            reqs.append({"id": rid, "tokens": n, "prefill": prefill, "computed": done,
                         "prompt": prompt, "new_blocks": blocks.get(rid, [])})
        # a request resumed after preemption gets its whole block table again
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        for rid in out.finished_req_ids:
            self._rec_prompt_len.pop(rid, None)
        pool = self.kv_cache_manager.block_pool
        self._write({"kind": "step", "step": self._rec_step, "t": time.time(),
                     "total": out.total_num_scheduled_tokens, "reqs": reqs,
                     "finished": sorted(out.finished_req_ids),
                     "preempted": sorted(getattr(out, "preempted_req_ids", None) or ()),
                     "resumed": sorted(resumed & set(out.num_scheduled_tokens)),
                     "free_blocks": pool.get_num_free_blocks()})


class BlockTableScheduler(_Recorder, Scheduler):
    """vLLM's Scheduler, recording each step (async scheduling off)."""


class AsyncBlockTableScheduler(_Recorder, AsyncScheduler):
    """vLLM's AsyncScheduler, recording each step (async scheduling on)."""
