"""Which server kind serves an engine config, and what each kind refuses before anything starts.

Kinds, in the order they claim a config: a prefill/decode pair (an engine_grid entry with
`disaggregate:`, tunebook.servers.disagg), SGLang (`engine_kind: sglang`,
tunebook.servers.sglang), vLLM (everything else, tunebook.servers.vllm). `server_for` is the one
place that picks a kind for a config; params asks `problems` and `check_entry` here instead of
importing each mechanism. A new kind is a module beside this one and one class below: nothing
in tunebook.measure or tunebook.inputs changes.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunebook.core import knobs as knob_table
from tunebook.models.presets import ModelRef
from tunebook.servers import disagg, sglang, versions, vllm
from tunebook.servers.base import Checker, Server, ServerOptions
from tunebook.servers.sglang import SGLangServer
from tunebook.servers.vllm import Engine, resolve_draft

Problems = list[tuple[str, str]]  # (knob key, message), as params reports them


class ServerKind(ABC):
    name: str = ""
    # An engine_grid key the kind owns (one entry = one server of this kind), checked by
    # check_entry; what one such entry is, for messages.
    entry_key: str | None = None
    entry_means: str = ""

    @abstractmethod
    def claims(self, knobs: Mapping[str, Any]) -> bool:
        """Whether this kind serves an engine config with these knobs."""

    @abstractmethod
    def server(self, model: ModelRef, knobs: Mapping[str, Any], env: Mapping[str, str],
               log_path: Path, start: StartSettings) -> Server:
        """A server of this kind, not started."""

    @abstractmethod
    def problems(self, knobs: Mapping[str, Any], together: int = 1) -> Problems:
        """What this kind refuses in a merged engine config (`together`: engines starting at
        once on the machine), before any engine starts."""

    def engines(self, knobs: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """(key prefix, knobs) of each engine the config starts."""
        return [("", dict(knobs))]

    def check_entry(self, v: Checker, raw: Any, key: str) -> Any:
        """The `entry_key` mapping of an engine_grid entry, checked (None when unusable)."""
        raise NotImplementedError(f"{self.name} owns no engine_grid key")

    @abstractmethod
    def serve_lines(self, model: str, knobs: Mapping[str, Any]) -> list[str]:
        """The command(s) a person would type to start this config by hand (dry runs, the SLO
        search's answer)."""

    def label(self, entry: Mapping[str, Any]) -> str | None:
        """An engine_grid entry's label when the kind names it itself (None: knob=value)."""
        return None


@dataclass(frozen=True)
class StartSettings:
    """How any server is started beyond its knobs: the options its load points need, and how
    long a start may take."""

    options: ServerOptions = field(default_factory=ServerOptions)
    timeout_s: float = 900.0
    fast_start: bool | None = None  # tunebook.servers.launcher (None: the environment decides)


def _shared_problems(cfg: Mapping[str, Any], together: int) -> Problems:
    """Cross-field rules any single engine would otherwise only report after a minute of
    start-up."""
    out = []
    mnbt, mml = cfg.get("max_num_batched_tokens"), cfg.get("max_model_len")
    if cfg.get("enable_chunked_prefill") is False and isinstance(mnbt, int) \
            and isinstance(mml, int) and mnbt < mml:
        out.append(("max_num_batched_tokens",
                    f"{mnbt} < max_model_len {mml} with chunked prefill off: vLLM refuses this; "
                    "raise it to at least max_model_len or turn chunked prefill on"))
    # Engines started together need both: the pool pinned, and a start check each can pass.
    if together == 1 and cfg.get("gpu_memory_utilization") is not None \
            and cfg.get("kv_cache_memory_bytes") is not None:
        out.append(("kv_cache_memory_bytes", "conflicts with gpu_memory_utilization: vLLM "
                                             "sizes the KV cache by one or the other; keep one "
                                             "(with start_together both are needed)"))
    return out


class VllmKind(ServerKind):
    name = knob_table.VLLM

    def claims(self, knobs: Mapping[str, Any]) -> bool:
        return knob_table.engine_kind(knobs) == knob_table.VLLM

    def server(self, model: ModelRef, knobs: Mapping[str, Any], env: Mapping[str, str],
               log_path: Path, start: StartSettings) -> Server:
        e = Engine(model, dict(knobs), dict(env), log_path, start.timeout_s, start.options)
        e.fast_start = start.fast_start
        return e

    def problems(self, knobs: Mapping[str, Any], together: int = 1) -> Problems:
        return vllm.problems(knobs) + _shared_problems(knobs, together)

    def serve_lines(self, model: str, knobs: Mapping[str, Any]) -> list[str]:
        return [vllm.serve_command(model, knobs)]


class SGLangKind(ServerKind):
    name = knob_table.SGLANG

    def claims(self, knobs: Mapping[str, Any]) -> bool:
        return knob_table.engine_kind(knobs) == knob_table.SGLANG

    def server(self, model: ModelRef, knobs: Mapping[str, Any], env: Mapping[str, str],
               log_path: Path, start: StartSettings) -> Server:
        return SGLangServer(model, dict(knobs), dict(env), log_path, start.timeout_s,
                            start.options)

    def problems(self, knobs: Mapping[str, Any], together: int = 1) -> Problems:
        # a knob SGLang has no equivalent for
        return sglang.problems(knobs) + _shared_problems(knobs, together)

    def serve_lines(self, model: str, knobs: Mapping[str, Any]) -> list[str]:
        return [sglang.serve_command(model, knobs)]


class PairKind(ServerKind):
    name = "disaggregated"
    entry_key = disagg.KEY
    entry_means = "one pair of engines"

    def claims(self, knobs: Mapping[str, Any]) -> bool:
        return disagg.is_pair(knobs)

    def server(self, model: ModelRef, knobs: Mapping[str, Any], env: Mapping[str, str],
               log_path: Path, start: StartSettings) -> Server:
        pair = disagg.DisaggPair(model, knobs, dict(env), log_path, start.timeout_s,
                                 start.options)
        for engine in pair.roles.values():  # each side starts as a lone engine would
            engine.fast_start = start.fast_start
        return pair

    def engines(self, knobs: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return disagg.engines_of(knobs)

    def problems(self, knobs: Mapping[str, Any], together: int = 1) -> Problems:
        """What the pair itself cannot do, then each role's problems (keys prefixed
        `disaggregate.<role>.`); its two engines start side by side: pinned pools welcome."""
        out = disagg.pair_problems(knobs)
        roles = disagg.engines_of(knobs)
        if any(knob_table.engine_kind(role) != knob_table.VLLM for _, role in roles):
            out.append(("engine_kind", "a disaggregated pair is two vLLM engines joined by "
                                       "vLLM's KV connector: SGLang cannot be one of them"))
        for prefix, role in roles:
            out += [(prefix + k, m) for k, m in kind_of(role).problems(role, max(together, 2))]
        return out

    def check_entry(self, v: Checker, raw: Any, key: str) -> Any:
        return disagg.check(v, raw, key)

    def serve_lines(self, model: str, knobs: Mapping[str, Any]) -> list[str]:
        return disagg.describe(knobs, knob_table.argv)

    def label(self, entry: Mapping[str, Any]) -> str | None:
        return disagg.label(entry)


KINDS: tuple[ServerKind, ...] = (PairKind(), SGLangKind(), VllmKind())
ENTRY_KINDS = {k.entry_key: k for k in KINDS if k.entry_key}


def kind_of(knobs: Mapping[str, Any]) -> ServerKind:
    return next(k for k in KINDS if k.claims(knobs))


def server_for(model: ModelRef, knobs: Mapping[str, Any], env: Mapping[str, str],
               log_path: Path, start: StartSettings | None = None) -> Server:
    """The server that runs an engine config (not started)."""
    return kind_of(knobs).server(model, knobs, env, log_path, start or StartSettings())


def problems(knobs: Mapping[str, Any], together: int = 1) -> Problems:
    """What the kind serving a merged engine config refuses, before any engine starts."""
    return kind_of(knobs).problems(knobs, together)


def engines(knobs: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(key prefix, knobs) of each engine a config starts: itself, or a pair's two roles."""
    return kind_of(knobs).engines(knobs)


def preflight(configs: list[Mapping[str, Any]], here: bool = True) -> None:
    """Before any engine starts: every draft model a config names is resolved (a preset's
    folder built), and (`here`: the configs run on this machine) every kind they need is
    installed here (EngineNotInstalledError otherwise)."""
    for knobs in configs:
        resolve_draft(dict(knobs))
    if here:
        sglang.require_installed(configs)
        # another vLLM release a config names: installed beside this one now, once
        for version in sorted({k["vllm"] for k in configs if k.get("vllm")}):
            if not versions.ready(version):
                versions.add(version, say=lambda s: print(s, file=sys.stderr))
