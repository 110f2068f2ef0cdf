"""Three scheduled runs of one params file on real engines (`tunebook sweep --again`), the
second with a knob changed in the params file behind the scheduler's back (one sequence at a
time, at 4 users): the history marks the step at the second run, names what changed (the
engine config), and marks none at the third, where nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tunebook.cli import EXIT_OK, EXIT_WORSE_THAN_LAST
from tunebook.cli import main as cli
from tunebook.present import history
from tunebook.results import measurements

pytestmark = pytest.mark.engine


def test_three_dated_runs_the_step_at_the_second(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    params = tmp_path / "nightly.yaml"
    base = {"experiment": "nightly", "model": "qwen3-tiny",
            "engine": {"max_model_len": 512, "enforce_eager": True},
            "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1},
            "load": {"users": [4], "input_len": 64, "output_len": 32, "prompts_per_user": 2,
                     "num_warmups": 1}, "repeats": 3}
    params.write_text(yaml.safe_dump(base))
    out = tmp_path / "out"
    sweep = ["sweep", str(params), "--outputs", str(out), "--again", "-q"]
    assert cli(sweep) == EXIT_OK
    # behind the scheduler's back: someone edits the file
    base["engine"]["max_num_seqs"] = 1
    params.write_text(yaml.safe_dump(base))
    assert cli(sweep) == EXIT_WORSE_THAN_LAST
    said = capsys.readouterr().out
    assert "since the last measurement" in said and "worse beyond noise" in said
    assert cli(sweep) == EXIT_OK  # the same as the run before: nothing worse
    root = out / "nightly"
    ms = measurements.read(root)
    assert len(ms) == 3 and all(m.finished for m in ms)
    found = history.steps(root)
    assert found and {s.at for s in found} == {ms[1].started}, found
    assert all("engine configs" in s.what_changed for s in found)
    tok = [s for s in found if s.metric == "output_tok_s"]
    assert tok and tok[0].verdict == "worse beyond noise"
    page = (root / "history.html").read_text()
    assert f"into {ms[1].started}" in page
    changes = sorted(root.glob("changes__*.json"))
    assert len(changes) == 2 and json.loads(changes[0].read_text())["diff_exit_code"] == 1
