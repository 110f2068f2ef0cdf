"""The SLO search on a trace: its load levels are replay speeds (search.speeds), a level is
said as a speed, and an answer on the edge of the searched space says what to widen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tunebook.inputs import params as P
from tunebook.inputs import slo
from tunebook.search import adaptive
from tunebook.search import tune as slo_search

REPO = Path(__file__).resolve().parents[2]
MOONCAKE = REPO / "params" / "traces" / "mooncake-conversation-first180s.jsonl"


def _trace_params(**search: Any) -> P.SweepParams:
    return P.parse({
        "experiment": "t", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
        "load": {"dataset": "file", "file": str(MOONCAKE), "window_s": [0, 20],
                 "length_scale": 0.25, "max_input_len": 640, "max_output_len": 16,
                 "speeds": [0.5, 1, 2, 4], "goodput": {"ttft_ms": 1000, "tpot_ms": 100}},
        "slo": ["slo_attainment >= 0.95"],
        "search": {"knobs": {"max_num_seqs": [4, 16, 64]}, "objective": "request_goodput_req_s",
                   **search}})


def test_a_traces_levels_are_its_speeds() -> None:
    p = _trace_params()
    levels, kind = p.load.search_levels()
    assert (levels, kind) == ((0.5, 1.0, 2.0, 4.0), "speed")
    spec = slo.parse_search(p.section(slo.SEARCH), levels, level=kind)
    assert spec.users == (0.5, 1.0, 2.0, 4.0) and spec.level_text(2.0) == "2× the trace's rate"
    assert spec.to_dict()["speeds"] == [0.5, 1.0, 2.0, 4.0] and "users" not in spec.to_dict()
    point = slo_search.SweepEvaluator(p, REPO / "outputs").point_params({"max_num_seqs": 4}, 2.0)
    assert point.load.speeds == (2.0,) and point.engine_grid == ({"max_num_seqs": 4},)
    assert "replay speeds [0.5, 1.0, 2.0, 4.0]" in slo_search.describe(p)
    with pytest.raises(P.ParamsError, match=r"search.users: a trace's load levels are its "
                                            r"replay speeds"):
        _trace_params(users=[1, 2])
    with pytest.raises(P.ParamsError, match=r"search.speeds: must be increasing"):
        _trace_params(speeds=[2, 1])


def test_a_search_over_speeds_says_its_levels_as_speeds() -> None:
    """A simulated engine: goodput grows with speed until the config's capacity, and the SLO
    (attainment) holds up to it. The search bisects the speeds and says them as speeds."""
    def evaluate(knobs: dict[str, Any], speed: float) -> dict[str, Any]:
        cap = knobs["max_num_seqs"] / 8  # the speed it keeps up with
        return {"status": "ok", "request_goodput_req_s": 3.0 * min(speed, cap),
                "slo_attainment": 1.0 if speed <= cap else 0.5}

    spec = slo.parse_search({"knobs": {"max_num_seqs": [4, 16, 64]}, "sampler": "grid",
                             "objective": "request_goodput_req_s"}, (0.5, 1, 2, 4), "speed")
    bounds = slo.parse_slo(["slo_attainment >= 0.95"])
    result = adaptive.search(evaluate, spec, bounds)
    assert result.best is not None and result.best.knobs == {"max_num_seqs": 64}
    assert result.best.best.users == 4.0
    assert any("× the trace's rate" in o.why for o in result.outcomes), [
        o.why for o in result.outcomes]


def test_an_answer_on_the_edge_says_what_to_widen() -> None:
    """As a new user met it: a small search answered at its highest level, where every config
    met the SLO, with the largest max_num_seqs it was given."""
    out = {"level": "users", "slo": ["p99_tpot_ms <= 20"], "points": 3, "configs": [],
           "engine_starts": 1, "engine_s": 10.0, "grid_points": 12, "stopped": "patience",
           "search": {"knobs": {"max_num_seqs": [4, 8, 16], "enforce_eager": [True, False]},
                      "users": [1, 4, 16]},
           "best": {"knobs": {"max_num_seqs": 16, "enforce_eager": True}, "users": 16,
                    "serve": "vllm serve …"}}
    notes = slo_search.edges(out)
    assert notes == ["the answer is at the highest load level searched (16 users): the space "
                     "may end before the SLO does; widen search.users upward",
                     "max_num_seqs=16 is the largest value searched: widen "
                     "search.knobs.max_num_seqs up"]
    text = slo_search.report_text(out)
    assert "on the edge: the answer is at the highest load level searched" in text
    inside = {**out, "best": {**out["best"], "knobs": {"max_num_seqs": 8}, "users": 4}}
    assert slo_search.edges(inside) == []
    speeds = {**out, "level": "speed", "search": {"knobs": {}, "speeds": [0.5, 1.0, 2.0]},
              "best": {**out["best"], "users": 2.0}}
    assert "(2× the trace's rate)" in slo_search.edges(speeds)[0]
    assert "search.speeds" in slo_search.edges(speeds)[0]


def test_goodput_past_capacity_does_not_cut_the_climb_short() -> None:
    """Goodput falls past what a config serves well: 16× misses the SLO and its goodput (12)
    is no more than 4×'s, yet 8× meets it and serves twice as much. The missed level's
    throughput (24), not its goodput, bounds the levels below it (CEILINGS)."""
    def evaluate(knobs: dict[str, Any], speed: float) -> dict[str, Any]:
        cap = 8.0
        throughput = 3.0 * min(speed, cap)
        attainment = 1.0 if speed <= cap else 0.5
        return {"status": "ok", "request_throughput_req_s": throughput,
                "request_goodput_req_s": throughput * attainment, "slo_attainment": attainment}

    bounds = slo.parse_slo(["slo_attainment >= 0.95"])
    out = adaptive.best_load(evaluate, {}, (1.0, 2.0, 4.0, 8.0, 16.0), bounds,
                             "request_goodput_req_s")
    assert [p.users for p in out.points] == [4.0, 16.0, 8.0]
    assert out.best is not None and (out.best.users, out.score) == (8.0, 24.0)


def test_the_gain_over_the_default_has_an_interval() -> None:
    """confirm re-measures the baseline beside the answer: the gain is a ratio of their
    repeats with its 95% interval, in the report."""
    measured = [
        {"name": "answer", "knobs": {"max_num_seqs": 64}, "users": 8.0, "meets": 3,
         "values": [15.0, 15.5, 14.5], "mean": 15.0, "spread": 0.07},
        {"name": "baseline", "knobs": {"max_num_seqs": 128}, "users": 4.0, "meets": 3,
         "values": [10.0, 10.4, 9.6], "mean": 10.0, "spread": 0.08},
    ]
    out = {"level": "speed", "baseline": {"knobs": {"max_num_seqs": 128}},
           "confirm": slo_search.confirm_pick(measured, 3)}
    gain = slo_search.gain_over_baseline(measured, out, "request_goodput_req_s")
    assert gain["vs_baseline_mean"] == pytest.approx(1.5)
    assert gain["vs_baseline"].startswith("1.5×") and "95% CI, 3 runs" in gain["vs_baseline"]
    same = {**out, "baseline": {"knobs": {"max_num_seqs": 64}}}
    assert slo_search.gain_over_baseline(measured[:1], same, "x")["vs_baseline_mean"] == 1.0
