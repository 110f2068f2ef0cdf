"""Scheduled runs with memory on real engines: three dated measurements (`--again`) of one
experiment — the session's engine config, then the params edited behind the scheduler's back
to one sequence at a time (eager), then that again. The second is worse beyond noise than the
first (exit 4, changes__*.json, `tunebook diff` on the two windows exits 1), judged by the
repeats since the engine config changed; the third, where nothing recorded changed, is judged
by the measurements (exit 0: two of one config cannot tell a step from the box's drift); the
history marks one step, at the second, naming the engine config that changed, and none at
the third."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import SHARED_ENGINE, SharedEngine
from tunebook import cli
from tunebook.commands.options import _again_begin, _again_end
from tunebook.inputs import params as P
from tunebook.measure.supply import EngineKeeper
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.present import diff, history
from tunebook.results import measurements

# quiet: its three measurements are compared, so nothing else may run beside them (conftest)
pytestmark = [pytest.mark.engine, pytest.mark.quiet]

# Three a side. Five were brought in when runs of a third of a second on the shared engine
# varied 3x (393, 918, 325 tok/s once) and the family-wise interval of the ratio reached past
# 1; that was the engine in a session of its own starving vLLM's client (a92eb4f,
# tunebook.servers.process "Sessions"). Since, eight runs of this test alone at three a side
# (2-core box): ratio 0.17-0.21, the interval's upper end 0.21-0.36.
REPEATS = 3


def _params(engine: dict[str, Any]) -> P.SweepParams:
    return P.parse({"experiment": "nightly", **SHARED_ENGINE,
                    "engine": {**SHARED_ENGINE["engine"], **engine},
                    "load": {"users": [8], "input_len": 64, "output_len": 24,
                             "prompts_per_user": 1, "num_warmups": 1},
                    "repeats": REPEATS}, source="nightly.yaml")


def test_three_measurements_the_step_at_the_second(tmp_path: Path,
                                                   shared_engine: SharedEngine,
                                                   capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "nightly"
    args = argparse.Namespace(again=True, worse_than=0.0)

    kept = EngineKeeper()  # the slow config's engine, kept from the second to the third

    def measure(params: P.SweepParams, shared: bool) -> int:
        m = _again_begin(args, root)
        sweep = shared_engine.sweep(params, tmp_path, since=m.started) if shared else \
            Sweep(params, tmp_path, SweepOptions(progress=False, since=m.started, keeper=kept))
        result = sweep.run()
        assert (result.ok, result.failed) == (REPEATS, 0)
        return _again_end(args, root, m, {r.run_id for r in sweep.plan.runs})

    # one sequence at a time for 8 users. Two at a time (~2x slower) was lost in the noise of
    # the shared engine's runs beside a busy core (754, 1708, 482, 457 and 655 tok/s once: the
    # family-wise interval of the ratio then needs it below ~0.35); ten runs of it are most
    # of this test's time
    slow = _params({"max_num_seqs": 1, "enforce_eager": True})
    try:
        assert measure(_params({}), shared=True) == cli.EXIT_OK  # the first: nothing to compare
        assert measure(slow, shared=False) == cli.EXIT_WORSE_THAN_LAST
        assert measure(slow, shared=False) == cli.EXIT_OK
    finally:
        kept.stop()
    assert kept.starts == 1
    out = capsys.readouterr().out
    assert "since the last measurement" in out
    first, second = (json.loads(p.read_text()) for p in sorted(root.glob("changes__*.json")))
    assert first["diff_exit_code"] == first["exit_code"] == diff.EXIT_WORSE
    assert first["judged_by"] == "repeats" and first["recorded_changes"]
    assert {w["metric"] for w in first["worse"]} >= {"output_tok_s"}
    # the same config twice, nothing recorded changed: the measurements judge, and two of them
    # cannot tell a step from the box's drift (seven measurements of this config on one warm
    # engine had means 0.53-1.0x of the highest on a quiet box; the repeats judged such a pair
    # "beyond noise" in CI twice, cold engine and warm). What the repeats alone say is kept
    # beside it, unasserted: either way on this box
    assert second["judged_by"] == "measurements" and second["recorded_changes"] == []
    assert second["alike_before"] == 1 and "too few to tell a step" in out
    assert second["exit_code"] == diff.EXIT_SAME and second["worse"] == [], second
    assert "nothing tunebook records changed since then" in out

    ms = measurements.read(root)
    assert len(ms) == 3 and all(m.finished for m in ms)
    # tunebook diff on two windows of the experiment, exit codes as a scheduled job sees them
    window = ["--old-until", ms[1].started, "--new-since", ms[1].started,
              "--new-until", ms[2].started]
    assert cli.main(["diff", str(root), *window]) == diff.EXIT_WORSE
    table, _ = diff.run(diff.Side(root, until=ms[1].started),
                        diff.Side(root, since=ms[1].started, until=ms[2].started))
    tok = table.set_index("metric").loc["output_tok_s"]
    # the claim is the verdict: the whole interval of the ratio below 1 (three short runs a side
    # on 2 shared cores: its upper end has been 0.88 in CI, so no tighter bound is claimed)
    assert tok["verdict"] == diff.WORSE and tok["ratio_high"] < 1.0, tok
    assert cli.main(["diff", str(root), *window, "--worse-than", "10000"]) == diff.EXIT_SAME

    found = history.steps(root)
    assert found and {s.at for s in found} == {ms[1].started}, found
    # the knob is in the file's `engine:`: the label stays "default", the config's id changes
    ids = {re.findall(r"default \[(\w+)\]", s.what_changed).__len__() for s in found}
    assert ids == {2} and all(s.what_changed.startswith("engine configs default [")
                              for s in found), found
    assert all("max_num_seqs default → 1" in s.what_changed for s in found), found
    assert f"into {ms[1].started}" in (root / "history.html").read_text()
