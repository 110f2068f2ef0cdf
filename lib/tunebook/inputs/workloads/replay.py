"""What of a workload file is sent, and how: a window or the first N requests, lengths scaled and
capped for a small model, written as the file vLLM's benchmark client reads (`prepare`).

Timed files (a trace) are written as `timed_trace` records whatever they came as, with times
rebased to the window's start. The replay speed is not in the file: vLLM's
`--timed-trace-sec-multiplier` is 1 / speed, so one file serves every speed of a sweep.

Lengths: `length_scale` multiplies input and output lengths and the hash-id block size alike, so
requests that shared k blocks still share k (smaller) blocks; `max_input_len` then cuts a prompt
to its first blocks (a shared prefix stays shared) and `max_output_len` caps the answer.

The prepared file is named by its content (`sha`): the run id of a replay changes when, and only
when, what it sends changes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebook.core import config
from tunebook.inputs.workloads import formats as F

# vLLM's default tokens per hash id (--timed-trace-chunk-hash-size); Mooncake's is 512
DEFAULT_BLOCK_TOKENS = {"timed_trace": 512, "csv": 16}
CUSTOM_OUTPUT_TOKENS = 256  # vLLM's --custom-output-len default


@dataclass(frozen=True)
class Replay:
    """The `load:` keys of a workload file (tunebook.inputs.params checks them)."""

    file: Path
    format: str = "auto"
    window_s: tuple[float, float] | None = None  # [start, end) on the trace's own clock
    first: int | None = None  # the first N requests (of the window, if one is given)
    length_scale: float = 1.0
    max_input_len: int | None = None
    max_output_len: int | None = None
    block_tokens: int | None = None  # tokens per hash id before scaling (None: the format's)
    time_unit_s: float | None = None  # a timed_trace timestamp in seconds (None: ms, Mooncake)


@dataclass(frozen=True)
class Prepared:
    """A workload as sent: vLLM's dataset, the records of its file, what was changed."""

    source: str  # the file's name (no folder: rows travel)
    format: str
    vllm_dataset: str
    records: tuple[dict[str, Any], ...]
    block_tokens: int | None  # after scaling (timed_trace's --timed-trace-chunk-hash-size)
    duration_s: float | None  # the window's length on the trace's clock (timed files)
    conversion: str | None  # said in the row when the file was not sent as it came
    capped_inputs: int = 0
    capped_outputs: int = 0
    lines: tuple[int, ...] = ()  # each record's line in the source file

    @property
    def text(self) -> str:
        return F.to_text(list(self.records))

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]

    @property
    def suffix(self) -> str:
        return ".json" if self.vllm_dataset == "sharegpt" else ".jsonl"  # what vLLM accepts

    @property
    def file_name(self) -> str:
        return f"{self.sha}{self.suffix}"

    @property
    def requests(self) -> int:
        return len(self.records)

    def shared_prefix_share(self) -> float | None:
        """The share of prompt tokens in leading blocks an earlier request of the window had
        already sent: what an unbounded prefix cache would serve (trace ids are chained: a
        block id stands for its whole prefix). None for prompts given as text."""
        if self.vllm_dataset != "timed_trace" or not self.block_tokens:
            return None
        block = self.block_tokens
        hit = sum(min(rec["input_length"], lead * block)
                  for rec, lead in zip(self.records, shared_blocks(self.records), strict=True))
        total = sum(rec["input_length"] for rec in self.records)
        return hit / total if total else None

    def write(self, folder: Path) -> Path:
        """The file vLLM reads, written once (named by content; atomic)."""
        path = folder / self.file_name
        if path.is_file():
            return path
        folder.mkdir(parents=True, exist_ok=True)
        text = (_json_list(self.records) if self.vllm_dataset == "sharegpt" else self.text)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return path


def _json_list(records: tuple[dict[str, Any], ...]) -> str:
    return json.dumps(list(records), sort_keys=True)


def shared_blocks(records: Iterable[Mapping[str, Any]]) -> list[int]:
    """Per request, its leading hash-id blocks that an earlier request already sent (0 for a
    record without ids): what a prefix cache could serve it, in blocks."""
    seen: set[int] = set()
    out = []
    for rec in records:
        ids = rec.get("hash_ids") or []
        lead = 0
        while lead < len(ids) and ids[lead] in seen:
            lead += 1
        seen.update(ids)
        out.append(lead)
    return out


def source_path(r: Replay) -> Path:
    """The file as written in params: absolute, ~, or relative to the project folder (rows
    and recorded params keep it as written: no machine path travels)."""
    p = r.file.expanduser()
    return p if p.is_absolute() else config.home() / p


def prepare(r: Replay) -> Prepared:
    """Read, check and cut the file; raises formats.WorkloadError naming file and line."""
    fmt, reqs = F.read(source_path(r), r.format, r.time_unit_s)
    if fmt.timed:
        return _timed(r, fmt, reqs)
    return _text(r, fmt, reqs)


def _window(r: Replay, reqs: list[F.Request]) -> tuple[list[F.Request], float | None]:
    start = 0.0
    end: float | None = None
    if r.window_s is not None:
        start, end = r.window_s
        reqs = [q for q in reqs if q.arrival_s is not None and start <= q.arrival_s < end]
    if r.first is not None:
        reqs = reqs[:r.first]
    if not reqs:
        what = (f"window_s [{start:g}, {end:g})" if r.window_s is not None else "the selection")
        raise F.WorkloadError(r.file, [(None, f"no request in {what}")])
    if end is None:  # the span the requests cover
        last = reqs[-1].arrival_s
        end = last if last is not None else None
    return reqs, (None if end is None else end - start)


def _timed(r: Replay, fmt: F.Format, reqs: list[F.Request]) -> Prepared:
    reqs, duration = _window(r, reqs)
    t0 = r.window_s[0] if r.window_s is not None else 0.0
    block = r.block_tokens or DEFAULT_BLOCK_TOKENS[fmt.name]
    # a trace's own blocks shrink with its lengths (what was shared stays shared); the fresh
    # blocks of a trace without ids only need to be unique
    shared = any(q.hash_ids for q in reqs)
    scaled_block = max(1, round(block * r.length_scale)) if shared else block
    fresh = max((h for q in reqs for h in q.hash_ids), default=-1) + 1
    records = []
    capped_in = capped_out = 0
    for q in reqs:
        assert q.input_len is not None and q.output_len is not None and q.arrival_s is not None
        n_in = max(1, round(q.input_len * r.length_scale))
        n_out = max(1, round(q.output_len * r.length_scale))
        if r.max_input_len is not None and n_in > r.max_input_len:
            n_in, capped_in = r.max_input_len, capped_in + 1
        if r.max_output_len is not None and n_out > r.max_output_len:
            n_out, capped_out = r.max_output_len, capped_out + 1
        need = math.ceil(n_in / scaled_block)
        ids = list(q.hash_ids[:need])
        # a trace without prefix ids (CSV), or one whose ids cover fewer tokens after
        # rounding: fresh ids, shared with no other request
        while len(ids) < need:
            ids.append(fresh)
            fresh += 1
        records.append({"timestamp": round(q.arrival_s - t0, 6), "input_length": n_in,
                        "output_length": n_out, "hash_ids": ids})
    conversion = None
    if fmt.name == "csv":
        conversion = ("CSV trace written as vLLM timed_trace records (its burstgpt dataset "
                      "ignores timestamps); prompts of fresh token blocks (the trace records "
                      "no shared prefix)")
    return Prepared(r.file.name, fmt.name, "timed_trace", tuple(records), scaled_block, duration,
                    conversion, capped_in, capped_out, tuple(q.line for q in reqs))


def _text(r: Replay, fmt: F.Format, reqs: list[F.Request]) -> Prepared:
    if r.window_s is not None:
        raise F.WorkloadError(r.file, [(None, f"a {fmt.name} file has no arrival times: "
                                              "select requests with `first`, not `window_s`")])
    reqs, _ = _window(r, reqs)
    capped_out = 0
    records: list[dict[str, Any]] = []
    for q in reqs:
        if fmt.name == "sharegpt":
            records.append({"conversations": [{"from": "human", "value": q.prompt},
                                              {"from": "gpt", "value": q.completion}]})
            continue
        rec: dict[str, Any] = {"prompt": q.prompt}
        out = q.output_len
        if out is not None and r.length_scale != 1.0:
            out = max(1, round(out * r.length_scale))
        if out is not None and r.max_output_len is not None and out > r.max_output_len:
            out, capped_out = r.max_output_len, capped_out + 1
        if out is None:  # vLLM's own default for a prompt without one
            out = min(CUSTOM_OUTPUT_TOKENS, r.max_output_len or CUSTOM_OUTPUT_TOKENS)
        rec["output_tokens"] = out
        records.append(rec)
    return Prepared(r.file.name, fmt.name, fmt.vllm_dataset, tuple(records), None, None, None,
                    0, capped_out, tuple(q.line for q in reqs))


def too_long(p: Prepared, max_tokens: int) -> list[tuple[int, int]]:
    """(source line, input + output tokens) of each timed request longer than `max_tokens`."""
    if p.vllm_dataset != "timed_trace":
        return []
    return [(line, n) for line, rec in zip(p.lines, p.records, strict=True)
            if (n := rec["input_length"] + rec["output_length"]) > max_tokens]
