"""The user's price per hour (params `cost:`, a section its mechanism owns): checked before any
engine starts, kept out of run ids, turned into USD per million tokens."""

from __future__ import annotations

import pytest

from tunebook.inputs import cost as C
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan as plan
from tunebook.inputs.slo import SEARCH

BASE = {"experiment": "x", "model": "qwen3-tiny", "load": {"users": [1]}}


def test_a_price_is_read_and_written_back() -> None:
    p = P.parse({**BASE, "cost": {"usd_per_hour": 2.5}})
    assert p.section(C.SECTION) == C.Cost(2.5)
    assert P.parse(p.to_dict()).section(C.SECTION) == C.Cost(2.5)
    assert P.parse(BASE).section(C.SECTION) == C.Cost(None)
    assert "cost" not in P.parse(BASE).to_dict()


@pytest.mark.parametrize("raw, says", [
    ({"usd_per_hour": 0}, "positive number"), ({"usd_per_hour": "2$"}, "positive number"),
    ({"usd_per_hour": True}, "positive number"), ({"usd_per_hour": 2, "eur": 1}, "cost.eur"),
    (3.5, "must be a mapping")])
def test_a_bad_price_is_refused_before_anything_starts(raw: object, says: str) -> None:
    with pytest.raises(P.ParamsError) as e:
        P.parse({**BASE, "cost": raw})
    assert says in str(e.value)


def test_a_price_is_no_part_of_a_run_id() -> None:
    ids = [r.run_id for r in plan(P.parse(BASE)).runs]
    assert ids == [r.run_id for r in plan(P.parse({**BASE, "cost": {"usd_per_hour": 9}})).runs]


def test_usd_per_million_tokens() -> None:
    # 3.6 USD an hour = 0.001 USD a second; at 1,000 tok/s a million tokens take 1,000 s
    assert C.per_million(3.6, 1000.0) == pytest.approx(1.0)
    assert C.per_million(None, 1000.0) is None and C.per_million(3.6, 0) is None
    cols = C.columns(C.Cost(3.6), {}, {"output_tok_s": 500.0, "total_tok_s": 2000.0})
    assert cols == pytest.approx({"usd_per_hour": 3.6, "usd_per_m_output_tok": 2.0,
                                  "output_tok_per_usd": 500000.0,
                                  "usd_per_m_total_tok": 0.5})
    assert C.columns(C.Cost(), {}, {"output_tok_s": 1.0}) == {}


def test_a_gpu_price_is_paid_per_gpu_a_config_uses() -> None:
    c = P.parse({**BASE, "cost": {"usd_per_gpu_hour": 2.0}}).section(C.SECTION)
    assert c.of({}) == 2.0 and c.of({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 8
    with pytest.raises(P.ParamsError) as e:
        P.parse({**BASE, "cost": {"usd_per_hour": 1, "usd_per_gpu_hour": 2}})
    assert "exactly one of" in str(e.value)


def test_ranking_by_cost_needs_a_price() -> None:
    search = {"slo": ["p99_tpot_ms <= 50"],
              "search": {"knobs": {"max_num_seqs": [4, 8]}, "objective": C.OBJECTIVE}}
    with pytest.raises(P.ParamsError) as e:
        P.parse({**BASE, **search})
    assert "needs your price" in str(e.value)
    assert P.parse({**BASE, **search, "cost": {"usd_per_hour": 1}}).section(SEARCH)
