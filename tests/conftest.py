"""What every test shares.

- lib/ is importable when the tunebook package is not installed.
- TUNEBOOK_STATE_DIR points into the session's temp folder: no test reads or writes the
  user's pid files and machine lock (~/.cache/tunebook).
- `shared_engine`: ONE vLLM engine of the suite's common config (SHARED_ENGINE below), kept up
  for the whole session through an EngineKeeper. An engine start costs about a minute of both
  CPU cores, and the quickstart's default config, params/ch01.yaml, params/tune.yaml and the
  fault tests' BASE all plan this same engine config: every in-process sweep of it runs on this
  engine instead of starting its own (test_chapters_cpu checks that the configs still match).
  A papermill kernel or a subprocess cannot use it: those start their own engines.
- `replots`: `tunebook run PARAMS --replot` of committed experiments (copied to a temp folder),
  each in a subprocess launched when the session starts, for the tests marked
  `@pytest.mark.replot(name)`. A replot is ~10 s of one core (a notebook kernel and its
  imports); the suite without engines keeps the other core idle, so they run there meanwhile.
- Engine tests run after all the others, replot users just before them (same order otherwise):
  quick failures come first and the background replots overlap the quick tests. The test
  marked `stops_shared_engine` (the panel's) runs after them and stops the shared engine; the
  tests marked `quiet` (they compare separate runs' measurements) come after the other engine
  tests and, under `make test`, wait for the quick lane to end (`quiet_box`); the
  fast-start module (`fast_start`) runs last of all, as it kills the session's launcher under
  an engine (the panel's starts fork from it: after the kill, its first start imported a new
  launcher, 16.6 s against 3.8) — but for its plain start (`plain_start`), which needs no
  launcher and runs among the other engine tests, before the quick lane has ended.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "lib"
if str(LIB) not in sys.path:
    sys.path.insert(0, str(LIB))

# The reference machines committed under outputs/ (.gitignore un-ignores exactly these; the
# user's own machine folder, which `make demo` writes, is not one: tests that read "every
# committed report" read these alone, whatever the user ran before the suite).
# cpu-xeon-vllm0.31.0 and cpu-xeon-vllm0.32.0: chapters 1-3 on one Xeon box with each release
# (the `vllm` knob; issue 47), beside the cpu reference machine (an EPYC, 0.32.0).
COMMITTED_MACHINES = ("cpu", "cpu-xeon-vllm0.31.0", "cpu-xeon-vllm0.32.0", "h100", "h200")


def titled(root: int, title: str) -> int | None:
    """The first living process under `root` whose title (setproctitle's, as vLLM names its
    engine core and workers) starts with `title`."""
    import psutil

    try:
        kids = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return None
    for p in kids:
        try:
            if p.cmdline() and p.cmdline()[0].startswith(title) \
                    and p.status() != psutil.STATUS_ZOMBIE:
                return p.pid
        except psutil.Error:
            continue
    return None


def committed(pattern: str) -> list[Path]:
    """The files under the committed machines of outputs/ that match `pattern`, sorted."""
    return sorted(p for m in COMMITTED_MACHINES for p in (REPO / "outputs" / m).glob(pattern))


# The model of engine tests whose subject is not the model (deaths, Ray, fast starts):
# SmolLM2's first 6 layers (real weights, a 49,152-token vocabulary). A forked start of it took
# 2.0-2.3 s against qwen3-tiny's 5.6-5.8 s, most of the difference vLLM's API server
# deep-copying qwen3-tiny's real Qwen tokenizer, whose vocabulary and merges transformers keeps
# as Python objects (docs/suite-time.md; benchmarks/model_starts.py).
SMALL_TOKENIZER_MODEL = "smollm2-135m-layers6"

# The engine config the suite shares (model, knobs, env: what EngineConfig.id hashes).
SHARED_ENGINE: dict[str, Any] = {
    "model": "qwen3-tiny",
    "engine": {"max_model_len": 1024},
    "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1},
}

_SESSION_T0 = time.time()


def shared_config(spec: dict[str, Any] | None = None):  # -> tunebook.inputs.plan.EngineConfig
    from tunebook.inputs import params as P
    from tunebook.inputs.plan import make_plan

    return make_plan(P.parse({"experiment": "shared", **(spec or SHARED_ENGINE)})).engines[0]


class SharedEngine:
    """The session's engine of the SHARED_ENGINE config, held by `keeper`.

    Pass `keeper` to a Sweep (or use `sweep()`): a sweep of the same engine config runs on the
    kept engine; one that finds it dead (a test killed it) starts a fresh one and keeps that.
    Its pid file and machine lock live in `state_dir`, apart from each test's own, so the
    fault tests' "nothing left running" checks see it only where they exclude it (`pgids()`).
    """

    def __init__(self, root: Path, spec: dict[str, Any] | None = None):
        from tunebook.measure.supply import EngineKeeper

        self.root = root
        self.session_root = root.parent  # pytest's base temp folder of this session
        self.state_dir = root / "state"
        self.cfg = shared_config(spec)
        self.keeper = EngineKeeper()

    def up(self):  # -> tunebook.servers.vllm.Engine
        """The kept engine; started (again, if a test stopped or killed it) when needed."""
        from tunebook.models.presets import resolve_model
        from tunebook.servers.base import ServerOptions
        from tunebook.servers.vllm import Engine

        # every option a sweep of this config may need (a prefix-cache reset, the block-reuse
        # probe's cached-token counts): a kept engine serves only sweeps it covers
        full = ServerOptions(dev_mode=True, prompt_tokens_details=True)

        mp = pytest.MonkeyPatch()
        mp.setenv("TUNEBOOK_STATE_DIR", str(self.state_dir))
        try:
            self.keeper.hold_machine(0)
            engine = self.keeper.take(self.cfg, full)
            if engine is None:
                log = self.root / "engines" / f"{self.cfg.id}__{self.keeper.starts}.log"
                engine = Engine(resolve_model(self.cfg.model), self.cfg.knobs, self.cfg.env,
                                log, startup_timeout_s=600, options=full)
                self.keeper.starts += 1
                engine.start()
                self.keeper.keep(self.cfg, engine)
        finally:
            mp.undo()
        return engine

    def pgids(self) -> set[int]:
        """Process group of the kept engine, if one is up (its API server's pid)."""
        e = self.keeper.engine
        return {e.proc.pid} if e is not None and e.alive() else set()

    def sweep(self, params: Any, outputs: Path, **kw: Any):  # -> tunebook.measure.sweep.Sweep
        from tunebook.measure.sweep import Sweep, SweepOptions

        self.up()
        return Sweep(params, outputs, SweepOptions(progress=False, keeper=self.keeper, **kw))


# name -> (params file, committed experiment under outputs/)
REPLOTS: dict[str, tuple[str, str]] = {
    "cpu-ch01": ("ch01.yaml", "cpu/ch01"),
    "cpu-ch02": ("ch02.yaml", "cpu/ch02"),
    "h200-ch01": ("ch01-h200.yaml", "h200/ch01"),
    "cpu-ch03": ("ch03.yaml", "cpu/ch03"),
    "cpu-ch05": ("ch05.yaml", "cpu/ch05"),
    "cpu-ch04": ("ch04.yaml", "cpu/ch04"),
    "cpu-ch06": ("ch06.yaml", "cpu/ch06"),
    "cpu-ch06-disagg": ("ch06-disagg.yaml", "cpu/ch06-disagg"),
    "cpu-ch07": ("ch07.yaml", "cpu/ch07"),
    "cpu-ch08": ("ch08.yaml", "cpu/ch08"),
    "cpu-slo": ("slo.yaml", "cpu/slo-bench/slo-search"),
    "cpu-traces": ("traces.yaml", "cpu/traces"),
}
# Replots whose figures read the machine's other experiments too (Fig 7.1): the committed
# experiments beside the stored one are copied beside the copy.
REPLOT_WITH_MACHINE = {"cpu-ch07"}


# The replots run on a thread while the quick lane's tests do: what they start a process with
# is taken here, before any test patches it. A test sets sys.executable to /bin/false (pip
# cannot download, as offline) and one patches subprocess.Popen; a replot started meanwhile ran
# `/bin/false -m tunebook.cli …` (exit 1, no output: the cpu-slo replot once, after make demo).
_PYTHON, _POPEN = sys.executable, subprocess.Popen


class Replot:
    """`tunebook run PARAMS --outputs OUT --replot -q` on a copy of a committed experiment, in a
    subprocess; `wait()` gives its exit code and output. Its interpreter, Popen and environment
    are those of the session's start (_PYTHON, _POPEN; the environment when it is made)."""

    def __init__(self, params_file: str, stored: str, outputs: Path, machine: bool = False):
        import yaml

        self.params = REPO / "params" / params_file
        self.outputs = outputs
        self.exp = outputs / yaml.safe_load(self.params.read_text())["experiment"]
        shutil.copytree(REPO / "outputs" / stored, self.exp)
        if machine:  # the other experiments of the same machine, beside it
            src = (REPO / "outputs" / stored).parent
            for other in sorted(p for p in src.iterdir() if (p / "runs").is_dir()):
                if other.name != Path(stored).name:
                    shutil.copytree(other, outputs / other.name)
        engines = self.exp / "engines"  # a figures-only experiment has none
        self.engine_logs_before = sorted(engines.iterdir()) if engines.is_dir() else []
        path = os.pathsep.join(p for p in (str(LIB), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, "PYTHONPATH": path}
        self._proc: subprocess.Popen | None = None
        self._done: tuple[int, str] | None = None
        self._finished = threading.Event()

    def run(self) -> None:
        try:
            self._proc = _POPEN(
                [_PYTHON, "-m", "tunebook.cli", "run", str(self.params), "--outputs",
                 str(self.outputs), "--replot", "-q"], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, env=self.env)
            out, _ = self._proc.communicate()
            self._done = (self._proc.returncode, out)
        finally:
            self._finished.set()

    def wait(self, timeout_s: float = 600) -> tuple[int, str]:
        if not self._finished.wait(timeout_s):
            raise TimeoutError(f"replot of {self.params.name} still running after {timeout_s} s")
        assert self._done is not None, "the replot did not start"
        return self._done

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "replot(name): uses the background replot `name` (see conftest.REPLOTS)")
    config.addinivalue_line(
        "markers", "stops_shared_engine: ends by stopping the session's shared engine, so it "
                   "runs after every other test of it (a later one would start the engine again)")
    config.addinivalue_line(
        "markers", "quiet: compares the measurements of separate runs, so it runs with no other "
                   "test beside it: after the other engine tests, and once make test's quick "
                   "lane has ended (quiet_box)")


# Engine tests that mostly wait (kills, replacements, run timeouts: about half of two cores)
# run first of them: under `make test` (scripts/test_lanes.py) the quick lane runs beside the
# engine lane's first minutes, and the tests that keep both cores busy (the chapters' runs on the
# shared engine) come after it; the noise-sensitive ones (`quiet`) wait for its end.
ENGINE_FIRST = ("tests/measure/test_engine_deaths.py", "tests/measure/test_faults.py",
                "tests/servers/test_keep_alive.py")


def _load_runner():
    spec = importlib.util.spec_from_file_location("test_lanes", REPO / "scripts" / "test_lanes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUNNER = _load_runner()  # scripts/test_lanes.py, make test's runner (a script, not a package)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Replot users after the other quick tests (their replots have had time to finish),
    engine tests last; each group in its own order (a stable sort). An engine test in a module
    make test's engine lane would not collect (its scan reads the module's text) is refused."""
    mark = RUNNER.ENGINE_MARK
    modules = {item.path: item.nodeid.split("::")[0] for item in items
               if item.get_closest_marker("engine")}
    unseen = sorted(name for path, name in modules.items()
                    if not mark.search(path.read_text(errors="replace")))
    if unseen:
        raise pytest.UsageError(
            f"engine tests in {unseen} are marked in a way make test's engine lane does not "
            f"see: it collects only modules whose text matches {mark.pattern!r} "
            "(scripts/test_lanes.py); mark them with pytest.mark.engine in the module")

    def group(item: pytest.Item) -> int:
        if item.get_closest_marker("plain_start"):
            return 3  # the fast-start tests' plain start: it needs no launcher
        if item.get_closest_marker("fast_start"):
            return 6  # it kills the session's launcher: after every test that forks from it
        if item.get_closest_marker("stops_shared_engine"):
            return 5  # after every other test of the shared engine, wherever its file sorts
        if item.get_closest_marker("quiet"):
            return 4  # last of the shared engine's users but the panel: the quick lane is done
        if item.get_closest_marker("engine"):
            return 2 if item.nodeid.startswith(ENGINE_FIRST) else 3
        return 1 if item.get_closest_marker("replot") else 0

    items.sort(key=group)


QUICK_DONE_ENV = RUNNER.QUICK_DONE_ENV  # set by the runner for the engine lane
QUIET_WAIT_S = 900.0  # make test's hard limit: a quick lane still running then has hung


@pytest.fixture(autouse=True)
def quiet_box(request: pytest.FixtureRequest) -> None:
    """A `quiet` test under make test starts once the quick lane has ended: what it compares
    is measured on a box that runs nothing else of the suite. (The diff test's failure in CI
    that brought this in came back once on a quiet box: its cause was the engine's first runs
    after its start, which that test now warms up.)"""
    done = os.environ.get(QUICK_DONE_ENV)
    if done is None or request.node.get_closest_marker("quiet") is None:
        return
    t0 = time.monotonic()
    while not Path(done).exists():
        if time.monotonic() - t0 > QUIET_WAIT_S:
            pytest.fail(f"the quick lane has not ended after {QUIET_WAIT_S:.0f} s ({done})")
        time.sleep(0.5)
    waited = time.monotonic() - t0
    if waited > 1:
        print(f"[quiet: waited {waited:.0f} s for the quick lane]")


@pytest.fixture(scope="session", autouse=True)
def replots(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Replot]]:
    """The replots the selected tests use, started now (see the module docstring)."""
    names = {m.args[0] for item in request.session.items for m in item.iter_markers("replot")}
    started = {n: Replot(*REPLOTS[n], tmp_path_factory.mktemp(f"replot-{n}"),
                         machine=n in REPLOT_WITH_MACHINE)
               for n in sorted(names)}

    def one_after_another() -> None:  # one core's worth: the tests keep the other
        for r in started.values():
            r.run()

    threading.Thread(target=one_after_another, daemon=True).start()
    yield started
    for r in started.values():
        r.kill()


# A token-shaped secret in the environment of every test: it must not reach any output file
# (test_engine_cpu looks for it). Set for the whole session, not per test: vLLM reads HF_TOKEN
# while it is imported, so a start with another value could not fork from the session's
# launcher and imported one of its own (8.5 s).
FAKE_HF_TOKEN = "hf_" + "TunebookFakeToken" * 2


@pytest.fixture(scope="session", autouse=True)
def _session_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv("TUNEBOOK_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    mp.setenv("HF_TOKEN", FAKE_HF_TOKEN)
    yield
    mp.undo()


@pytest.fixture(scope="session")
def shared_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedEngine]:
    shared = SharedEngine(tmp_path_factory.mktemp("shared-engine"))
    yield shared
    shared.keeper.stop()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """How many vLLM engines this session started: the suite's cost, countable on any machine
    (wall time is noisy). One engine log is written per start, wherever the test put it."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        base = factory.getbasetemp()
    except (OSError, ValueError):
        return
    started = ready = 0
    seen: set[tuple[str, int, float]] = set()
    for log in base.rglob("*.log"):
        if not log.is_file():
            continue
        st = log.stat()
        # copies keep name, size and mtime (copytree): committed experiments (older than this
        # session) and a test's copy of another test's experiment are not starts
        key = (log.name, st.st_size, st.st_mtime)
        if st.st_mtime < _SESSION_T0 or key in seen:
            continue
        seen.add(key)
        text = log.read_text(errors="replace")
        # a start tunebook made writes its spawn line (each start of a config that replaced a
        # dead engine appends to the same log); a test's hand-made vLLM log has none
        if "APIServer pid=" in text or "vllm.entrypoints.openai.api_server" in text:
            started += text.count("tunebook: spawning the server at")
            ready += text.count("Application startup complete")
    if started:
        terminalreporter.write_line(
            f"vLLM engine starts this session: {started} ({ready} became ready)")


_EXIT_STATUS: list[int] = []
# The working tree's outputs/ as the session found it: no test may add to it (a test writing
# where the user's own runs go — this box's machine folder — would mix into their results).
_OUTPUTS_AT_START = {p.name for p in (REPO / "outputs").iterdir()} \
    if (REPO / "outputs").is_dir() else set()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    added = sorted({p.name for p in (REPO / "outputs").iterdir()} - _OUTPUTS_AT_START) \
        if (REPO / "outputs").is_dir() else []
    if added:
        session.config.get_terminal_writer().line(
            f"tests added to the working tree's outputs/: {added} (a test used the default "
            "outputs root: give it --outputs or TUNEBOOK_OUTPUTS)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        exitstatus = int(session.exitstatus)
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """pytest has said all it says: leave without the interpreter's teardown when triton's
    compiled module is loaded (vLLM's client imports it), whose nanobind bindings print dozens
    of "leaked function" lines at teardown (tunebook.cli._quiet_exit does the same for the
    command). atexit handlers still run (engines stopped), streams are flushed."""
    if "triton._C.libtriton" not in sys.modules or not _EXIT_STATUS:
        return
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing left to say
            pass
    os._exit(_EXIT_STATUS[-1])
