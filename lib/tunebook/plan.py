"""The grid: engine configs × load points × repeats, with stable ids (for resume).

One engine start per engine config; its load points run inside it. Ids hash what defines a
run, so the same params always plan the same run ids and a resumed sweep skips finished ones.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from tunebook.load import LoadPoint
from tunebook.params import SweepParams


def _digest(obj: Any, n: int = 10) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


@dataclass(frozen=True)
class EngineConfig:
    model: str
    knobs: dict[str, Any]  # every knob for this config (base + grid override), vLLM names
    env: dict[str, str]
    label: str  # what differs from the base, e.g. "max_num_seqs=4"; "default" if nothing
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            ident = {"model": self.model, "knobs": self.knobs, "env": self.env}
            object.__setattr__(self, "id", "e" + _digest(ident))


@dataclass(frozen=True)
class PlannedRun:
    engine: EngineConfig
    point: LoadPoint
    repeat: int
    run_id: str = ""

    def __post_init__(self) -> None:
        if not self.run_id:
            rate = "inf" if self.point.request_rate is None else f"{self.point.request_rate:g}"
            rid = (f"{self.engine.id}-p{_digest(self.point.__dict__, 6)}"
                   f"-u{self.point.max_concurrency}-q{rate}-r{self.repeat}")
            object.__setattr__(self, "run_id", rid)


@dataclass
class Plan:
    experiment: str
    engines: list[EngineConfig]
    runs: list[PlannedRun] = field(default_factory=list)

    def runs_for(self, engine: EngineConfig) -> list[PlannedRun]:
        return [r for r in self.runs if r.engine.id == engine.id]

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "engines": [e.__dict__ for e in self.engines],
            "runs": [{"run_id": r.run_id, "engine_config_id": r.engine.id, "repeat": r.repeat,
                      **r.point.__dict__} for r in self.runs],
        }

    def describe(self, done: set[str] | frozenset[str] = frozenset()) -> str:
        """What `--dry-run` prints: engine configs, their flags, and each load point."""
        pending = sum(r.run_id not in done for r in self.runs)
        lines = [f"experiment {self.experiment}: {len(self.engines)} engine config(s), "
                 f"{len(self.runs)} run(s), {len(self.runs) - pending} already done, "
                 f"{pending} to run"]
        from tunebook.engine import knob_flags  # late: engine imports psutil

        for e in self.engines:
            flags = " ".join(knob_flags(e.knobs)) or "(vLLM defaults)"
            env = " ".join(f"{k}={v}" for k, v in e.env.items())
            lines.append(f"\n[{e.id}] {e.label}\n  vllm serve {e.model} {flags}"
                         + (f"\n  env: {env}" if env else ""))
            for r in self.runs_for(e):
                mark = "done" if r.run_id in done else "todo"
                p = r.point
                lines.append(f"  {mark}  {p.label:<22} {p.dataset} in={p.input_len} "
                             f"out={p.output_len} prefix={p.prefix_len} prompts={p.num_prompts}"
                             f" repeat={r.repeat}")
        return "\n".join(lines)


def _label(override: dict[str, Any]) -> str:
    if not override:
        return "default"
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, dict) else v}"
                     for k, v in override.items())


def make_plan(p: SweepParams) -> Plan:
    engines = []
    for g in p.engine_grid:
        knobs = {**p.engine, **g}
        model = knobs.pop("model", p.model)  # an engine_grid entry may swap the model
        engines.append(EngineConfig(model=model, knobs=knobs, env=dict(p.engine_env),
                                    label=_label(g)))
    ld = p.load
    points = [
        LoadPoint(
            dataset=ld.dataset, max_concurrency=u, request_rate=rate, input_len=ld.input_len,
            output_len=ld.output_len, prefix_len=ld.prefix_len, num_prefixes=ld.num_prefixes,
            num_prompts=ld.num_prompts or max(ld.min_prompts, u * ld.prompts_per_user),
            num_warmups=ld.num_warmups,
        )
        for rate in ld.request_rates
        for u in ld.users
    ]
    runs = [PlannedRun(e, pt, rep) for e in engines for pt in points for rep in range(p.repeats)]
    return Plan(p.experiment, engines, runs)
