"""Dated measurements (tunebook.results.measurements, `run`/`sweep --again`): a new measurement
counts only its own attempts as done, an unfinished one is resumed, and once it is finished
what changed since the previous one is said first, with a JSON summary and an exit code."""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import pytest

from tunebook import cli
from tunebook.commands.options import _again_begin, _again_end
from tunebook.core import hardware
from tunebook.inputs import params as P
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.results import measurements as M
from tunebook.results.store import Store, utc_now

PARAMS = {"experiment": "sched", "model": "qwen3-tiny",
          "load": {"users": [1, 4], "input_len": 32, "output_len": 16}, "repeats": 3}


def _measure(root: Path, run_ids: list[str], scale: float, rng: random.Random) -> None:
    """Stored attempts of every planned run, as a sweep would have written them."""
    for rid in run_ids:
        users = int(rid.split("-u")[1].split("-")[0])
        Store(root).save_run({"row": {
            "run_id": rid, "status": "ok", "started_at": utc_now(), "experiment": "sched",
            "engine_config_id": rid.split("-")[0], "engine_label": "default",
            "dataset": "random", "max_concurrency": users, "input_len": 32, "output_len": 16,
            "prefix_len": 0, "hardware": "box", "completed": 8,
            "vllm_version": hardware.vllm_version(),
            "output_tok_s": 100.0 * users * scale * rng.gauss(1, 0.02),
            "median_tpot_ms": 20.0 / scale * rng.gauss(1, 0.02)}})
        time.sleep(0.002)


def test_begin_resumes_an_unfinished_measurement_and_windows_split_them(tmp_path: Path
                                                                        ) -> None:
    first, new = M.begin(tmp_path)
    again, new2 = M.begin(tmp_path)
    assert new and not new2 and again.started == first.started  # unfinished: resumed
    M.finish(tmp_path, first.started)
    time.sleep(0.002)
    second, new3 = M.begin(tmp_path)
    assert new3 and second.started > first.started
    assert M.window(tmp_path, first.started) == (first.started, second.started)
    assert M.window(tmp_path, second.started) == (second.started, None)
    assert M.previous(tmp_path, second.started).started == first.started
    assert [m.started for m in M.read(tmp_path)] == [first.started, second.started]


def test_a_new_measurement_runs_the_whole_plan_again(tmp_path: Path) -> None:
    params = P.parse(PARAMS)
    sweep = Sweep(params, tmp_path, SweepOptions(progress=False))
    ids = [r.run_id for r in sweep.plan.runs]
    _measure(sweep.store.root, ids, 1.0, random.Random(0))
    assert sweep.done() == set(ids)  # resume: all done
    m, _ = M.begin(sweep.store.root)
    again = Sweep(params, tmp_path, SweepOptions(progress=False, since=m.started))
    assert again.done() == set()  # a new measurement: nothing of the last one reused


@pytest.mark.parametrize("scale, code", [(1.0, cli.EXIT_OK), (0.8, cli.EXIT_WORSE_THAN_LAST)])
def test_what_changed_since_the_last_measurement_is_said_first(
        tmp_path: Path, capsys: pytest.CaptureFixture, scale: float, code: int) -> None:
    params = P.parse(PARAMS)
    root = tmp_path / "sched"
    ids = [r.run_id for r in Sweep(params, tmp_path, SweepOptions(progress=False)).plan.runs]
    rng = random.Random(3)
    args = argparse.Namespace(again=True, worse_than=0.0)
    first = _again_begin(args, root)
    _measure(root, ids, 1.0, rng)
    assert _again_end(args, root, first, set(ids)) == cli.EXIT_OK
    assert "the first measurement" in capsys.readouterr().out
    second = _again_begin(args, root)
    _measure(root, ids[:-1], scale, rng)  # interrupted before the last run: not finished
    assert _again_end(args, root, second, set(ids)) == cli.EXIT_OK
    assert M.read(root)[-1].finished is None
    resumed = _again_begin(args, root)
    assert resumed.started == second.started
    _measure(root, ids[-1:], scale, rng)
    assert _again_end(args, root, resumed, set(ids)) == code
    out = capsys.readouterr().out
    assert out.startswith(f"since the last measurement ({first.started})"), out
    summary = json.loads(next(root.glob("changes__*.json")).read_text())
    assert summary["previous"] == first.started and summary["this"] == second.started
    if code == cli.EXIT_WORSE_THAN_LAST:
        assert {w["metric"] for w in summary["worse"]} >= {"output_tok_s"}
    else:
        assert summary["worse"] == []


def test_the_report_leads_with_the_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """The notebooks' first section after the run (wb.changes): in a dated measurement, the
    diff against the previous one; otherwise a line saying there is none."""
    import IPython.display

    from tunebook.present.workbook import Workbook

    shown: list[str] = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj.data))
    params = P.parse(PARAMS)
    sweep = Sweep(params, tmp_path, SweepOptions(progress=False))
    root, ids = sweep.store.root, [r.run_id for r in sweep.plan.runs]
    rng = random.Random(5)
    wb = Workbook(params, sweep)
    wb.changes()
    assert "not a dated measurement" in shown[-1]
    first, _ = M.begin(root)
    _measure(root, ids, 1.0, rng)
    M.finish(root, first.started)
    second, _ = M.begin(root)
    _measure(root, ids, 0.7, rng)
    monkeypatch.setenv(M.SINCE_ENV, second.started)
    wb.changes()
    assert shown[-1].startswith(f"Since the measurement of {first.started}")
    assert "worse beyond noise" in shown[-1]
