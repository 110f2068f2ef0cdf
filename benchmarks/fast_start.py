"""Plain starts against starts through the launcher (issue 32), phase by phase. Not a test:
one run, the methods alternating, ratios within the run.

Each round starts the same engine config once per method, in turn: `exec` (a plain
`python -m vllm.entrypoints.openai.api_server`), `launcher` (the API server forked from a
process that imported vLLM; its engine core and worker spawned as vLLM chooses) and
`launcher+fork` (those forked too) — each lever on its own. Compile caches are tunebook's
(warm after the first start) unless --cold, where every start gets an empty cache folder.
Before the rounds, one discarded start per launcher method pays the launcher's own import
(reported apart: once per tunebook process). Each start is one JSON file under OUT/starts/;
OUT/fast-start.md is rebuilt from all of them.

    .venv/bin/python benchmarks/fast_start.py --model qwen3-tiny --rounds 3 \\
        --env VLLM_CPU_KVCACHE_SPACE=1 --out outputs/cpu/fast-start
    .venv/bin/python benchmarks/fast_start.py --model qwen3-tiny --rounds 3 --cold \\
        --env VLLM_CPU_KVCACHE_SPACE=1 --out outputs/cpu/fast-start-cold
    .venv/bin/python benchmarks/fast_start.py --report outputs/cpu/fast-start
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tunebook.core import hardware
from tunebook.models.presets import resolve_model
from tunebook.results.store import stamp, write_new
from tunebook.servers import launcher as L
from tunebook.servers.base import ServerOptions
from tunebook.servers.start_phases import PHASES
from tunebook.servers.vllm import Engine

MODES = {L.EXEC: "0", L.API_FORK: "api", L.FULL_FORK: "1"}


def one_start(model: str, knobs: dict[str, Any], env: dict[str, str], method: str,
              out: Path, role: str) -> dict[str, Any]:
    os.environ[L.FAST_START_ENV] = MODES[method]
    log = out / "logs" / f"{stamp()}_{method}.log"
    e = Engine(resolve_model(model), knobs, env, log, startup_timeout_s=900,
               options=ServerOptions(dev_mode=True))
    t0 = time.monotonic()
    with e:
        wall = time.monotonic() - t0
        row = e.row()
    rec = {"method": method, "role": role, "wall_s": wall, "startup_s": row["startup_s"],
           "start_method": row["start_method"], "start_method_note": row["start_method_note"],
           "kv_pool_tokens": row.get("kv_pool_tokens"),
           "phases": {p: row.get(f"start_{p}_s") for p in PHASES},
           "log": os.path.relpath(log, out)}
    write_new(out / "starts" / f"{stamp()}_{method}.json", json.dumps(rec, indent=1).encode())
    print(f"{role:8} {method:14} {row['startup_s']:6.1f} s  ({row['start_method']}"
          f"{'; ' + row['start_method_note'] if row['start_method_note'] else ''})", flush=True)
    return rec


def _stats(xs: list[float]) -> str:
    return (f"{min(xs):.1f} / {statistics.median(xs):.1f} / {max(xs):.1f}" if xs else "–")


def _machine(out: Path) -> str:
    m = json.loads((out / "machine.json").read_text())
    return (f"{m['hardware']}, {m['vllm_package']}, torch {m['torch_version']}, "
            f"tunebook {m['tunebook_commit']}")


def report(out: Path) -> str:
    recs = [json.loads(p.read_text()) for p in sorted((out / "starts").glob("*.json"))]
    rounds = [r for r in recs if r["role"] == "round"]
    lines = [f"# Fast starts: {out.name}", "",
             f"Machine: {_machine(out)}" if
             (out / "machine.json").exists() else "", "",
             "Seconds, min / median / max over the rounds (methods alternating in each):", "",
             "| method | starts | startup_s | " + " | ".join(PHASES) + " | ÷ exec (median) |",
             "|---|---|---|" + "---|" * len(PHASES) + "---|"]
    base = [r["startup_s"] for r in rounds if r["method"] == L.EXEC]
    for method in MODES:
        mine = [r for r in rounds if r["method"] == method]
        if not mine:
            continue
        total = [r["startup_s"] for r in mine]
        cells = [_stats([r["phases"][p] for r in mine if r["phases"].get(p) is not None])
                 for p in PHASES]
        ratio = (f"**{statistics.median(total) / statistics.median(base):.2f}×**"
                 if base else "–")
        lines.append(f"| {method} | {len(mine)} | {_stats(total)} | " + " | ".join(cells)
                     + f" | {ratio} |")
    # per-round ratios: the same round's exec start against each launcher start
    for method in (L.API_FORK, L.FULL_FORK):
        pairs = [(a["startup_s"], b["startup_s"]) for a, b in zip(
            [r for r in rounds if r["method"] == L.EXEC],
            [r for r in rounds if r["method"] == method], strict=False)]
        if pairs:
            lines += ["", f"{method} ÷ exec, round by round: "
                      + ", ".join(f"{b / a:.2f}" for a, b in pairs)]
    first = [r for r in recs if r["role"] == "warm-up"]
    if first:
        lines += ["", "Warm-up starts, discarded (the first pays the launcher's import of vLLM, "
                  "once per tunebook process; the next method's share that launcher): "
                  + ", ".join(f"{r['method']} {r['startup_s']:.1f} s" for r in first)]
    pools = {r["kv_pool_tokens"] for r in recs}
    lines += ["", f"KV pool (tokens) of every start: {sorted(pools, key=str)}"]
    text = "\n".join(lines) + "\n"
    (out / "fast-start.md").write_text(text)
    return text


def launcher_cuda() -> list[dict[str, Any]]:
    """Per live launcher: the NVIDIA device files it has open (a CUDA context opens
    /dev/nvidiactl, /dev/nvidia<N>, /dev/nvidia-uvm) and whether the CUDA driver library is
    mapped in it (dlopened by cuInit): both empty = it never initialised CUDA."""
    out = []
    for x in L._LAUNCHERS:
        if x.proc is None or x.proc.poll() is not None:
            continue
        pid = x.proc.pid
        fds = sorted({os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()
                      if os.readlink(f).startswith("/dev/nvidia")})
        maps = Path(f"/proc/{pid}/maps").read_text()
        out.append({"launcher_pid": pid, "nvidia_device_files_open": fds,
                    "libcuda_mapped": "libcuda.so" in maps,
                    "libtorch_cuda_mapped": "libtorch_cuda" in maps})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-tiny")
    ap.add_argument("--engine", action="append", default=[], help="knob=value (YAML value)")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE of the engine")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", default=",".join(MODES), help="of " + ",".join(MODES))
    ap.add_argument("--cold", action="store_true", help="an empty compile cache every start")
    ap.add_argument("--out", type=Path, default=Path("outputs/cpu/fast-start"))
    ap.add_argument("--report", type=Path, help="only rebuild the table of this folder")
    a = ap.parse_args()
    if a.report:
        print(report(a.report))
        return
    import yaml

    knobs = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in a.engine)}
    env = dict(s.split("=", 1) for s in a.env)
    methods = a.methods.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    if not (a.out / "machine.json").exists():
        (a.out / "machine.json").write_text(json.dumps(hardware.machine(), default=str))

    # cold: one folder, emptied before every start (its path is read when vLLM is imported,
    # so a launcher serves every start; a first start on a machine finds it just as empty)
    cold = Path(tempfile.mkdtemp(prefix="tunebook-cold-"))
    cold_env = {"VLLM_CACHE_ROOT": str(cold / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(cold / "inductor")} if a.cold else {}

    def start(method: str, role: str) -> None:
        if a.cold:
            shutil.rmtree(cold, ignore_errors=True)
            cold.mkdir()
        one_start(a.model, knobs, {**env, **cold_env}, method, a.out, role)

    try:
        for method in methods:
            if method != L.EXEC:
                start(method, "warm-up")
            if method != L.EXEC and not (a.out / "launcher-cuda.json").exists():
                # the launcher must not touch CUDA before it forks (a forked CUDA context is
                # unusable): after its first engine, what does the launcher itself hold?
                write_new(a.out / "launcher-cuda.json",
                          json.dumps(launcher_cuda(), indent=1).encode())
        for _ in range(a.rounds):
            for method in methods:
                start(method, "round")
    finally:
        L.stop_all()
        shutil.rmtree(cold, ignore_errors=True)
    print(report(a.out))


if __name__ == "__main__":
    main()
