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


def _measure(root: Path, run_ids: list[str], scale: float, rng: random.Random,
             config_id: str | None = None) -> None:
    """Stored attempts of every planned run, as a sweep would have written them (config_id:
    another engine config's id, as a knob changed behind the scheduler's back makes)."""
    for rid in run_ids:
        users = int(rid.split("-u")[1].split("-")[0])
        Store(root).save_run({"row": {
            "run_id": rid, "status": "ok", "started_at": utc_now(), "experiment": "sched",
            "engine_config_id": config_id or rid.split("-")[0], "engine_label": "default",
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


@pytest.mark.parametrize("scale, knob_changed, code", [
    (1.0, False, cli.EXIT_OK), (0.8, True, cli.EXIT_WORSE_THAN_LAST), (0.8, False, cli.EXIT_OK)])
def test_what_changed_since_the_last_measurement_is_said_first(
        tmp_path: Path, capsys: pytest.CaptureFixture, scale: float, knob_changed: bool,
        code: int) -> None:
    """A recorded change (here the engine config's id, as a knob edited in the file makes)
    is judged by the repeats: 20 % worse is exit 4. With nothing recorded changed, two
    measurements cannot tell a step from the box's own drift between measurements: the
    repeats' diff says worse, the verdict (the history's) does not."""
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
    cid = "e9" if knob_changed else None
    _measure(root, ids[:-1], scale, rng, cid)  # interrupted before the last run: not finished
    assert _again_end(args, root, second, set(ids)) == cli.EXIT_OK
    assert M.read(root)[-1].finished is None
    resumed = _again_begin(args, root)
    assert resumed.started == second.started
    _measure(root, ids[-1:], scale, rng, cid)
    assert _again_end(args, root, resumed, set(ids)) == code
    out = capsys.readouterr().out
    assert out.startswith(f"since the last measurement ({first.started})"), out
    summary = json.loads(next(root.glob("changes__*.json")).read_text())
    assert summary["previous"] == first.started and summary["this"] == second.started
    assert summary["exit_code"] == (1 if code == cli.EXIT_WORSE_THAN_LAST else 0)
    assert summary["judged_by"] == ("repeats" if knob_changed else "measurements")
    assert bool(summary["recorded_changes"]) == knob_changed
    if code == cli.EXIT_WORSE_THAN_LAST:
        assert {w["metric"] for w in summary["worse"]} >= {"output_tok_s"}
    else:
        assert summary["worse"] == []
    if scale < 1 and not knob_changed:  # what the repeats alone say, kept beside
        assert summary["diff_exit_code"] == 1 and "nothing tunebook records changed" in out
        assert summary["alike_before"] == 1 and "too few to tell a step" in out


def test_a_measurement_out_of_line_with_earlier_ones_is_worse(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture
                                                              ) -> None:
    """Nothing recorded changed, five earlier measurements: their means' spread is the box's
    noise between measurements, and a sixth 20 % lower is worse beyond it (exit 4)."""
    params = P.parse(PARAMS)
    root = tmp_path / "sched"
    ids = [r.run_id for r in Sweep(params, tmp_path, SweepOptions(progress=False)).plan.runs]
    rng = random.Random(5)
    args = argparse.Namespace(again=True, worse_than=0.0)
    codes = []
    for scale in (1.0, 1.0, 1.0, 1.0, 1.0, 0.8):
        m = _again_begin(args, root)
        _measure(root, ids, scale, rng)
        codes.append(_again_end(args, root, m, set(ids)))
    assert codes == [cli.EXIT_OK] * 5 + [cli.EXIT_WORSE_THAN_LAST], capsys.readouterr().out
    last = json.loads(sorted(root.glob("changes__*.json"))[-1].read_text())
    assert last["judged_by"] == "measurements" and last["recorded_changes"] == []
    assert last["alike_before"] == 5
    assert {w["metric"] for w in last["worse"]} >= {"output_tok_s"}


def test_the_report_leads_with_the_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """The notebooks' first section after the run (wb.changes): in a dated measurement, the
    verdict --again exits on, in words, above the diff against the previous one; otherwise a
    line saying there is none."""
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
    assert "worse beyond noise" in shown[-1]  # the repeats' table
    # nothing recorded changed and two measurements: the verdict is the history's
    assert "**nothing tunebook records changed since then" in shown[-1]
    assert "nothing worse beyond the noise between measurements — with 1 earlier " in shown[-1]
    assert "too few to tell a step from the box's drift" in shown[-1]
