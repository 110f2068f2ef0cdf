"""Workload files as users bring them, read and checked line by line before any engine starts.

One class per format, registered in FORMATS; `read(path, fmt="auto")` finds the format and gives
the requests. Each format says which dataset of vLLM's benchmark client sends it:

- `sharegpt`: a JSON list of {"conversations": [{"value": prompt}, {"value": answer}, …]};
  vLLM's `sharegpt` dataset.
- `custom`: JSONL of {"prompt": text, "output_tokens": n (optional)}; vLLM's `custom`.
- `timed_trace`: JSONL of {"timestamp", "input_length", "output_length", "hash_ids"}
  (Mooncake's trace); vLLM's `timed_trace`.
- `csv`: a timestamp, an input-token and an output-token column (the Azure LLM inference
  trace, BurstGPT); converted to vLLM's `timed_trace`.

The CSV traces fit no dataset of vLLM's client as they are: its `burstgpt` dataset reads
BurstGPT's columns by position, keeps only rows whose Model is GPT-4 and ignores the timestamps,
which a replay is about. tunebook converts them to `timed_trace` records, one fresh block of
hash ids per request (these traces share no prefix that they record), and says so in the row.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

MAX_PROBLEMS = 5  # malformed lines named in one error; the rest are counted


@dataclass(frozen=True)
class Request:
    """One request as the file states it. `line`: its line in the file (the entry's number in a
    JSON list). Lengths in tokens; None where the file gives text instead."""

    line: int
    arrival_s: float | None  # seconds after the file's first request; None: no arrival time
    input_len: int | None
    output_len: int | None
    hash_ids: tuple[int, ...] = ()  # prefix blocks: equal ids = equal tokens (timed_trace)
    prompt: str | None = None
    completion: str | None = None  # the answer a ShareGPT conversation gave


class WorkloadError(ValueError):
    """A workload file that cannot be replayed: names the file and the lines."""

    def __init__(self, path: Path | str, problems: list[tuple[int | None, str]]):
        self.path = Path(path)
        self.problems = problems
        shown = [f"line {n}: {m}" if n else m for n, m in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            shown.append(f"... and {len(problems) - MAX_PROBLEMS} more")
        super().__init__(f"{self.path.name}: " + "; ".join(shown))


class Format:
    """A workload file format: how to tell it from a look at the file, and how to read it."""

    name: ClassVar[str]
    vllm_dataset: ClassVar[str]  # the dataset of vLLM's benchmark client that sends it
    timed: ClassVar[bool] = False  # its requests carry arrival times (a replay)
    describe: ClassVar[str]

    def sniff(self, path: Path, head: str) -> bool:
        raise NotImplementedError

    def read(self, path: Path) -> list[Request]:
        raise NotImplementedError


FORMATS: dict[str, Format] = {}


def register(cls: type[Format]) -> type[Format]:
    FORMATS[cls.name] = cls()
    return cls


def _count(value: Any, what: str, lo: int = 1) -> int:
    """A token count: an integer >= lo (a whole float such as 12.0 passes; True does not)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{what} must be a whole number of tokens, got {value!r}")
    try:
        f = float(value)
    except ValueError:
        raise ValueError(f"{what} must be a whole number of tokens, got {value!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise ValueError(f"{what} must be a whole number of tokens, got {value!r}")
    if f < lo:
        raise ValueError(f"{what} must be >= {lo}, got {value!r}")
    return int(f)


def _checked(path: Path, rows: Iterator[tuple[int, Any]],
             parse: Callable[[int, Any], Request]) -> list[Request]:
    """Every row parsed; every bad one named (up to MAX_PROBLEMS) in one WorkloadError, as are
    arrival times that go backwards."""
    out: list[Request] = []
    problems: list[tuple[int | None, str]] = []
    last: Request | None = None
    for n, raw in rows:
        try:
            r = parse(n, raw)
        except (ValueError, TypeError, KeyError) as e:
            problems.append((n, str(e.args[0]) if isinstance(e, KeyError) else str(e)))
            continue
        if (last is not None and r.arrival_s is not None and last.arrival_s is not None
                and r.arrival_s < last.arrival_s):
            problems.append((n, f"the timestamp goes backwards ({r.arrival_s:g} s after the "
                                f"first request, line {last.line} was at {last.arrival_s:g} s)"))
        out.append(r)
        last = r
    if problems:
        raise WorkloadError(path, problems)
    if not out:
        raise WorkloadError(path, [(None, "holds no request")])
    return out


def _jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                yield n, _Bad(f"not JSON ({e.msg} at column {e.colno})")


@dataclass(frozen=True)
class _Bad:
    """A line that did not parse: its parser says why."""

    why: str


def _object(raw: Any) -> dict[str, Any]:
    if isinstance(raw, _Bad):
        raise ValueError(raw.why)
    if not isinstance(raw, dict):
        raise ValueError(f"must be a JSON object, got {type(raw).__name__}")
    return raw


def _first_json_record(head: str) -> Any:
    for line in head.splitlines():
        if line.strip():
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


TIMED_KEYS = ("timestamp", "input_length", "output_length")


@register
class TimedTrace(Format):
    name = "timed_trace"
    vllm_dataset = "timed_trace"
    timed = True
    describe = ("JSONL of timestamp, input_length, output_length and hash_ids (Mooncake's "
                "trace format; vLLM's timed_trace)")
    unit_s = 0.001  # Mooncake's timestamps are milliseconds (`load.time_unit_s` says otherwise)

    def sniff(self, path: Path, head: str) -> bool:
        rec = _first_json_record(head)
        return isinstance(rec, dict) and any(k in rec for k in TIMED_KEYS)

    def read(self, path: Path, unit_s: float | None = None) -> list[Request]:
        unit = self.unit_s if unit_s is None else unit_s
        first: list[float] = []

        def parse(n: int, raw: Any) -> Request:
            rec = _object(raw)
            if "prompt" in rec and not any(k in rec for k in TIMED_KEYS):
                raise ValueError("a custom prompt record in a timed trace (mixed formats: this "
                                 "file starts with timestamp/input_length records)")
            missing = [k for k in TIMED_KEYS if k not in rec]
            if missing:
                raise ValueError(f"no {', '.join(missing)}")
            ts = rec["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
                raise ValueError(f"timestamp must be a number, got {ts!r}")
            if ts < 0:
                raise ValueError(f"timestamp must be >= 0, got {ts!r}")
            ids = rec.get("hash_ids", [])
            if not isinstance(ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in ids):
                raise ValueError("hash_ids must be a list of integers")
            if not first:
                first.append(ts * unit)
            return Request(n, ts * unit - first[0], _count(rec["input_length"], "input_length"),
                           _count(rec["output_length"], "output_length"), tuple(ids))

        return _checked(path, _jsonl(path), parse)


@register
class Custom(Format):
    name = "custom"
    vllm_dataset = "custom"
    describe = 'JSONL of {"prompt": text, "output_tokens": n} (vLLM\'s custom dataset)'

    def sniff(self, path: Path, head: str) -> bool:
        rec = _first_json_record(head)
        return isinstance(rec, dict) and "prompt" in rec

    def read(self, path: Path) -> list[Request]:
        def parse(n: int, raw: Any) -> Request:
            rec = _object(raw)
            if "prompt" not in rec:
                if any(k in rec for k in TIMED_KEYS):
                    raise ValueError("a timed-trace record in a custom prompt file (mixed "
                                     "formats: this file starts with prompt records)")
                raise ValueError("no prompt")
            if not isinstance(rec["prompt"], str) or not rec["prompt"].strip():
                raise ValueError("prompt must be non-empty text")
            out = rec.get("output_tokens")
            return Request(n, None, None, None if out is None else _count(out, "output_tokens"),
                           prompt=rec["prompt"])

        return _checked(path, _jsonl(path), parse)


@register
class ShareGPT(Format):
    name = "sharegpt"
    vllm_dataset = "sharegpt"
    describe = 'a JSON list of {"conversations": [{"value": prompt}, {"value": answer}]}'

    def sniff(self, path: Path, head: str) -> bool:
        return head.lstrip().startswith("[")

    def read(self, path: Path) -> list[Request]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise WorkloadError(path, [(e.lineno, f"not JSON ({e.msg})")]) from None
        if not isinstance(data, list):
            raise WorkloadError(path, [(None, "must be a JSON list of conversations")])

        def parse(n: int, raw: Any) -> Request:
            conv = _object(raw).get("conversations")
            if (not isinstance(conv, list) or len(conv) < 2
                    or not all(isinstance(t, dict) and isinstance(t.get("value"), str)
                               for t in conv[:2])):
                raise ValueError("needs 'conversations': a list of at least two turns, each "
                                 "with a text 'value' (the prompt, then the answer)")
            if not conv[0]["value"].strip():
                raise ValueError("the prompt (first turn) is empty")
            return Request(n, None, None, None, prompt=conv[0]["value"],
                           completion=conv[1]["value"])

        # entries, numbered from 1: a JSON list has no line per request
        return _checked(path, enumerate(data, 1), parse)


# CSV column names (lowercased, spaces and underscores dropped) of the traces users bring
CSV_TIME = ("timestamp", "time", "arrivaltime")
CSV_INPUT = ("contexttokens", "requesttokens", "inputtokens", "inputlength", "prompttokens")
CSV_OUTPUT = ("generatedtokens", "responsetokens", "outputtokens", "outputlength",
              "completiontokens")


def _key(name: str) -> str:
    return name.strip().lower().replace(" ", "").replace("_", "")


@register
class CsvTrace(Format):
    name = "csv"
    vllm_dataset = "timed_trace"  # converted (module docstring)
    timed = True
    describe = ("CSV with a timestamp, an input-token and an output-token column (Azure LLM "
                "inference: TIMESTAMP,ContextTokens,GeneratedTokens; BurstGPT)")

    def sniff(self, path: Path, head: str) -> bool:
        first = head.splitlines()[0] if head else ""
        cols = {_key(c) for c in first.split(",")}
        return bool(cols & set(CSV_INPUT)) and bool(cols & set(CSV_OUTPUT))

    @staticmethod
    def columns(header: list[str]) -> tuple[int, int, int]:
        keys = [_key(c) for c in header]

        def find(names: tuple[str, ...], what: str) -> int:
            for i, k in enumerate(keys):
                if k in names:
                    return i
            raise ValueError(f"no {what} column (one of {', '.join(names)}; the header is "
                             f"{','.join(header)})")

        return (find(CSV_TIME, "timestamp"), find(CSV_INPUT, "input-token"),
                find(CSV_OUTPUT, "output-token"))

    def read(self, path: Path) -> list[Request]:
        with path.open(encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            raise WorkloadError(path, [(None, "is empty")])
        try:
            t_col, in_col, out_col = self.columns(rows[0])
        except ValueError as e:
            raise WorkloadError(path, [(1, str(e))]) from None
        first: list[float] = []

        def parse(n: int, row: list[str]) -> Request:
            if len(row) <= max(t_col, in_col, out_col):
                raise ValueError(f"has {len(row)} fields, the header {len(rows[0])}")
            t = _seconds(row[t_col])
            if not first:
                first.append(t)
            return Request(n, t - first[0], _count(row[in_col], rows[0][in_col]),
                           _count(row[out_col], rows[0][out_col]))

        body = ((n, row) for n, row in enumerate(rows[1:], 2) if any(c.strip() for c in row))
        return _checked(path, body, parse)


def _seconds(text: str) -> float:
    """A CSV timestamp as seconds: a number (seconds), or a date and time (Azure's
    '2023-11-16 18:15:46.6805900': more than six decimals are cut to microseconds)."""
    s = text.strip()
    try:
        f = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(f) or f < 0:
            raise ValueError(f"timestamp must be a number of seconds >= 0, got {text!r}")
        return f
    head, dot, frac = s.partition(".")
    try:
        return datetime.fromisoformat(head + (dot + frac[:6] if dot else "")).timestamp()
    except ValueError:
        raise ValueError(f"timestamp {text!r} is neither seconds nor a date and time") from None


def detect(path: Path) -> Format:
    """The format of `path`, from its first lines (the extension is a hint, not a rule)."""
    with path.open(encoding="utf-8", errors="replace") as f:
        head = f.read(64 * 1024)
    if not head.strip():
        raise WorkloadError(path, [(None, "is empty")])
    for fmt in FORMATS.values():
        if fmt.sniff(path, head):
            return fmt
    raise WorkloadError(path, [(None, "is no workload format tunebook reads: "
                                      + "; ".join(f"{f.name}: {f.describe}"
                                                  for f in FORMATS.values()))])


def read(path: Path, fmt: str = "auto",
         time_unit_s: float | None = None) -> tuple[Format, list[Request]]:
    """The file's format and its requests, every line checked. `time_unit_s`: seconds per
    timestamp unit of a timed_trace file (None: milliseconds, as Mooncake's)."""
    if not path.is_file():
        raise WorkloadError(path, [(None, f"no such file ({path})")])
    if fmt == "auto":
        f = detect(path)
    elif fmt in FORMATS:
        f = FORMATS[fmt]
    else:
        raise WorkloadError(path, [(None, f"unknown format {fmt!r}; one of "
                                          f"{', '.join(['auto', *FORMATS])}")])
    if isinstance(f, TimedTrace):
        return f, f.read(path, time_unit_s)
    return f, f.read(path)


def to_text(rows: list[dict[str, Any]]) -> str:
    """JSONL text of records, keys in a stable order (a derived file is named by its hash)."""
    buf = io.StringIO()
    for r in rows:
        buf.write(json.dumps(r, sort_keys=True) + "\n")
    return buf.getvalue()
