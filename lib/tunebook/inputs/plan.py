"""The grid: engine configs × load points × repeats, with stable ids (for resume).

One engine start per engine config; its load points run inside it. Ids hash what defines a
run, so the same params always plan the same run ids; a field added to load points later is
left out of the hash at its neutral value (tunebook.inputs.load._ID_NEUTRAL), so runs stored
before it existed keep their ids. The resume key is the run id *and* the vLLM version
(`Resume`): a run done with another vLLM is run again, and the dry run says so.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tunebook.core import knobs, schema
from tunebook.inputs.load import LoadPoint
from tunebook.inputs.params import LoadParams, SweepParams
from tunebook.servers import kinds as server_kinds


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
    part: str = ""  # the params part that planned it (not in the id: ids stay stable)
    parts: tuple[str, ...] = ()  # every part that planned it (a shared load point: several)

    def __post_init__(self) -> None:
        if not self.run_id:
            rate = "inf" if self.point.request_rate is None else f"{self.point.request_rate:g}"
            load = (f"x{self.point.replay_speed:g}" if self.point.replay_speed is not None
                    else f"u{self.point.max_concurrency}-q{rate}")  # a replay: its speed
            rid = f"{self.engine.id}-p{_digest(self.point.identity(), 6)}-{load}-r{self.repeat}"
            object.__setattr__(self, "run_id", rid)


@dataclass(frozen=True)
class Resume:
    """What stored rows already settle, judged against the installed vLLM (asv's habit: a
    result belongs to the environment that measured it).

    done:  run_id -> the vLLM version of the attempt that is reused (resume skips it)
    rerun: run_id -> the other versions its attempts were made with (resume runs it again)
    A run in neither has no such attempt. With no vLLM installed here (`installed` None), no
    version can be compared and every such attempt counts as done.
    """

    installed: str | None = None
    done: Mapping[str, str | None] = field(default_factory=dict)
    rerun: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], installed: str | None,
                  statuses: Iterable[str] | None = (schema.STATUS_OK,)) -> Resume:
        """From stored rows: the attempts whose status is in ``statuses`` count (None: any)."""
        wanted = None if statuses is None else set(statuses)
        versions: dict[str, set[str | None]] = {}
        pinned: dict[str, str] = {}  # run_id -> the release its config asks for (`vllm` knob)
        for row in rows:
            if wanted is None or row.get("status") in wanted:
                run_id = str(row["run_id"])
                versions.setdefault(run_id, set()).add(schema.vllm_version_of(row))
                if isinstance(row.get("vllm"), str):
                    pinned[run_id] = row["vllm"]
        done: dict[str, str | None] = {}
        rerun: dict[str, tuple[str | None, ...]] = {}
        for run_id, seen in versions.items():
            want = pinned.get(run_id, installed)
            if want is None:
                done[run_id] = max((v for v in seen if v), default=None)
            elif want in seen:
                done[run_id] = want
            else:
                rerun[run_id] = tuple(sorted(seen, key=str))
        return cls(installed, done, rerun)

    @classmethod
    def of(cls, done: Iterable[str]) -> Resume:
        """Run ids counted done with no version to say (what a bare set means)."""
        return cls(None, dict.fromkeys(done), {})


def _versions(versions: Iterable[str | None]) -> str:
    return " and ".join(f"vLLM {v}" if v else "an unrecorded vLLM version" for v in versions)


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
                      "part": r.part, "parts": list(r.parts), **r.point.__dict__}
                     for r in self.runs],
        }

    def describe(self, done: Resume | Iterable[str] = frozenset()) -> str:
        """What `--dry-run` prints: engine configs, their flags, and each load point marked
        done (reused), rerun (done with another vLLM version) or todo."""
        resume = done if isinstance(done, Resume) else Resume.of(done)
        ids = {r.run_id for r in self.runs}
        n_done = len(ids & resume.done.keys())
        rerun = {i: resume.rerun[i] for i in ids & resume.rerun.keys()}
        header = (f"experiment {self.experiment}: {len(self.engines)} engine config(s), "
                  f"{len(self.runs)} run(s), {n_done} already done, "
                  f"{len(self.runs) - n_done} to run")
        if rerun:
            old = sorted({v for vs in rerun.values() for v in vs}, key=str)
            header += (f"; {len(rerun)} of them rerun: done with {_versions(old)}, "
                       f"but vLLM {resume.installed} is installed")
        if n_done and resume.installed is None and any(resume.done.get(i) for i in ids):
            header += ("; vLLM is not installed here, so runs done with any vLLM version "
                       "count as done")
        lines = [header]
        for e in self.engines:
            env = " ".join(f"{k}={v}" for k, v in e.env.items())
            serve = "".join(f"\n  {line}"
                            for line in server_kinds.kind_of(e.knobs).serve_lines(e.model, e.knobs))
            lines.append(f"\n[{e.id}] {e.label}{serve}" + (f"\n  env: {env}" if env else ""))
            for r in self.runs_for(e):
                p = r.point
                line = (f"{p.label:<22} {p.dataset} in={p.input_len} out={p.output_len} "
                        f"prefix={p.prefix_len} prompts={p.num_prompts} repeat={r.repeat}"
                        + ("" if p.reset_prefix_cache else " (no cache reset)")
                        + ("" if p.seed is None else f" seed={p.seed}")
                        + (f" [{r.part}]" if r.part else ""))
                if r.run_id in resume.done:
                    version = resume.done[r.run_id]
                    line = f"done   {line}" + (f"  (vLLM {version})" if version else "")
                elif r.run_id in rerun:
                    line = f"rerun  {line}  (done with {_versions(rerun[r.run_id])})"
                else:
                    line = f"todo   {line}"
                lines.append("  " + line)
        return "\n".join(lines)


def _label(override: dict[str, Any]) -> str:
    if not override:
        return "default"
    named = server_kinds.kind_of(override).label(override)
    if named is not None:
        return named
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, dict) else v}"
                     for k, v in override.items())


def compile_key(cfg: EngineConfig) -> str:
    """What torch.compile's cache is keyed on, as far as the config shows it: the model, the
    environment and every knob vLLM hashes (knobs.Knob.compiled). Eager configs compile
    nothing. Configs with the same key share compiled artifacts."""
    if cfg.knobs.get("enforce_eager") or len(server_kinds.engines(cfg.knobs)) > 1:
        return "eager" if cfg.knobs.get("enforce_eager") else "pair:" + cfg.id
    kept = {k: v for k, v in cfg.knobs.items()
            if v is not None and (k not in knobs.KNOBS or knobs.KNOBS[k].compiled)}
    return _digest({"model": cfg.model, "env": cfg.env, "knobs": kept})


def by_compile_key(configs: Iterable[EngineConfig]) -> list[EngineConfig]:
    """Configs that share compiled artifacts back to back, groups in order of first
    appearance: each group compiles once and its other starts load from the cache, while
    the files it reads are still in the page cache."""
    groups: dict[str, list[EngineConfig]] = {}
    for c in configs:
        groups.setdefault(compile_key(c), []).append(c)
    return [c for g in groups.values() for c in g]


def make_plan(p: SweepParams) -> Plan:
    """Engine configs × load points × repeats, part by part (``SweepParams.all_parts``). An
    engine config shared by several parts is planned once, so it starts once; a run planned
    by two parts (same engine config, same load point) is one run."""
    engines: dict[str, EngineConfig] = {}
    runs: dict[str, PlannedRun] = {}
    for part in p.all_parts():
        configs = []
        for g in part.engine_grid:
            # null = the engine's default: the same config (and id) as leaving the knob out,
            # so a search space with `quantization: [null, fp8]` reuses stored default runs
            knobs = {k: v for k, v in {**p.engine, **g}.items() if v is not None}
            model = knobs.pop("model", p.model)  # an engine_grid entry may swap the model
            cfg = EngineConfig(model=model, knobs=knobs, env=dict(p.engine_env), label=_label(g))
            configs.append(engines.setdefault(cfg.id, cfg))
        ld = part.load
        points = _points(ld)
        for e in configs:
            for pt in points:
                for rep in range(p.repeats):
                    run = PlannedRun(e, pt, rep, part=part.name, parts=(part.name,))
                    first = runs.setdefault(run.run_id, run)
                    if part.name not in first.parts:  # one run, and each part that asked it
                        runs[run.run_id] = replace(first, parts=(*first.parts, part.name))
    return Plan(p.experiment, by_compile_key(engines.values()), list(runs.values()))


def _points(ld: LoadParams) -> list[LoadPoint]:
    """The load points of one part: users × request rates × prefix lengths, or a workload
    file's speeds (a replay) or users × rates (prompts without arrival times)."""
    workload = ld.workload()
    common = dict(dataset=ld.dataset, num_prefixes=ld.num_prefixes, num_warmups=ld.warmups(),
                  reset_prefix_cache=ld.reset_prefix_cache, seed=ld.seed,
                  ignore_eos=ld.ignore_eos, workload=workload, goodput=ld.goodput_arg())
    if workload is not None:
        # a file's requests have their own lengths: the columns say their mean
        ins, outs = workload.mean_lens()
        common.update(input_len=ins, output_len=outs)
        if workload.timed:
            return [LoadPoint(max_concurrency=0, request_rate=None, prefix_len=0,
                              num_prompts=workload.requests, replay_speed=x, **common)
                    for x in ld.speeds]
    else:
        common.update(input_len=ld.input_len, output_len=ld.output_len)
    return [
        LoadPoint(max_concurrency=u, request_rate=rate, prefix_len=k, num_prompts=ld.prompts(u),
                  **common)
        for rate in ld.request_rates
        for u in ld.users
        for k in ld.prefix_len
    ]
