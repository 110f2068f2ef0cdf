"""An answer you can deploy: an engine config of an experiment (the SLO search's answer unless
told) written as vLLM's own config file (`vllm serve --config FILE`), the same knobs as a
container's arguments, and as a Helm values fragment (vLLM production-stack's
`servingEngineSpec.modelSpec[].vllmConfig.extraArgs`); `prove` starts vLLM from the file and
finds each knob in effect.

Only knobs that differ from vLLM's defaults are written: a knob set to the value vLLM's
EngineArgs default to is left out (said in the file's header); a knob vLLM decides at start-up
(its default None, e.g. max_num_seqs from the platform) is kept, since the box it is deployed on
may decide otherwise. The model is machine-local here (a preset's folder with random weights):
the files name it MODEL, for the user to replace.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tunebook.core import knobs as knob_table
from tunebook.models.presets import ModelRef
from tunebook.results.store import Store
from tunebook.servers import metrics
from tunebook.servers.vllm import ConfigFileEngine

MODEL = "MODEL"  # the placeholder the user replaces with their model's path or hub id
FILES = ("vllm-config.yaml", "container-args.json", "helm-values.yaml")
NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$", re.M)
# knob -> its label in vllm:cache_config_info (what the engine runs with, from /metrics)
CACHE_LABELS = {"block_size": "block_size", "enable_prefix_caching": "enable_prefix_caching",
                "gpu_memory_utilization": "gpu_memory_utilization", "kv_cache_dtype": "cache_dtype"}


NOT_VLLM = "__not_vllm__"  # a config another server kind served (its env entry says which)


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class Answer:
    """One engine config of an experiment, ready to write."""

    experiment: str
    label: str
    engine_config_id: str
    model: str  # tunebook's model spec (a preset, a folder, a hub id)
    knobs: dict[str, Any]  # the flag knobs that differ from vLLM's defaults
    left_out: dict[str, Any]  # knobs set to vLLM's own default
    env: dict[str, str]  # the engine's environment (params engine_env)


def knobs_of_argv(argv: list[str]) -> dict[str, Any]:
    """The knobs in an engine's command line (the run record keeps what vLLM was started
    with): each knob's flag, its value read as YAML (numbers, booleans, JSON mappings)."""
    by_flag = {k.cli: k.name for k in knob_table.KNOBS.values() if k.flag}
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in by_flag:
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") \
                else None
            out[by_flag[arg]] = True if value is None else yaml.safe_load(value)
            i += 1 if value is None else 2
            continue
        if arg.startswith("--no-") and "--" + arg[5:] in by_flag:
            out[by_flag["--" + arg[5:]]] = False
        i += 1
    return out


Config = tuple[str, str, dict[str, Any], dict[str, str]]  # label, model, knobs, env


def _configs(exp: Path) -> dict[str, Config]:
    """engine_config_id -> (label, model, knobs, env) of every config with a stored run."""
    out: dict[str, Config] = {}
    for rec in Store(exp).records():
        row, argv = rec["row"], rec.get("engine", {}).get("argv")
        cid = row.get("engine_config_id")
        if cid and cid not in out and argv:
            argv = ast.literal_eval(argv) if isinstance(argv, str) else argv
            env = dict(rec["engine"].get("env") or {})
            if row.get("disaggregated") or row.get("engine_kind") not in (None, "vllm"):
                env = {NOT_VLLM: "SGLang" if row.get("engine_kind") == "sglang"
                       else "a prefill/decode pair"}
            out[cid] = (row.get("engine_label") or cid, row.get("model") or "",
                        knobs_of_argv(list(argv)), env)
    return out


def _search_answer(exp: Path) -> dict[str, Any] | None:
    searches = sorted((exp / "search").glob("*.json")) if (exp / "search").is_dir() else []
    for path in reversed(searches):
        best = json.loads(path.read_text()).get("best")
        if best and best.get("knobs") is not None:
            return best["knobs"]
    return None


def pick(exp: Path, config: str | None = None) -> Answer:
    """The config `config` names (an engine_config_id or its label), else the SLO search's
    answer, else the experiment's only config."""
    configs = _configs(exp)
    if not configs:
        raise ExportError(f"{exp}: no stored run to export a config from")
    names = ", ".join(f"{cid} ({c[0]})" for cid, c in configs.items())
    if config is not None:
        found = [cid for cid, c in configs.items() if config in (cid, c[0])]
        if not found:
            raise ExportError(f"{exp.name} has no engine config {config!r}; it has: {names}")
        cid = found[0]
    elif (best := _search_answer(exp)) is not None:
        found = [cid for cid, (_, _, k, _) in configs.items()
                 if all(k.get(n) == v for n, v in best.items() if v is not None)
                 and not any(k.get(n) is not None for n, v in best.items() if v is None)]
        if not found:
            raise ExportError(f"{exp.name}: the search's answer {best} has no stored run")
        cid = min(found, key=lambda c: len(configs[c][2]))  # the config that is the answer
    elif len(configs) == 1:
        cid = next(iter(configs))
    else:
        raise ExportError(f"{exp.name} has {len(configs)} engine configs and no search answer: "
                          f"name one with --config ({names})")
    label, model, knobs, env = configs[cid]
    if NOT_VLLM in env:
        raise ExportError(f"{exp.name}: {label} is served by {env[NOT_VLLM]}, not one vLLM "
                          "engine: deploy writes vLLM's own config file")
    defaults = knob_table.vllm_defaults()
    flags = {k: v for k, v in knobs.items() if knob_table.KNOBS[k].flag}
    same = {k: v for k, v in flags.items() if k in defaults and defaults[k] == v}
    return Answer(exp.name, label, cid, model,
                  {k: v for k, v in flags.items() if k not in same}, same, env)


def _header(a: Answer) -> str:
    lines = [f"tunebook export: experiment {a.experiment}, engine config {a.engine_config_id} "
             f"({a.label}); measured with model {a.model}: put yours where it says {MODEL}",
             "only the knobs that differ from vLLM's defaults"]
    if a.env:
        lines.append("measured with the engine's environment: "
                     + " ".join(f"{k}={v}" for k, v in a.env.items()))
    if a.left_out:
        lines.append("left out, vLLM's default already: "
                     + ", ".join(f"{k}={v}" for k, v in a.left_out.items()))
    return "".join(f"# {line}\n" for line in lines)


def config_yaml(a: Answer) -> str:
    """vLLM's config file: flag names as keys (vLLM turns each into --key VALUE; a nested
    mapping into JSON, a boolean into --key or --no-key)."""
    body = {"model": MODEL, **{k.replace("_", "-"): v for k, v in a.knobs.items()}}
    return _header(a) + yaml.safe_dump(body, sort_keys=False)


def container_args(a: Answer) -> list[str]:
    """The arguments after the image (`docker run vllm/vllm-openai … ARGS`): the same flags
    tunebook started the engine with."""
    return ["--model", MODEL, *knob_table.argv(a.knobs)]


def helm_values(a: Answer) -> str:
    values = {"servingEngineSpec": {"modelSpec": [{
        "name": re.sub(r"[^a-z0-9-]+", "-", f"{a.experiment}-{a.engine_config_id}".lower()),
        "modelURL": MODEL,
        "vllmConfig": {"extraArgs": knob_table.argv(a.knobs)}}]}}
    return _header(a) + yaml.safe_dump(values, sort_keys=False)


def write(a: Answer, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    texts = (config_yaml(a), json.dumps(container_args(a), indent=1) + "\n", helm_values(a))
    paths = []
    for name, text in zip(FILES, texts, strict=True):
        (out / name).write_text(text)
        paths.append(out / name)
    return paths


def _same(want: Any, seen: Any) -> bool:
    if isinstance(want, dict | list):
        try:
            seen = json.loads(seen) if isinstance(seen, str) else seen
        except ValueError:
            return False
    return str(want) == str(seen) if not isinstance(want, dict | list) else want == seen


def in_effect(a: Answer, log: str, metrics_text: str) -> dict[str, dict[str, Any]]:
    """Per exported knob: the value asked, what vLLM's start-up log says it took (its
    `non-default args` line) and, for cache knobs, what /metrics' cache_config_info says."""
    found = NON_DEFAULT.search(log)
    took = ast.literal_eval(found.group(1)) if found else {}
    info: dict[str, str] = {}
    for s in metrics.parse(metrics_text):
        if s.name == metrics.CACHE_CONFIG_INFO:
            info = dict(s.label_dict)
            break
    out = {}
    for k, v in a.knobs.items():
        seen = {"log": took.get(k, "(absent)")}
        if k in CACHE_LABELS and CACHE_LABELS[k] in info:
            seen["metrics"] = info[CACHE_LABELS[k]]
        ok = _same(v, seen["log"]) and ("metrics" not in seen or _same(v, seen["metrics"]))
        out[k] = {"asked": v, **seen, "ok": ok}
    return out


def prove(a: Answer, config_file: Path, model: ModelRef, log_path: Path,
          env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Start vLLM from `config_file` (vLLM's own reader: `--config`, the model given on the
    command line as a user would; `env`: the engine's environment, e.g. the experiment's
    engine_env) and say, per knob, whether it took effect."""
    with ConfigFileEngine(model, config_file, log_path, env, startup_timeout_s=600) as engine:
        return in_effect(a, engine.log_path.read_text(errors="replace"), engine.metrics_text())
