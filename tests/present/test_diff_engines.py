"""tunebook diff on real engines: two experiments of the same config and vLLM version, three
repeats each, are within noise on every metric; a config known to be slower (one sequence at a
time, eager, at 8 users) is worse beyond noise; the exit codes a scheduled job acts on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import SHARED_ENGINE, SharedEngine
from tunebook.cli import main as cli
from tunebook.inputs import params as P
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.present import diff

pytestmark = pytest.mark.engine
METRICS = ["output_tok_s", "median_tpot_ms", "median_ttft_ms"]


def _params(name: str, grid: list[dict[str, Any]] | None = None) -> P.SweepParams:
    return P.parse({"experiment": name, **SHARED_ENGINE, "engine_grid": grid or [{}],
                    "load": {"users": [8], "input_len": 64, "output_len": 24,
                             "prompts_per_user": 1, "num_warmups": 1},
                    "repeats": 3}, source=f"{name}.yaml")


def test_same_config_within_noise_and_a_slower_one_worse(tmp_path: Path,
                                                          shared_engine: SharedEngine,
                                                          capsys: pytest.CaptureFixture) -> None:
    for name in ("diff-a", "diff-b"):  # the same config twice, on the session's engine
        result = shared_engine.sweep(_params(name), tmp_path).run()
        assert (result.ok, result.failed) == (3, 0)
    slow = Sweep(_params("diff-slow", [{"max_num_seqs": 1, "enforce_eager": True}]), tmp_path,
                 SweepOptions(progress=False)).run()
    assert (slow.ok, slow.failed) == (3, 0)
    metrics = [a for m in METRICS for a in ("--metric", m)]
    summary = tmp_path / "same.json"
    rc = cli(["diff", str(tmp_path / "diff-a"), str(tmp_path / "diff-b"), *metrics,
              "--json", str(summary)])
    out = capsys.readouterr().out
    assert rc == diff.EXIT_SAME, out
    assert f"0 {diff.WORSE}, 0 {diff.BETTER}, {len(METRICS)} {diff.NOISE}" in out, out
    assert json.loads(summary.read_text())["exit_code"] == diff.EXIT_SAME
    rc = cli(["diff", str(tmp_path / "diff-a"), str(tmp_path / "diff-slow"), *metrics])
    out = capsys.readouterr().out
    assert rc == diff.EXIT_WORSE, out
    table, _ = diff.run(diff.Side(tmp_path / "diff-a"), diff.Side(tmp_path / "diff-slow"),
                        METRICS)
    tok = table.set_index("metric").loc["output_tok_s"]
    assert tok["verdict"] == diff.WORSE and tok["ratio_high"] < 0.5, tok
    # a threshold above the change: the job is told nothing got worse by that much
    assert cli(["diff", str(tmp_path / "diff-a"), str(tmp_path / "diff-slow"), *metrics,
                "--worse-than", "10000"]) == diff.EXIT_SAME
