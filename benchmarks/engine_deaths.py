"""What a sweep does when one process of its engine is killed mid-point, as the OOM killer does:
`tunebook sweep PARAMS` run as a scheduler runs it, once per start method, and `kill -9` of
one process of its engine (the engine core unless told) as soon as the engine logs the first
request of the sweep's second load point.

    python benchmarks/engine_deaths.py params/deaths.yaml --out outputs/cpu/engine-deaths
    python benchmarks/engine_deaths.py params/deaths-h200.yaml --out outputs/h200/engine-deaths

Writes OUT/benchmark.json and prints a table: per start method, each row's status and error,
the seconds from the kill to the row that says so (the run record's engine_lost.found_at), the
seconds to the replacement engine's pid file, whether any process of the killed engine is left
(zombies included), and on a GPU box which processes hold GPU memory (nvidia-smi) before the
kill, after the replacement is up and at the end: the killed engine's pids must be gone.
The experiments themselves land in OUT/<method>/."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lib"))

from tunebook.servers import process  # noqa: E402

TITLES = {"engine core": "VLLM::EngineCore", "worker": "VLLM::Worker", "API server": None}


def gpu_apps() -> list[dict]:
    """Processes holding GPU memory (nvidia-smi); [] without a GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    apps = []
    for line in out.strip().splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit():
            apps.append({"pid": int(pid), "mib": float(mib or 0)})
    return apps


def completions(exp: Path) -> int:
    return sum(p.read_text(errors="replace").count("POST /v1/completions")
               for p in (exp / "engines").glob("*.log")) if (exp / "engines").is_dir() else 0


def target(pgid: int, role: str) -> int | None:
    title = TITLES[role]
    if title is None:
        return pgid
    for p in psutil.Process(pgid).children(recursive=True):
        try:
            if p.cmdline() and p.cmdline()[0].startswith(title):
                return p.pid
        except psutil.Error:
            continue
    return None


def one(params: Path, out: Path, method: str, role: str, state: Path) -> dict:
    os.environ["TUNEBOOK_STATE_DIR"] = str(state)  # list_engines reads this sweep's pid files
    fast = {"forked": "1", "api": "api", "plain": "0"}[method]  # api: the API server forked alone
    env = {**os.environ, "TUNEBOOK_FAST_START": fast,
           "TUNEBOOK_STATE_DIR": str(state), "TUNEBOOK_BATCH": "1"}
    exp = out / yaml.safe_load(params.read_text())["experiment"]
    log = (out / "sweep.out").open("w")
    sweep = subprocess.Popen([sys.executable, "-m", "tunebook.cli", "sweep", str(params),
                              "--outputs", str(out)], env=env, stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        return _watch(sweep, exp, out, method, role, log)
    except StoppedError as e:
        sweep.terminate()  # the sweep marks its run interrupted and stops its engine
        sweep.wait(60)
        return {"method": method, "role": role, "error": f"stopped ({e}) before the end"}


def _watch(sweep: subprocess.Popen, exp: Path, out: Path, method: str, role: str,
           log: Any) -> dict:
    said: dict = {"method": method, "role": role}
    while not list((exp / "runs").glob("*.json")) if (exp / "runs").is_dir() else True:
        if sweep.poll() is not None:
            return {**said, "error": "the sweep ended before its first point was stored"}
        time.sleep(0.05)
    seen = completions(exp)
    while completions(exp) <= seen:  # the second point's first request
        if sweep.poll() is not None:
            rows = [json.loads(f.read_text())["row"] for f in sorted((exp / "runs").glob("*.json"))]
            return {**said, "error": "the sweep ended before a second point ran",
                    "rows": [{"status": r["status"], "error": r.get("error")} for r in rows]}
        time.sleep(0.02)
    (pgid,) = [e["pgid"] for e in process.list_engines()]
    members = [p.pid for p in process._group_members(pgid)]
    said["gpu_before_kill"] = gpu_apps()
    pid = target(pgid, role)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    said.update(killed_pid=pid, engine_pids=members)
    replaced = None
    while sweep.poll() is None:
        if replaced is None and [e for e in process.list_engines() if e["pgid"] != pgid]:
            replaced = time.time() - killed_at
            time.sleep(5)
            said["gpu_after_replacement"] = gpu_apps()
        time.sleep(0.05)
    log.close()
    rows = []
    for f in sorted((exp / "runs").glob("*.json")):
        rec = json.loads(f.read_text())
        r = rec["row"]
        lost = rec.get("engine_lost", {}).get("found_at")
        rows.append({"users": r.get("max_concurrency"), "status": r["status"],
                     "error": r.get("error"), "engine_replaces": r.get("engine_replaces"),
                     "start_method": r.get("start_method"),
                     "found_after_s": round(lost - killed_at, 3) if lost else None})
    left = []
    for p in members:
        try:
            left.append(f"{p} {psutil.Process(p).status()}")
        except psutil.Error:
            continue
    said.update(exit_code=sweep.returncode, rows=rows, replaced_after_s=replaced,
                left_of_killed_engine=left, gpu_at_end=gpu_apps(),
                killed_engine_on_gpu_at_end=[a for a in gpu_apps() if a["pid"] in members],
                sweep_output_tail=(out / "sweep.out").read_text(errors="replace")[-1500:])
    return said


class StoppedError(Exception):
    pass


def _stopped(signum: int, frame: object) -> None:
    raise StoppedError(f"signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, _stopped)  # a device call's limit: stop the sweep, keep what is
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("params", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--role", default="engine core", choices=sorted(TITLES))
    ap.add_argument("--methods", nargs="+", default=["forked", "plain"],
                    choices=["forked", "api", "plain"])
    args = ap.parse_args()
    results = []
    for method in args.methods:
        out = args.out / method
        out.mkdir(parents=True, exist_ok=True)
        # pid files and the API key stay out of the results (a temporary state folder)
        state = Path(tempfile.mkdtemp(prefix="tunebook-deaths-"))
        results.append(one(args.params.resolve(), out, method, args.role, state))
        r = results[-1]
        if str(r.get("error", "")).startswith("stopped"):
            break
        print(f"== {method}: kill -9 {args.role} (pid {r.get('killed_pid')}); replacement "
              f"after {r.get('replaced_after_s')} s; left of the killed engine: "
              f"{r.get('left_of_killed_engine')}; sweep exit {r.get('exit_code')}")
        for row in r.get("rows", []):
            print(f"   {row['users']:>4} users  {row['status']:<12} {row['found_after_s'] or '':>6}"
                  f"  replaces {row['engine_replaces']}  {row['error'] or ''}")
    # no machine path in what is kept: the command as run from the checkout
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]).replace(f"{Path.cwd()}/", "")
    (args.out / "benchmark.json").write_text(json.dumps(
        {"command": command, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
