"""Each family of load datasets owns its part of `load:`: the keys only it takes, the shared
keys it has no use for, its default users, and what it checks beyond the keys every load
shares. tunebook.inputs.params reads the shared keys, then asks the family of the load's
dataset (`family_of`) and names none of them. A new load kind (tunebook.measure.loads sends
it) is a dataset name in tunebook.inputs.load and its family here, in FAMILIES.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tunebook.core import hardware
from tunebook.core.knobs import short
from tunebook.core.sections import Checker
from tunebook.inputs.load import BLOCK_REUSE, FILE, PROMPT_DATASETS, WorkloadRef, file_state
from tunebook.inputs.workloads import formats as workload_formats
from tunebook.inputs.workloads.replay import Replay
from tunebook.models.prompts import MIN_INPUT_LEN


class LoadChecker(Checker, Protocol):
    """What params' validator offers a family's checks, beyond a section's."""

    problems: list[tuple[str, str]]

    def get(self, data: dict, key: str, typ: type, required: bool = False,
            default: Any = None, prefix: str = "") -> Any: ...

    def number(self, data: dict, key: str, typ: Any, default: Any, lo: float,
               prefix: str = "") -> Any: ...


@dataclass
class Draft:
    """A load as params read its shared keys, for its family to check and complete."""

    dataset: str
    raw: dict[str, Any]
    users: list[int]
    rates: list[float | None]
    prefix_lens: list[int]
    lp: dict[str, Any]  # the shared numbers and switches (input_len, num_warmups, ...)


@dataclass(frozen=True)
class Extra:
    """What a family adds to the load (a workload file's replay and speeds)."""

    replay: Replay | None = None
    speeds: tuple[float, ...] = (1.0,)


class Family:
    """A family of datasets: what of `load:` it owns. `check` says every problem through
    `v.err` (keys under load.) and returns what the family adds to the load."""

    names: tuple[str, ...] = ()
    own_keys: tuple[str, ...] = ()  # load keys only this family takes
    own_hint = ""  # what a load of another dataset that sets one of own_keys is told
    refuses: tuple[str, ...] = ()  # shared load keys it has no use for (left out of its YAML)
    default_users: tuple[int, ...] | None = None  # None: the shared default
    prompts_per_point: int | None = None  # a fixed count (None: from users and the counts)
    prefix_in_prompt = True  # False: prefix_len lies inside input_len (the probe's)

    def check(self, v: LoadChecker, d: Draft) -> Extra:
        return Extra()

    def dump(self, extra: Extra) -> dict[str, Any]:
        """What `check` added, as params YAML again."""
        return {}

    @property
    def warms_up(self) -> bool:
        return "num_warmups" not in self.refuses


def workload(r: Replay) -> WorkloadRef:
    """The prepared workload of a replay, read again when its file changed (mtime, size)."""
    return _workload_cached(r, file_state(r))


@functools.lru_cache(maxsize=16)
def _workload_cached(r: Replay, _state: Any) -> WorkloadRef:
    return WorkloadRef.of(r)


class Synthetic(Family):
    """vLLM's random datasets: random, and two that share prefixes between prompts."""

    names = ("random", "random_prefix", "prefix_repetition")

    def check(self, v: LoadChecker, d: Draft) -> Extra:
        if d.dataset in ("random_prefix", "prefix_repetition") and 0 in d.prefix_lens:
            every = " in every entry" if len(d.prefix_lens) > 1 else ""
            v.err("load.prefix_len", f"dataset {d.dataset!r} needs prefix_len > 0 (shared "
                                     f"prefix tokens per prompt){every}")
        if d.dataset == "random" and any(d.prefix_lens):
            v.err("load.prefix_len", "is only used by random_prefix / prefix_repetition / "
                                     "block_reuse; set dataset: random_prefix")
        return Extra()


class PromptSets(Family):
    """Fig 4.2's prompt sets (tunebook.models.prompts), sent as vLLM `custom` datasets."""

    names = PROMPT_DATASETS

    def check(self, v: LoadChecker, d: Draft) -> Extra:
        if any(d.prefix_lens):
            v.err("load.prefix_len", f"dataset {d.dataset!r} has no shared prefix; leave it 0")
        # (a bad input_len was reported already and stands here as the default)
        n = d.lp["input_len"]
        if d.raw.get("input_len", n) == n < MIN_INPUT_LEN:
            v.err("load.input_len", f"dataset {d.dataset!r}: input_len caps each prompt (a "
                                    "standard-library function, its instruction and the chat "
                                    f"template), so it must be >= {MIN_INPUT_LEN} tokens, got "
                                    f"{n}")
        return Extra()


def _workload_file(v: LoadChecker, raw: dict[str, Any],
                   prefix_lens: list[int]) -> tuple[Replay | None, tuple[float, ...]]:
    """`dataset: file`: the file and what of it to send, checked now, the file's every line
    included (before any engine starts)."""
    n0 = len(v.problems)
    file = raw.get("file")
    if not isinstance(file, str) or not file.strip():
        v.err("load.file", "dataset: file needs file: the workload's path (absolute, or "
                           "relative to the project folder)")
        return None, (1.0,)
    fmt = v.get(raw, "format", str, default="auto", prefix="load")
    if isinstance(fmt, str) and fmt not in ("auto", *workload_formats.FORMATS):
        v.err("load.format", f"must be auto or one of {', '.join(workload_formats.FORMATS)}, "
                             f"got {short(fmt)}")
    window = raw.get("window_s")
    window_s: tuple[float, float] | None = None
    if window is not None:
        if (not isinstance(window, list) or len(window) != 2
                or not all(isinstance(x, int | float) and not isinstance(x, bool)
                           and math.isfinite(x) for x in window)
                or not 0 <= window[0] < window[1]):
            v.err("load.window_s", "must be [start, end] in seconds of the trace's own clock "
                                   f"(0 <= start < end), got {short(window)}")
        else:
            window_s = (float(window[0]), float(window[1]))
    speeds_raw = raw.get("speeds", [1])
    speeds: list[float] = []
    if not isinstance(speeds_raw, list) or not speeds_raw:
        v.err("load.speeds", "must be a non-empty list of replay speeds (1 = the trace's own "
                             f"rate, 2 = twice as fast), got {short(speeds_raw)}")
    else:
        for i, x in enumerate(speeds_raw):
            if isinstance(x, bool) or not isinstance(x, int | float) or not x > 0 \
                    or not math.isfinite(x):
                v.err(f"load.speeds[{i}]", f"must be a number > 0, got {short(x)}")
            else:
                speeds.append(float(x))
        if len(set(speeds)) != len(speeds):
            v.err("load.speeds", "has duplicates: each speed runs once per repeat")
    scale = raw.get("length_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale <= 1 \
            or not math.isfinite(scale):
        v.err("load.length_scale", "must be a number in (0, 1]: every length × it (a small "
                                   f"model, a CPU box), got {short(scale)}")
        scale = 1.0
    unit = raw.get("time_unit_s")
    if unit is not None and (isinstance(unit, bool) or not isinstance(unit, int | float)
                             or not unit > 0):
        v.err("load.time_unit_s", f"must be seconds per timestamp unit (> 0), got "
                                  f"{short(unit)}")
        unit = None
    if any(prefix_lens):
        v.err("load.prefix_len", "a workload file brings its own prefixes; leave it 0")
    r = Replay(
        file=Path(file.strip()), format=fmt if isinstance(fmt, str) else "auto",
        window_s=window_s,
        first=v.number(raw, "first", int, None, lo=1, prefix="load"),
        length_scale=float(scale),
        max_input_len=v.number(raw, "max_input_len", int, None, lo=1, prefix="load"),
        max_output_len=v.number(raw, "max_output_len", int, None, lo=1, prefix="load"),
        block_tokens=v.number(raw, "block_tokens", int, None, lo=1, prefix="load"),
        time_unit_s=None if unit is None else float(unit))
    if len(v.problems) > n0:
        return None, (1.0,)
    try:
        w = workload(r)
    except workload_formats.WorkloadError as e:
        v.err("load.file", f"{file}: {str(e).split(': ', 1)[-1]}")
        return None, (1.0,)
    have = hardware.vllm_client_datasets()
    if have is not None and w.vllm_dataset not in have:
        # timed_trace came to vLLM's client with its PR #39795 (2026): 0.26 (the H200
        # bundle) and 0.32 have it, an older client does not
        since = " (vLLM 0.26 and 0.32 have it)" if w.vllm_dataset == "timed_trace" else ""
        v.err("load.file", f"{w.source}: the installed vLLM's benchmark client "
                           f"({hardware.vllm_package()}) has no {w.vllm_dataset} dataset"
                           f"{since}, only {', '.join(sorted(have))}: it cannot send this "
                           "file here")
    if not w.timed:
        for k in ("speeds", "window_s", "length_scale", "block_tokens", "time_unit_s"):
            if k in raw and not (k == "length_scale" and raw[k] == 1):
                v.err(f"load.{k}", f"{w.source} is a {w.format} file: it has no arrival times "
                                   "or token counts to replay or scale (users and "
                                   "request_rates set its load)")
    return r, tuple(speeds) or (1.0,)


class WorkloadFile(Family):
    """A workload file (tunebook.inputs.workloads): a trace replayed on its own clock, or
    prompts; every line checked before any engine starts."""

    names = (FILE,)
    own_keys = ("file", "format", "window_s", "first", "speeds", "length_scale",
                "max_input_len", "max_output_len", "block_tokens", "time_unit_s")
    own_hint = "belongs to a workload file: set dataset: file (and file: PATH)"

    def check(self, v: LoadChecker, d: Draft) -> Extra:
        return Extra(*_workload_file(v, d.raw, d.prefix_lens))

    def dump(self, extra: Extra) -> dict[str, Any]:
        """The keys of the replay that differ from their defaults, and the speeds."""
        r = extra.replay
        if r is None:
            return {}
        d = Replay(r.file)
        out: dict[str, Any] = {"file": str(r.file)}  # as written: a relative path stays so
        for k in ("format", "first", "length_scale", "max_input_len", "max_output_len",
                  "block_tokens", "time_unit_s"):
            if getattr(r, k) != getattr(d, k):
                out[k] = getattr(r, k)
        if r.window_s is not None:
            out["window_s"] = list(r.window_s)
        out["speeds"] = list(extra.speeds)
        return out


class BlockReuseProbe(Family):
    """Fig 3.3's block-reuse probe (tunebook.measure.probe): two requests per point, one after
    the other, not a load."""

    names = (BLOCK_REUSE,)
    refuses = ("num_prefixes", "prompts_per_user", "min_prompts", "num_prompts", "num_warmups")
    default_users = (1,)
    prompts_per_point = 2
    prefix_in_prompt = False

    def check(self, v: LoadChecker, d: Draft) -> Extra:
        """One user, two requests per point, a cold cache, and a second prompt that differs
        from the base somewhere (k < input_len)."""
        why = "the block_reuse probe sends two requests per point, one after the other"
        if d.users and d.users != [1]:
            v.err("load.users", f"must be [1]: {why}")
        if d.rates and d.rates != [None]:
            v.err("load.request_rates", f"must be left out: {why}")
        for key in self.refuses:
            if key in d.raw:
                v.err(f"load.{key}", f"does not apply: {why}; leave it out")
        if d.lp["reset_prefix_cache"] is False:
            v.err("load.reset_prefix_cache", "must be true for block_reuse: the base prompt "
                                             "must find the cache empty, so that what the "
                                             "second one finds cached comes from the base alone")
        n = d.lp["input_len"]
        if isinstance(n, int):
            for i, k in enumerate(d.prefix_lens):
                if k >= n:
                    v.err("load.prefix_len", f"{k} (entry {i}) must be below input_len {n}: "
                                             "the second prompt shares its first prefix_len "
                                             "tokens with the base, then differs")
                    break
        return Extra()


FAMILIES: tuple[Family, ...] = (Synthetic(), PromptSets(), WorkloadFile(), BlockReuseProbe())
OWN_KEYS = tuple(k for f in FAMILIES for k in f.own_keys)


def family_of(dataset: Any) -> Family | None:
    """The family of a dataset name (None: no such dataset, said by params)."""
    return next((f for f in FAMILIES if dataset in f.names), None)
