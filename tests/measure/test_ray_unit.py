"""tunebook.measure.executors.ray_cluster's pieces that need no cluster: what a task asks Ray
for, which cores a slot pins its engine to, the worker's environment, and `executor:` in params."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tunebook.inputs import params as P
from tunebook.inputs.executor import EXECUTOR
from tunebook.measure.executors import ray_address
from tunebook.measure.executors import ray_cluster as R

BASE = {"experiment": "x", "model": "qwen3-tiny", "load": {"users": [1]}}


def test_an_engine_asks_for_tensor_times_pipeline_gpus() -> None:
    assert R.gpus_needed({}) == 1
    assert R.gpus_needed({"tensor_parallel_size": 4, "pipeline_parallel_size": 2}) == 8


def test_two_slots_hold_disjoint_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    held: list[R.Slot] = []
    release = threading.Event()

    def hold() -> None:
        with R.claim_slot(2, tmp_path) as slot:
            held.append(slot)
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    while not held:
        pass
    with R.claim_slot(2, tmp_path) as other:
        assert {held[0].index, other.index} == {0, 1}
        assert {held[0].cores, other.cores} == {"0-3", "4-7"}
    release.set()
    t.join()


def test_the_worker_runs_its_share_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task's sweep must not start Ray again (the driver's --ray travels in the env)."""
    monkeypatch.setenv("TUNEBOOK_RAY", "local")
    env = R.worker_env(R.Slot(1, "1"), tmp_path, gpu=False)
    assert "TUNEBOOK_RAY" not in env and env["TUNEBOOK_STATE_DIR"] == str(tmp_path)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in R.worker_env(None, tmp_path, gpu=True) or \
        os.environ.get("VLLM_CPU_OMP_THREADS_BIND")


def test_executor_in_params() -> None:
    p = P.parse({**BASE, "executor": "ray:auto"})
    assert p.section(EXECUTOR) == P.parse(p.to_dict()).section(EXECUTOR) == "ray:auto"
    assert "executor" not in P.parse(BASE).to_dict() and P.parse(BASE).section(EXECUTOR) == "local"
    assert ray_address(p) == "auto"
    assert ray_address(P.parse({**BASE, "executor": "ray"})) == "local"
    assert ray_address(P.parse(BASE)) is None
    for bad, key in (("slurm", "executor"), ("ray:", "executor"), (6379, "quote it")):
        with pytest.raises(P.ParamsError) as e:
            P.parse({**BASE, "executor": bad})
        assert key in str(e.value)
    with pytest.raises(P.ParamsError, match="on Ray each engine config is its own task"):
        P.parse({**BASE, "executor": "ray", "start_together": 2})


def test_a_runs_arrays_stream_back_before_its_json(tmp_path: Path) -> None:
    """A task streams each run's Parquet file of arrays just before the JSON that names it,
    once; the driver's sink stores both and counts the run once, and the record reads back
    whole on the driver's side."""
    from types import SimpleNamespace

    from tunebook.measure.sweep import StoreSink
    from tunebook.results.store import Store

    node = Store(tmp_path / "node")
    arrays = {"ttfts": [i / 100 for i in range(300)], "errors": [""] * 300}
    node.save_run({"row": {"run_id": "r1", "status": "ok"}, "requests": arrays})
    node.save_run({"row": {"run_id": "r2", "status": "failed"}})  # no arrays: its JSON alone
    sent: set[str] = set()
    items = list(R.new_run_files(node.runs_dir, sent))
    assert [(kind, name.split("__")[0], name.rsplit(".", 1)[-1]) for kind, name, _ in items] \
        == [("requests", "r1", "parquet"), ("run", "r1", "json"), ("run", "r2", "json")]
    assert not list(R.new_run_files(node.runs_dir, sent))  # each file once
    driver = Store(tmp_path / "driver")
    result = SimpleNamespace(rows=[], ok=0, failed=0)
    sink = StoreSink(driver, result, None, SimpleNamespace(stored_ok=[]))  # type: ignore[arg-type]
    bar = SimpleNamespace(n=0, update=lambda k: setattr(bar, "n", bar.n + k))
    cfg = SimpleNamespace(label="x")
    for item in items:
        R.RayExecutor._take("exp", cfg, item, sink, bar)
    assert (result.ok, result.failed, bar.n) == (1, 1, 2)
    assert sorted(p.name for p in driver.runs_dir.iterdir()) == sorted(
        p.name for p in node.runs_dir.iterdir())
    assert [r.get("requests") for r in driver.records()] == [arrays, None]
