"""Percentiles that admit their sample size: a P99 from fewer than 100 requests (a P90 from
fewer than 10) is an order statistic near the largest sample; charts draw such points hollow
and say so under the title, tables say it in a `percentiles` column."""

from __future__ import annotations

import pandas as pd

from tunebook.charts import plots
from tunebook.present.workbook import percentile_notes
from tunebook.results import stats


def _rows(completed: int) -> pd.DataFrame:
    return pd.DataFrame([{"engine_label": "default", "status": "ok", "max_concurrency": u,
                          "completed": completed, "total_output_tokens": completed * 64,
                          "p50_tpot_ms": 10.0 * u, "p90_tpot_ms": 12.0 * u,
                          "p99_tpot_ms": 15.0 * u, "p99_itl_ms": 16.0 * u}
                         for u in (1, 2)])


def test_the_rule() -> None:
    assert stats.percentile_of("p99_ttft_ms") == "p99" and stats.percentile_of("mean_x") is None
    assert stats.too_few("p99_ttft_ms", 40) and not stats.too_few("p99_ttft_ms", 100)
    assert stats.too_few("p90_tpot_ms", 9) and not stats.too_few("p90_tpot_ms", 10)
    row = {"completed": 40, "total_output_tokens": 40 * 64}
    assert stats.samples_of("p99_ttft_ms", row) == 40
    assert stats.samples_of("p99_itl_ms", row) == 40 * 63  # the gaps, not the requests
    assert not stats.too_few("p99_itl_ms", stats.samples_of("p99_itl_ms", row))


def test_a_chart_draws_thin_percentiles_hollow_and_says_so() -> None:
    spec = plots.latency_percentiles(_rows(40), "tpot").to_dict()
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "hollow: p99 from fewer samples than a P99 needs (100); the fewest: 40" in subtitle
    hollow = [layer for layer in spec["layer"] if layer.get("mark", {}).get("fill") == "white"]
    assert len(hollow) == 1
    data = spec["datasets"][hollow[0]["data"]["name"]]
    assert {d["series"] for d in data} == {"p99"} and {d["samples"] for d in data} == {40}
    enough = plots.latency_percentiles(_rows(200), "tpot").to_dict()
    assert "hollow" not in " ".join(enough["title"].get("subtitle", []))


def test_a_table_says_which_percentile_rests_on_how_few() -> None:
    rows = _rows(40)
    table = percentile_notes(rows[["engine_label", "p99_tpot_ms", "p99_itl_ms"]], rows)
    assert list(table["percentiles"]) == ["P99 TPOT from 40 samples (needs 100)"] * 2
    assert "percentiles" not in percentile_notes(rows[["p99_tpot_ms"]], _rows(150))
