"""Chapters 3 and 5: rules on SYNTHETIC rows (made-up numbers with known answers, not measurements);
the measured verdicts come from outputs/*/ch03 (no engine here)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tunebook import figures
from tunebook.results.evidence import DIFFERS, HOLDS, NOISE, NOT_MEASURED, Evidence


def _ev(rows: list[dict]) -> Evidence:
    base = {"status": "ok", "engine_config_id": "e1", "engine_label": "default",
            "hardware": "test box", "gpu_name": None, "request_rate": None, "prefix_len": 0}
    return Evidence(Path("/nonexistent/exp"), pd.DataFrame([{**base, **r} for r in rows]), [],
                    {"model": "qwen3-8b"})


def test_3_1_cap_matches_below_and_cuts_past_the_cap() -> None:
    rows = []
    for users, default, capped in ((1, 100, 99), (2, 200, 196), (4, 400, 395), (8, 800, 500)):
        rows += [{"engine_config_id": "d", "engine_label": "default", "max_concurrency": users,
                  "output_tok_s": default, "max_num_seqs": None},
                 {"engine_config_id": "c", "engine_label": "max_num_seqs=4",
                  "max_concurrency": users, "output_tok_s": capped, "max_num_seqs": 4}]
    c = figures.verdict(_ev(rows), "3.1")
    assert c.verdict == HOLDS and c.measured_value == pytest.approx(500 / 800)
    rows[-1]["output_tok_s"] = 790  # the cap no longer binds: not the manual's ratio
    assert figures.verdict(_ev(rows), "3.1").verdict == DIFFERS
    assert figures.verdict(_ev(rows[:6]), "3.1").verdict == NOT_MEASURED  # no 2x-cap point


def _prefix_rows(on: list[float], off: list[float]) -> list[dict]:
    rows = []
    for k, t_on, t_off in zip((0, 1024, 4096), on, off, strict=True):
        rows += [{"engine_config_id": "on", "engine_label": "default", "prefix_len": k,
                  "max_concurrency": 1, "median_ttft_ms": t_on, "enable_prefix_caching": None},
                 {"engine_config_id": "off", "engine_label": "enable_prefix_caching=False",
                  "prefix_len": k, "max_concurrency": 1, "median_ttft_ms": t_off,
                  "enable_prefix_caching": False}]
    return rows


def test_3_2_flat_with_the_cache_growing_without() -> None:
    c = figures.verdict(_ev(_prefix_rows([40, 42, 45], [40, 120, 400])), "3.2")
    assert c.verdict == HOLDS and c.measured_value == pytest.approx(45 / 40)
    c = figures.verdict(_ev(_prefix_rows([40, 100, 400], [40, 120, 400])), "3.2")
    assert c.verdict == DIFFERS
    only_on = [r for r in _prefix_rows([40, 42, 45], [1, 1, 1]) if r["engine_config_id"] == "on"]
    assert figures.verdict(_ev(only_on), "3.2").verdict == NOT_MEASURED
    assert figures.get("3.2").chart(_ev(_prefix_rows([40, 42, 45], [40, 120, 400]))).to_dict()


def test_3_3_staircase_of_whole_blocks() -> None:
    rows = [{"dataset": "block_reuse", "prefix_len": k, "block_size": 16,
             "cached_tokens": (k // 16) * 16, "max_concurrency": 1}
            for k in (8, 16, 17, 31, 32, 47, 48, 100)]
    ev = _ev(rows)
    assert figures.verdict(ev, "3.3").verdict == HOLDS
    assert figures.get("3.3").chart(ev).to_dict()
    rows[2]["cached_tokens"] = 17  # a partial block: not how vLLM's cache works
    c = figures.verdict(_ev(rows), "3.3")
    assert c.verdict == DIFFERS and "k=17" in c.why
    assert figures.verdict(_ev([{"max_concurrency": 1}]), "3.3").verdict == NOT_MEASURED


def test_3_4_bigger_budget_raises_p99_itl() -> None:
    rows = [{"engine_config_id": f"b{b}", "engine_label": f"max_num_batched_tokens={b}",
             "max_num_batched_tokens": b, "request_rate": 0.5, "max_concurrency": 64,
             "p99_itl_ms": itl} for b, itl in ((2048, 50.0), (16384, 80.0))]
    c = figures.verdict(_ev(rows), "3.4")
    assert c.verdict == HOLDS and c.measured_value == pytest.approx(1.6)
    rows[1]["p99_itl_ms"] = 45.0
    assert figures.verdict(_ev(rows), "3.4").verdict == DIFFERS
    other_rate = [{**r, "request_rate": 2.0} for r in rows]
    assert "not measured at the manual's" in figures.verdict(_ev(other_rate), "3.4").why
    # two repeats each whose 95% intervals overlap: the rise is within noise
    noisy = [{**r, "run_id": f"{r['engine_config_id']}-{i}", "p99_itl_ms": itl}
             for r, itls in zip(rows, ((50.0, 70.0), (60.0, 75.0)), strict=True)
             for i, itl in enumerate(itls)]
    c = figures.verdict(_ev(noisy), "3.4")
    assert c.verdict == NOISE and "95% CI" in c.why


def test_5_1_the_peak_is_not_the_knee() -> None:
    # a saturating curve (synthetic): near-linear to 8 users, flat from 32
    curve = ((1, 100.0, 10.0), (2, 198.0, 10.2), (4, 390.0, 10.5), (8, 760.0, 11.0),
             (16, 900.0, 18.0), (32, 960.0, 33.0), (64, 965.0, 66.0))
    rows = [{"max_concurrency": u, "output_tok_s": o, "median_tpot_ms": t} for u, o, t in curve]
    c = figures.verdict(_ev(rows), "5.1")
    assert c.verdict == HOLDS and c.measured_value == 64 and "knee at 8 users" in c.measured
    linear = [{"max_concurrency": u, "output_tok_s": 100.0 * u, "median_tpot_ms": 10.0}
              for u in (1, 2, 4, 8)]
    assert figures.verdict(_ev(linear), "5.1").verdict == NOT_MEASURED  # not saturated yet
    assert figures.get("5.1").chart(_ev(rows)).to_dict()
