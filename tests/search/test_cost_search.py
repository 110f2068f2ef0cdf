"""The search ranks by cost when asked (search.objective: output_tok_per_usd with params cost:):
on a simulated engine where two GPUs serve 1.6x the tokens of one at twice the price, the most
tokens and the cheapest tokens are different answers, both meeting the SLO."""

from __future__ import annotations

from typing import Any

from tunebook.inputs import cost, slo
from tunebook.search import adaptive

PRICE = cost.Cost(usd_per_gpu_hour=2.0)
BOUNDS = slo.parse_slo(["p99_tpot_ms <= 40"])


def engine(knobs: dict[str, Any], users: int) -> dict[str, Any]:
    tp, seqs = knobs["tensor_parallel_size"], knobs["max_num_seqs"]
    served = min(users, seqs)
    metrics = {"status": "ok", "output_tok_s": 100.0 * served * (1.6 if tp == 2 else 1.0),
               "p99_tpot_ms": 10.0 + served + 50.0 * max(0, users - seqs)}
    return {**metrics, **cost.columns(PRICE, knobs, metrics)}


def _search(objective: str) -> adaptive.SearchResult:
    spec = slo.parse_search({"knobs": {"tensor_parallel_size": [1, 2], "max_num_seqs": [8, 16]},
                             "users": [4, 8, 16, 32], "objective": objective,
                             "sampler": "grid"})
    return adaptive.search(engine, spec, BOUNDS)


def test_the_cheapest_tokens_are_not_the_most_tokens() -> None:
    most, cheapest = _search("output_tok_s"), _search(cost.OBJECTIVE)
    assert most.best.knobs == {"tensor_parallel_size": 2, "max_num_seqs": 16}
    assert cheapest.best.knobs == {"tensor_parallel_size": 1, "max_num_seqs": 16}
    row = cheapest.best.best.row
    # 1,600 tok/s at 2 USD/h: 1e6 tokens take 625 s, 0.347 USD
    assert row["usd_per_hour"] == 2.0
    assert abs(row["usd_per_m_output_tok"] - 2.0 / 3600 / 1600 * 1e6) < 1e-9
    assert abs(row["output_tok_per_usd"] * row["usd_per_m_output_tok"] - 1e6) < 1e-3
    assert most.best.best.row["usd_per_hour"] == 4.0  # two GPUs


def test_the_answer_says_what_its_tokens_cost_and_the_energy_or_why_not() -> None:
    from tunebook.search import tune

    row = _search(cost.OBJECTIVE).best.best.row
    b = tune._what_it_costs({**row, "energy_note": "no GPU energy counter on this box"})
    text = "\n".join(tune.cost_text(b))
    assert "0.347 USD per million output tokens at your price of 2.00 USD/h" in text
    assert "2,880,000 output tokens per USD" in text
    assert "energy: no GPU energy counter on this box" in text
    gpu = tune.cost_text({"energy_per_output_tok_j": 0.169, "mean_power_w": 635.0})
    assert gpu == ["  uses 0.169 J per output token (the GPUs at 635 W on average)"]
