"""Cold vs warm engine starts, phase by phase (issue 14). Not a test: one run, ratios.

For each engine config: a *cold* start (its compile caches — vLLM's, Inductor's, Triton's —
in an empty folder), then a *warm* start of the same config with that folder kept. The first
config may also be started cold a second time (`--recold`): the page cache is hot by then, so
cold − recold shows what reading the files from disk cost. Every start is cut into its
phases (tunebook.servers.start_phases) and stored as one JSON file under OUT/starts/ (never
overwritten); OUT/start-phases.md is rebuilt from all of them at the end.

    # CPU (qwen3-tiny):
    .venv/bin/python benchmarks/start_phases.py --model qwen3-tiny --env VLLM_CPU_KVCACHE_SPACE=1 \
        --recold --probe --import-times --out outputs/cpu/start-phases
    # the lent H200 (Qwen3-8B shape, dummy weights), through scripts/h200_run.sh:
    bash scripts/h200_run.sh '@540:bench start_phases.py --model qwen3-8b \
        --engine max_model_len=8192 --config default --recold --probe --import-times'
    # the table again from stored starts:
    .venv/bin/python benchmarks/start_phases.py --report outputs/h200/start-phases

--probe times the steps between "Graph capturing finished" and "init engine … took" inside
the engine core (benchmarks/startup_probe/sitecustomize.py); --import-times measures what
`import vllm.entrypoints.openai.api_server` costs in a fresh interpreter (-X importtime).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from tunebook.core import hardware
from tunebook.models.presets import resolve_model
from tunebook.results.store import stamp, write_new
from tunebook.servers.start_phases import PHASES, parse_phases
from tunebook.servers.vllm import Engine

REPO = Path(__file__).resolve().parents[1]


PROBE_DIR = REPO / "benchmarks" / "startup_probe"
_PROBE = re.compile(r"tunebook-probe: (\S+) took ([\d.]+) s")


def cache_env(folder: Path) -> dict[str, str]:
    """Every compile cache of one start in `folder`: vLLM's, Inductor's, Triton's."""
    return {"VLLM_CACHE_ROOT": str(folder / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
            "TRITON_CACHE_DIR": str(folder / "triton")}


def parse_config(text: str) -> tuple[str, dict[str, Any]]:
    """'default' or 'max_num_seqs=16,quantization=fp8' → (label, knobs); values are YAML."""
    if text == "default":
        return "default", {}
    knobs = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        knobs[k.strip()] = yaml.safe_load(v)
    return text, knobs


def one_start(model: str, knobs: dict[str, Any], label: str, kind: str, cache: Path,
              out: Path, probe: bool, timeout_s: float,
              extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    ref = resolve_model(model)
    env = {**(extra_env or {}), **cache_env(cache)}
    if probe:
        env["TUNEBOOK_STARTUP_PROBE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROBE_DIR), os.environ.get("PYTHONPATH", "")) if p)
    safe = re.sub(r"[^A-Za-z0-9_.=-]", "_", label)[:60]
    log = out / "engines" / f"{safe}__{kind}__{stamp()}.log"
    engine = Engine(ref, knobs, env=env, log_path=log, startup_timeout_s=timeout_s)
    t0 = time.monotonic()
    try:
        engine.start()
        error = None
    except Exception as e:  # noqa: BLE001  (a failed start is a result too)
        error = str(e).splitlines()[0][:300]
    finally:
        engine.stop()
    text = log.read_text(errors="replace") if log.exists() else ""
    probes: dict[str, float] = {}
    for name, secs in _PROBE.findall(text):
        probes[name] = round(probes.get(name, 0.0) + float(secs), 3)
    phases = engine.phases.as_row() if engine.phases else {}
    return {"label": label, "knobs": knobs, "env": extra_env or {}, "kind": kind, "model": model,
            "startup_s": engine.startup_s, "wall_s": round(time.monotonic() - t0, 3),
            "error": error, **phases, "probe": probes,
            "log": os.path.relpath(log, out), "machine": hardware.machine(),
            "python": platform.python_version(), "at": stamp()}


def import_times(out: Path, runs: int = 2) -> dict[str, Any]:
    """`import vllm.entrypoints.openai.api_server` in fresh interpreters: wall time of each,
    and the slowest top-level packages of the last (-X importtime, cumulative)."""
    walls, top = [], []
    for _ in range(runs):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-X", "importtime", "-c",
                            "import vllm.entrypoints.openai.api_server"],
                           capture_output=True, text=True, check=False)
        walls.append(round(time.monotonic() - t0, 2))
        by_package: dict[str, float] = {}
        for ln in r.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", ln)
            if m:  # self time, summed per top-level package (torch, transformers, vllm …)
                pkg = m.group(2).split(".")[0]
                by_package[pkg] = by_package.get(pkg, 0.0) + int(m.group(1)) / 1e6
        top = [{"package": n, "self_s": round(v, 2)}
               for n, v in sorted(by_package.items(), key=lambda kv: -kv[1])[:12]]
    return {"import_wall_s": walls, "top_level_imports": top}


def report(out: Path) -> str:
    """The cold-vs-warm table from every stored start under `out`."""
    starts = []
    for p in sorted((out / "starts").glob("*.json")):  # in time order
        s = json.loads(p.read_text())
        log = out / s["log"]
        if log.exists() and s.get("startup_s"):  # phases as this code reads the log
            s.update(parse_phases(log.read_text(errors="replace"), s["startup_s"]).as_row())
        starts.append(s)
    extra = [json.loads(p.read_text()) for p in sorted((out / "imports").glob("*.json"))]
    lines = ["# Engine starts, cold vs warm, phase by phase", "",
             "Phases cut at vLLM's own log lines (tunebook.servers.start_phases; ± 1 s each, "
             "summing "
             "to the start). *cold*: compile caches (vLLM, Inductor, Triton) empty; *warm*: "
             "the same config again with them kept; *recold*: cold again with the page cache "
             "hot. Command: see benchmarks/start_phases.py.", ""]
    machines = sorted({f"{s['machine'].get('hardware')}, {s['machine'].get('vllm_package')}"
                       for s in starts})
    lines += [f"Measured on: {'; '.join(machines)}.", ""]
    head = ["config", "start", *PHASES, "total s", "compile cache", "warm ÷ cold"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cold: dict[str, float] = {}
    for s in starts:
        if s.get("error"):
            lines.append(f"| {s['label']} | {s['kind']} | failed: {s['error']} |")
            continue
        if s["kind"] == "cold":  # a warm start compares with the cold start before it
            cold[s["label"]] = s["startup_s"]
        ratio = (f"{s['startup_s'] / cold[s['label']]:.2f}×"
                 if s["kind"] != "cold" and s["label"] in cold else "")
        cells = [f"{v:.1f}" if (v := s.get(f"start_{p}_s")) is not None else "—" for p in PHASES]
        lines.append(f"| {s['label']} | {s['kind']} | " + " | ".join(cells)
                     + f" | {s['startup_s']:.1f} | {s.get('compile_cache') or '—'} | {ratio} |")
    probed = [s for s in starts if s.get("probe")]
    if probed:
        lines += ["", "## Inside the engine core (--probe: seconds per wrapped call)", ""]
        names = sorted({n for s in probed for n in s["probe"]})
        lines += ["| step | " + " | ".join(f"{s['label']} {s['kind']}" for s in probed) + " |",
                  "|---|" + "---|" * len(probed)]
        for n in names:
            lines.append(f"| `{n.removeprefix('vllm.')}` | " + " | ".join(
                f"{s['probe'][n]:.2f}" if n in s["probe"] else "—" for s in probed) + " |")
    for e in extra:
        lines += ["", f"## Importing the API server ({e['machine'].get('hardware')})", "",
                  f"Wall time of `import vllm.entrypoints.openai.api_server` in a fresh "
                  f"interpreter, {len(e['import_wall_s'])} runs: "
                  + ", ".join(f"{w:.1f} s" for w in e["import_wall_s"])
                  + ". Where it goes: import time of each top-level package's own modules "
                  "(self time, last run):", "",
                  "| package | s |", "|---|---|"]
        lines += [f"| {t['package']} | {t['self_s']:.2f} |" for t in e["top_level_imports"]]
    text = "\n".join(lines) + "\n"
    (out / "start-phases.md").write_text(text)
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-tiny")
    ap.add_argument("--engine", action="append", default=[], metavar="KEY=VALUE",
                    help="a knob every config gets, e.g. max_model_len=8192")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable every start gets, e.g. "
                         "VLLM_CPU_KVCACHE_SPACE=1 (the quickstart's)")
    ap.add_argument("--config", action="append", default=None,
                    help="'default' or 'knob=value,knob=value' (repeatable)")
    ap.add_argument("--recold", action="store_true",
                    help="start the first config cold a second time (page cache hot)")
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--import-times", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cache", type=Path, default=None,
                    help="where the benchmark's compile caches go (default: a temporary "
                         "folder, removed at the end)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start nothing new after this many seconds (a device call's limit)")
    ap.add_argument("--timeout-s", type=float, default=420)
    ap.add_argument("--report", type=Path, default=None, metavar="OUT",
                    help="only rebuild OUT/start-phases.md from its stored starts")
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    base = {k: v for e in args.engine for k, v in parse_config(e)[1].items()}
    configs = [parse_config(c) for c in (args.config or ["default"])]
    machine = "cpu" if hardware.machine().get("gpu_name") is None else "h200"
    out = args.out or REPO / "outputs" / machine / "start-phases"
    (out / "starts").mkdir(parents=True, exist_ok=True)
    cache_root = args.cache or Path(tempfile.mkdtemp(prefix="tunebook-start-phases-"))
    t_begin = time.monotonic()
    plan = []
    for i, (label, knobs) in enumerate(configs):
        plan += [(label, knobs, "cold"), (label, knobs, "warm")]
        if i == 0 and args.recold:
            plan.append((label, knobs, "recold"))
    if args.import_times:
        res = {**import_times(out), "machine": hardware.machine()}
        (out / "imports").mkdir(exist_ok=True)
        write_new(out / "imports" / f"{stamp()}.json", json.dumps(res, indent=1).encode())
        print(f"import times: {res['import_wall_s']}", flush=True)
    for label, knobs, kind in plan:
        elapsed = time.monotonic() - t_begin
        if args.budget_s and elapsed > args.budget_s:
            print(f"budget spent ({elapsed:.0f} s): not starting {label} {kind}", flush=True)
            break
        cache = cache_root / re.sub(r"[^A-Za-z0-9_.=-]", "_", label)
        if kind in ("cold", "recold"):
            shutil.rmtree(cache, ignore_errors=True)
        print(f"== {label} {kind} …", flush=True)
        rec = one_start(args.model, {**base, **knobs}, label, kind, cache, out, args.probe,
                        args.timeout_s, dict(e.split("=", 1) for e in args.env))
        write_new(out / "starts" / f"{rec['at']}-{kind}.json",
                  json.dumps(rec, indent=1, default=str).encode())
        print(f"   {rec['startup_s'] or float('nan'):.1f} s, compile cache "
              f"{rec.get('compile_cache')}, probe {rec['probe']}"
              + (f", error {rec['error']}" if rec["error"] else ""), flush=True)
    shutil.rmtree(cache_root, ignore_errors=True)
    print(report(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
