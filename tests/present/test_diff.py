"""tunebook diff on rows whose truth is known: noise alone says "within noise" (family-wise:
a whole diff flags something on at most ~5 % of pure-noise draws), a real step says better or
worse by the metric's direction, and what cannot be compared says why; exit codes."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
import pytest

from tunebook.cli import main as cli
from tunebook.present import diff

REPO = Path(__file__).resolve().parents[2]


def _rows(rng: random.Random, n: int, scale: float = 1.0, users: tuple[int, ...] = (1, 8),
          hardware: str = "cpu-box") -> pd.DataFrame:
    rows = []
    for u in users:
        for _ in range(n):
            noise = rng.gauss(1, 0.03)
            rows.append({"status": "ok", "dataset": "random", "max_concurrency": u,
                         "request_rate": None, "input_len": 128, "output_len": 64,
                         "prefix_len": 0, "replay_speed": None, "hardware": hardware,
                         "output_tok_s": 100.0 * u * scale * noise,
                         "median_tpot_ms": 20.0 / scale * rng.gauss(1, 0.03),
                         "p99_ttft_ms": 200.0 / scale * rng.gauss(1, 0.03)})
    return pd.DataFrame(rows)


def test_noise_alone_is_within_noise_family_wise() -> None:
    flagged = 0
    for seed in range(200):
        rng = random.Random(seed)
        t = diff.compare(_rows(rng, 3), _rows(rng, 3))
        assert len(t) == 6 and set(t["verdict"]) <= {diff.NOISE, diff.BETTER, diff.WORSE}
        flagged += (t["verdict"] != diff.NOISE).any()
    assert flagged <= 0.05 * 200 + 4, flagged  # ≤ 5 % of whole diffs, give or take sampling


def test_a_ten_percent_step_is_found_in_its_direction() -> None:
    """A 10 % step over a 3 % run-to-run spread, five repeats a side."""
    rng = random.Random(1)
    slower = diff.compare(_rows(rng, 5), _rows(rng, 5, scale=0.9))
    assert set(slower["verdict"]) == {diff.WORSE}, slower[["metric", "verdict", "ratio"]]
    faster = diff.compare(_rows(rng, 5), _rows(rng, 5, scale=1.1))
    assert set(faster["verdict"]) == {diff.BETTER}
    tok = slower[slower["metric"] == "output_tok_s"].iloc[0]
    assert tok["ratio_low"] < tok["ratio"] < tok["ratio_high"] < 1
    assert diff.exit_code(slower) == diff.EXIT_WORSE and diff.exit_code(faster) == diff.EXIT_SAME
    assert diff.exit_code(slower, worse_than_pct=25) == diff.EXIT_SAME  # 10 % is under 25 %


def test_what_cannot_be_compared_says_why() -> None:
    rng = random.Random(2)
    one = diff.compare(_rows(rng, 1), _rows(rng, 3))
    assert set(one["verdict"]) == {diff.NOT_COMPARABLE}
    assert one["why"].str.contains("too few repeats").all()
    assert diff.exit_code(one) == diff.EXIT_BAD
    other = diff.compare(_rows(rng, 3), _rows(rng, 3, hardware="h100"))
    assert other["why"].str.contains("other machine").all()
    only = diff.compare(_rows(rng, 3, users=(1,)), _rows(rng, 3, users=(1, 8)))
    assert only[only["load"].str.startswith("8 users")]["why"].str.contains(
        "only on the new side").all()


def test_the_command_on_stored_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp = REPO / "outputs" / "h100" / "traces-tuned"
    page, summary = tmp_path / "diff.html", tmp_path / "diff.json"
    rc = cli(["diff", str(exp), "--old-config", "default", "--new-config",
              "max_num_seqs=256, max_num_batched_tokens=16384", "--html", str(page),
              "--json", str(summary)])
    out = capsys.readouterr().out
    assert rc == diff.EXIT_BAD  # one run per speed on each side: nothing to judge noise by
    assert "too few repeats (1 old, 1 new" in out and "file at 16×" in out
    assert "What changed" in page.read_text() and '"exit_code": 2' in summary.read_text()
    assert cli(["diff", str(exp), "--old-version", "9.9.9"]) == diff.EXIT_BAD
    assert "no run matches" in capsys.readouterr().err
