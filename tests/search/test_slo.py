"""The SLO search (tunebook.inputs.slo) on a simulated engine whose answer is known.

The simulated engine: a config serves `per_user` tok/s per user up to `cap` users, then
stays flat (saturation) while its latency keeps growing; p99 TPOT = base + slope × users.
Every number below is computed from that model, so the right answer is known exactly."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tunebook.inputs import slo
from tunebook.search import adaptive
from tunebook.search import tune as slo_search

LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)


class SimEngine:
    """(knobs, users) -> a result row; counts evaluations and engine configs touched."""

    def __init__(self, fail: set[tuple[int, int]] | None = None):
        self.calls: list[tuple[tuple, int]] = []
        self.fail = fail or set()

    @staticmethod
    def model(knobs: dict[str, Any], users: int) -> dict[str, Any]:
        seqs, tokens = knobs["max_num_seqs"], knobs["max_num_batched_tokens"]
        cap = min(seqs, tokens // 64)  # users served at once
        per_user = 40.0 + tokens / 256  # bigger batches: faster per user, but …
        served = min(users, cap)
        tpot = 5.0 + 0.25 * served + tokens / 512 + 30.0 * max(0, users - cap)  # … slower steps
        return {"status": "ok", "output_tok_s": per_user * served, "p99_tpot_ms": tpot,
                "p99_ttft_ms": 50.0 * users / max(1, cap)}

    def __call__(self, knobs: dict[str, Any], users: int) -> dict[str, Any]:
        self.calls.append((tuple(sorted(knobs.items())), users))
        if (knobs["max_num_seqs"], users) in self.fail:
            return {"status": "failed", "error": "boom"}
        return self.model(knobs, users)

    @property
    def configs(self) -> int:
        return len({c for c, _ in self.calls})


SPACE = {"max_num_seqs": [4, 8, 16, 32, 64], "max_num_batched_tokens": [512, 1024, 2048, 4096]}
BOUNDS = slo.parse_slo(["p99_tpot_ms <= 20", "p99_ttft_ms <= 400"])


def _spec(**kw: Any) -> slo.SearchSpec:
    return slo.parse_search({"knobs": SPACE, "users": list(LEVELS), **kw})


def _truth() -> tuple[dict[str, Any], int, float]:
    """The exhaustive answer from the model itself."""
    best = (None, 0, -math.inf)
    for knobs in _spec().grid():
        for u in LEVELS:
            row = SimEngine.model(knobs, u)
            if adaptive.meets(row, BOUNDS) and row["output_tok_s"] > best[2]:
                best = (knobs, u, row["output_tok_s"])
    return best  # type: ignore[return-value]


def test_bounds_parse_and_check() -> None:
    b = slo.Bound.parse("p99_tpot_ms <= 50")
    assert (b.metric, b.op, b.value) == ("p99_tpot_ms", "<=", 50.0) and str(b) == \
        "p99_tpot_ms <= 50"
    assert b.met({"p99_tpot_ms": 50.0}) and not b.met({"p99_tpot_ms": 50.1})
    assert not b.met({}) and not b.met({"p99_tpot_ms": float("nan")})
    assert b.slack({"p99_tpot_ms": 60.0}) == pytest.approx(-0.2)
    assert slo.Bound.parse("output_tok_s_per_user >= 20").met({"output_tok_s_per_user": 25})
    for bad in ("p99_tpot <= 50", "p99_tpot_ms == 50", "p99_tpot_ms <= fast", "50 >= x"):
        with pytest.raises(ValueError):
            slo.Bound.parse(bad)


def test_bad_search_sections_name_every_problem() -> None:
    with pytest.raises(slo.SearchSpecError) as e:
        slo.parse_search({"knobs": {"max_num_seqs": [8, -1], "warp_speed": [1]},
                          "users": [4, 2], "objective": "vibes", "budget": {"hours": 1},
                          "sampler": "random"})
    keys = {k for k, _ in e.value.problems}
    assert keys == {"search.knobs.max_num_seqs", "search.knobs.warp_speed", "search.users",
                    "search.objective", "search.budget.hours", "search.sampler"}
    with pytest.raises(slo.SearchSpecError):
        slo.parse_slo([])


def test_typos_are_answered_with_the_name_meant() -> None:
    with pytest.raises(slo.SearchSpecError) as e:
        slo.parse_search({"knobs": {"max_num_batched_token": [256]}, "budgett": {}})
    said = dict(e.value.problems)
    assert "did you mean 'max_num_batched_tokens'?" in said["search.knobs.max_num_batched_token"]
    assert "did you mean 'budget'?" in said["search.budgett"]
    with pytest.raises(slo.SearchSpecError) as e:
        slo.parse_slo(["p99_tpot_m <= 50", "happiness >= 3"])
    said = dict(e.value.problems)
    assert "did you mean 'p99_tpot_ms'?" in said["slo[0]"]
    assert "did you mean" not in said["slo[1]"]  # nothing near: no guess


def test_bisection_finds_the_highest_load_meeting_the_slo() -> None:
    eng = SimEngine()
    knobs = {"max_num_seqs": 16, "max_num_batched_tokens": 1024}
    out = adaptive.best_load(eng, knobs, LEVELS, BOUNDS, gain=1.0)
    feasible = [u for u in LEVELS if adaptive.meets(SimEngine.model(knobs, u), BOUNDS)]
    assert out.best is not None and out.best.users == max(feasible) == 16
    assert len(eng.calls) <= math.ceil(math.log2(len(LEVELS))) + 1  # not every level


def test_climb_stops_past_saturation() -> None:
    """Beyond `cap` users throughput is flat: a feasible level that serves no more than the one
    below ends the climb, even if higher levels would still meet a loose SLO."""
    loose = slo.parse_slo(["p99_tpot_ms <= 10000", "p99_ttft_ms <= 10000"])
    eng = SimEngine()
    knobs = {"max_num_seqs": 4, "max_num_batched_tokens": 1024}
    out = adaptive.best_load(eng, knobs, LEVELS, loose)
    peak = max(SimEngine.model(knobs, u)["output_tok_s"] for u in LEVELS)
    assert out.best is not None and out.best.value == peak and "saturated" in out.why
    assert max(u for _, u in eng.calls) < LEVELS[-1]  # it never climbed to the top


def test_search_equals_the_full_grid_with_far_fewer_points() -> None:
    truth_knobs, truth_users, truth_value = _truth()
    grid_eng = SimEngine()
    grid = adaptive.full_grid(grid_eng, _spec(), BOUNDS)
    assert grid.best is not None and grid.best.score == truth_value
    eng = SimEngine()
    found = adaptive.search(eng, _spec(sampler="grid"), BOUNDS)
    assert found.best is not None and found.best.knobs == truth_knobs
    assert found.best.best.users == truth_users and found.best.score == truth_value
    assert len(eng.calls) <= len(grid_eng.calls) / 3  # a third of the grid's points or fewer
    assert any(o.pruned for o in found.outcomes)  # configs that could not win were cut short


def test_tpe_with_a_budget_stops_at_the_budget() -> None:
    eng = SimEngine()
    found = adaptive.search(eng, _spec(budget={"engine_configs": 6}, seed=3), BOUNDS)
    assert len(found.outcomes) == 6 == eng.configs and "budget" in found.stopped
    assert found.best is not None  # some config meets this SLO


def test_pruning_is_sound() -> None:
    """A config is pruned only at a point that misses the SLO and serves ≤ the best score;
    with the model's monotone throughput, no pruned config could have won."""
    found = adaptive.search(SimEngine(), _spec(sampler="grid"), BOUNDS)
    best = found.best.score  # type: ignore[union-attr]
    for o in found.outcomes:
        if o.pruned:
            could = max((SimEngine.model(o.knobs, u)["output_tok_s"] for u in LEVELS
                         if adaptive.meets(SimEngine.model(o.knobs, u), BOUNDS)), default=0.0)
            assert could <= best


def test_unmeetable_slo_reports_the_closest_config() -> None:
    impossible = slo.parse_slo(["p99_tpot_ms <= 1"])
    found = adaptive.search(SimEngine(), _spec(sampler="grid"), impossible)
    assert found.best is None
    close = found.closest()
    assert close is not None and close.users == 1  # the lightest load misses by the least
    assert close.knobs["max_num_batched_tokens"] == 512  # the shortest steps


def test_failed_points_never_count_as_meeting_the_slo() -> None:
    eng = SimEngine(fail={(16, u) for u in LEVELS})
    out = adaptive.best_load(eng, {"max_num_seqs": 16, "max_num_batched_tokens": 1024}, LEVELS,
                        BOUNDS)
    assert out.best is None and "no load level" in out.why


def test_serve_command() -> None:
    cmd = adaptive.serve_command("qwen3-8b", {"max_model_len": 8192}, {"max_num_seqs": 32})
    assert cmd == "vllm serve qwen3-8b --max-model-len 8192 --max-num-seqs 32"


def test_params_check_slo_and_search_before_anything_starts() -> None:
    from tunebook.inputs import params as P

    base = {"experiment": "s", "model": "qwen3-tiny", "load": {"users": [1, 2, 4]}}
    ok = P.parse({**base, "slo": ["p99_tpot_ms <= 50"],
                  "search": {"knobs": {"max_num_seqs": [4, 8]}}})
    search = ok.section(slo.SEARCH)
    assert ok.section(slo.SLO) == ("p99_tpot_ms <= 50",)
    assert P.parse(ok.to_dict()).section(slo.SEARCH) == search
    assert slo.parse_search(search, ok.load.users).users == (1, 2, 4)  # load's levels
    with pytest.raises(P.ParamsError) as e:
        P.parse({**base, "slo": ["p99_tpot <= 50"],
                 "search": {"knobs": {"max_num_seqs": [0]}}})
    text = str(e.value)
    assert "slo[0]" in text and "search.knobs.max_num_seqs" in text
    with pytest.raises(P.ParamsError, match="go together"):
        P.parse({**base, "slo": ["p99_tpot_ms <= 50"]})


def test_a_config_that_beats_the_best_is_never_pruned() -> None:
    """Seen on CPU: a config sets a new best at 32 users, then misses at 64 while serving less
    than the old best (noise: past saturation throughput can drop). Its search is done and it
    is the answer, not a pruned config."""
    table = {8: (889.0, 5.0), 32: (2001.0, 17.0), 64: (1657.0, 30.0)}

    def engine(knobs: dict[str, Any], users: int) -> dict[str, Any]:
        tok_s, tpot = table[users]
        return {"status": "ok", "output_tok_s": tok_s, "p99_tpot_ms": tpot}

    out = adaptive.best_load(engine, {"max_num_seqs": 32}, (1, 2, 4, 8, 16, 32, 64),
                        slo.parse_slo(["p99_tpot_ms <= 20"]), beat=1980.0)
    assert not out.pruned and out.score == 2001.0 and out.best.users == 32
    assert [p.users for p in out.points] == [8, 32, 64]  # nothing between 32 and 64 to try


def test_the_baseline_is_tried_first_and_patience_ends_the_search() -> None:
    base = {"max_num_seqs": 64, "max_num_batched_tokens": 4096}  # the simulated "default"
    eng = SimEngine()
    found = adaptive.search(eng, _spec(baseline=base, budget={"patience": 3}, seed=0), BOUNDS)
    assert found.outcomes[0].knobs == base and found.baseline is found.outcomes[0]
    assert "patience" in found.stopped and len(found.outcomes) < len(_spec().grid())
    # after the last new best and the random start (the baseline + spec.startup draws),
    # exactly `patience` configs were tried
    scores = [o.score or 0.0 for o in found.outcomes]
    last_best = max(i for i, s in enumerate(scores) if s > max(scores[:i], default=-1.0))
    counted_from = max(last_best + 1, 1 + _spec().startup)
    assert len(found.outcomes) - counted_from == 3
    with pytest.raises(slo.SearchSpecError) as e:
        _spec(baseline={"max_num_seqs": 3, "max_num_batched_tokens": 512},
              budget={"patience": 0})
    assert {k for k, _ in e.value.problems} == {"search.baseline.max_num_seqs",
                                                "search.budget.patience"}


def test_gains_within_min_gain_move_the_answer_but_not_patience() -> None:
    """Every config serves within 1% of every other (a space of noise, as most of the H200's
    is): with min_gain 1.05 nothing after the baseline beats it by 5%, so the search stops
    after the random start + patience configs; the answer is still the highest measured.
    Without min_gain the same 1% steps keep resetting patience."""
    def flat(knobs: dict[str, Any], users: int) -> dict[str, Any]:
        tok_s = 1000.0 + knobs["max_num_seqs"] / 10 + knobs["max_num_batched_tokens"] / 1000
        return {"status": "ok", "output_tok_s": tok_s * min(users, 8) / 8,
                "p99_tpot_ms": 10.0 if users <= 8 else 30.0, "p99_ttft_ms": 100.0}

    base = {"max_num_seqs": 4, "max_num_batched_tokens": 512}  # the least of the space
    noisy = adaptive.search(flat, _spec(baseline=base, budget={"patience": 2, "min_gain": 1.05},
                                   seed=0), BOUNDS)
    assert len(noisy.outcomes) == 1 + _spec().startup + 2
    assert "by 1.05×" in noisy.stopped
    assert noisy.best.score == max(o.score for o in noisy.outcomes if o.score)
    assert noisy.best.knobs != base  # a 1% better config is still the answer
    plain = adaptive.search(flat, _spec(baseline=base, budget={"patience": 2}, seed=0), BOUNDS)
    assert len(plain.outcomes) > len(noisy.outcomes)
    with pytest.raises(slo.SearchSpecError) as e:
        _spec(budget={"min_gain": 1.05})
    assert "needs budget.patience" in str(e.value.problems)
    with pytest.raises(slo.SearchSpecError):
        _spec(budget={"patience": 2, "min_gain": 0.9})


def test_a_config_is_first_tried_at_the_best_level_and_pruned_after_one_point() -> None:
    """The bar to beat is the best config's score at its level: a config that misses the SLO
    there and serves no more than that best is done after one point."""
    eng = SimEngine()
    weak = {"max_num_seqs": 4, "max_num_batched_tokens": 512}  # caps at 4 users
    out = adaptive.best_load(eng, weak, LEVELS, BOUNDS, beat=1e9, first=LEVELS.index(32))
    assert [u for _, u in eng.calls] == [32] and out.pruned


def test_replay_charges_each_start_once_and_finds_the_grid_answer() -> None:
    """Replaying a search on a grid's points charges a config's engine start once, and each
    point its runs' seconds, as the grid measured them."""
    grid = adaptive.full_grid(SimEngine(), _spec(), BOUNDS)
    summary = {"configs": [{"knobs": o.knobs, "points": [
        {"users": p.users, "value": p.value, **{b.metric: p.row[b.metric] for b in BOUNDS},
         "seconds": 2.0, "start_s": 30.0} for p in o.points]} for o in grid.outcomes]}
    rep = adaptive.Replay(summary)
    found = adaptive.search(rep, _spec(sampler="grid"), BOUNDS)
    assert found.best is not None and found.best.knobs == grid.best.knobs  # type: ignore
    assert rep.engine_starts == len(found.outcomes)
    assert rep.engine_s == pytest.approx(30.0 * len(found.outcomes) + 2.0 * len(found.points))


def test_confirm_keeps_the_answer_unless_another_is_ahead_beyond_noise() -> None:
    from tunebook.search.tune import confirm_pick

    def m(name: str, vals: list[float], meets: int) -> dict:
        mean = sum(vals) / len(vals)
        return {"name": name, "knobs": {"max_num_seqs": name}, "users": 8, "meets": meets,
                "values": vals, "mean": mean, "spread": (max(vals) - min(vals)) / mean}

    # the runner-up's mean is higher, but by less than the spread: the answer stands
    c = confirm_pick([m("a", [100, 120, 110], 3), m("b", [112, 108, 116], 3)], 3)
    assert c["pick"] == {"max_num_seqs": "a"} and c["within_noise"] and c["meets"] == "3/3"
    # ahead by more than either spread: the runner-up is the confirmed answer
    c = confirm_pick([m("a", [100, 101, 99], 3), m("b", [130, 131, 129], 3)], 3)
    assert c["pick"] == {"max_num_seqs": "b"} and not c["within_noise"]
    assert c["lead"] == pytest.approx(0.231, abs=1e-3)
    # meeting the SLO every time beats a higher mean that misses it sometimes
    c = confirm_pick([m("a", [200, 210, 190], 1), m("b", [150, 151, 149], 3)], 3)
    assert c["pick"] == {"max_num_seqs": "b"} and c["meets"] == "3/3"


def test_confirm_is_validated() -> None:
    for bad in (1, True, "3"):
        with pytest.raises(slo.SearchSpecError, match="search.confirm"):
            slo.parse_search({"knobs": {"max_num_seqs": [4, 8]}, "users": [1, 2],
                              "confirm": bad})
    spec = slo.parse_search({"knobs": {"max_num_seqs": [4, 8]}, "users": [1, 2], "confirm": 3})
    assert spec.confirm == 3 and spec.to_dict()["confirm"] == 3


def test_the_full_grid_measures_the_baseline_first() -> None:
    eng = SimEngine()
    base = {"max_num_seqs": 8, "max_num_batched_tokens": 2048}
    grid = adaptive.full_grid(eng, _spec(baseline=base), BOUNDS)
    assert dict(eng.calls[0][0]) == base and grid.outcomes[0].knobs == base
    assert len(grid.outcomes) == len(_spec().grid())  # every config still, once


def test_points_measured_twice_give_the_run_to_run_noise() -> None:
    from tunebook.search.tune import paired_points

    def summ(points: dict[tuple[int, int], tuple[float | None, bool]]) -> dict:
        configs: dict[int, list] = {}
        for (seqs, users), (value, meets) in points.items():
            configs.setdefault(seqs, []).append(
                {"users": users, "value": value, "meets": meets, "seconds": 5.0})
        return {"configs": [{"knobs": {"max_num_seqs": k}, "points": v}
                            for k, v in configs.items()]}

    search = summ({(8, 4): (110.0, True), (8, 8): (90.0, True), (16, 8): (200.0, False),
                   (32, 8): (None, False)})
    grid = summ({(8, 4): (100.0, True), (8, 8): (100.0, False), (16, 8): (200.0, False),
                 (16, 16): (300.0, True), (32, 8): (50.0, False)})
    p = paired_points(search, grid)
    assert p is not None and p["n"] == 3  # a failed point (no value) pairs with nothing
    assert {(q["knobs"]["max_num_seqs"], q["users"]): q["ratio"] for q in p["pairs"]} == {
        (8, 4): 1.1, (8, 8): 0.9, (16, 8): 1.0}
    assert p["median_dev"] == pytest.approx(0.1) and p["max_dev"] == pytest.approx(0.1)
    assert [(f["knobs"], f["users"]) for f in p["verdict_flips"]] == [({"max_num_seqs": 8}, 8)]
    assert paired_points(summ({(64, 1): (1.0, True)}), grid) is None


def test_the_report_names_the_runner_up_and_a_lead_inside_the_noise() -> None:
    """One draw per config: the runner-up and how far behind it is are said, and a lead under
    CLOSE_LEAD is called what it may be (noise), pointing to search.confirm."""
    def cfg(knobs: dict, score: float | None, users: int = 8) -> dict:
        return {"knobs": knobs, "score": score, "pruned": False, "why": "",
                "points": [{"users": users, "meets": score is not None, "value": score or 50.0}]}

    out = {"slo": ["p99_tpot_ms <= 50"], "points": 3, "engine_starts": 3, "engine_s": 30.0,
           "grid_points": 9, "stopped": "the full grid",
           "configs": [cfg({"max_num_seqs": 8}, 100.0), cfg({"max_num_seqs": 16}, 98.0, 16),
                       cfg({"max_num_seqs": 4}, None)],
           "best": {"knobs": {"max_num_seqs": 8}, "users": 8, "output_tok_s": 100.0,
                    "serve": "vllm serve m"}}
    r = slo_search.runner_up(out)
    assert r == {"knobs": {"max_num_seqs": 16}, "users": 16, "score": 98.0, "behind": 0.02}
    text = slo_search.report_text(out)
    assert "runner-up: {'max_num_seqs': 16} at 16 users, 2.0% behind: one draw each" in text
    assert "search.confirm" in text
    out["configs"][1] = cfg({"max_num_seqs": 16}, 80.0, 16)
    text = slo_search.report_text(out)
    assert "20.0% behind" in text and "search.confirm" not in text
    out["confirm"] = {"repeats": 3, "pick": {"max_num_seqs": 8}, "users": 8, "mean": 99.0,
                      "meets": "3/3"}
    out["engine_s_confirm"] = 12.0
    assert "runner-up:" not in slo_search.report_text(out)  # confirmed: the repeats speak
    out["configs"] = out["configs"][:1]
    assert slo_search.runner_up(out) is None  # nothing else scored
