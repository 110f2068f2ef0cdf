"""The Pareto view of cost (tunebook.charts.cost): one point per config, its cheapest tokens
against its latency, the front of configs no other beats on both; on stored GPU rows with
joules, and on rows priced by the user."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tunebook.charts import cost
from tunebook.inputs import cost as price

REPO = Path(__file__).resolve().parents[2]


def _rows() -> pd.DataFrame:
    rows = []
    # (config, users, output tok/s, p99 TPOT ms)
    for label, users, tok_s, tpot in [("a", 1, 100, 10), ("a", 8, 600, 30), ("b", 8, 900, 50),
                                      ("c", 8, 500, 60), ("d", 8, 1000, 80)]:
        m = {"output_tok_s": float(tok_s)}
        rows.append({"engine_label": label, "status": "ok", "max_concurrency": users,
                     "p99_tpot_ms": float(tpot), "replay_speed": None, **m,
                     **price.columns(price.Cost(3.6), {}, m)})
    return pd.DataFrame(rows)


def test_one_point_per_config_at_its_cheapest_tokens_and_the_front() -> None:
    df = _rows()
    points = cost.per_config(df, "usd_per_m_output_tok")
    assert list(points["engine_label"]) == ["a", "b", "c", "d"]
    assert points.set_index("engine_label").loc["a", "max_concurrency"] == 8  # 600 tok/s
    edge = cost.front(points, "p99_tpot_ms", "usd_per_m_output_tok")
    assert list(edge["engine_label"]) == ["a", "b", "d"]  # c: slower and dearer than b
    chart = cost.pareto(df).to_dict()
    assert "your price" in " ".join(chart["title"]["subtitle"])


def test_joules_where_there_is_no_price_and_nothing_without_either() -> None:
    gpu = pd.read_parquet(REPO / "outputs" / "h100" / "traces-tuned" / "results.parquet")
    assert cost.cost_metric(gpu) == "energy_per_output_tok_j"
    assert len(cost.per_config(gpu, "energy_per_output_tok_j")) == 2
    assert cost.pareto(gpu) is not None
    assert cost.pareto(_rows().drop(columns=list(price.COLUMNS), errors="ignore")) is None
