"""Load points between which the engine is reset and read: `load.prefix_len` lists (Fig 3.2),
`load.reset_prefix_cache`, `load.seed`, the block-reuse probe (Fig 3.3) — params, plan, and
run ids that stay what they were for everything stored before these existed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from tunebook.inputs import params as P
from tunebook.inputs.load import BLOCK_REUSE, LoadPoint, bench_argv
from tunebook.inputs.plan import make_plan
from tunebook.inputs.slo import SEARCH
from tunebook.measure.supply import server_options
from tunebook.results.store import Store

REPO = Path(__file__).resolve().parents[2]


def _p(**load: Any) -> dict[str, Any]:
    return {"experiment": "x", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
            "load": {"users": [1], **load}}


def _problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(P.ParamsError) as ei:
        P.parse(data)
    return dict(ei.value.problems)


def _probe(**load: Any) -> dict[str, Any]:
    return _p(dataset="block_reuse", input_len=80, output_len=1, prefix_len=[0, 31, 32, 33],
              **load)


# -- run ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted((REPO / "params").glob("*.yaml")), ids=lambda p: p.name)
def test_committed_experiments_still_resume_as_done(path: Path) -> None:
    """Every run the shipped params plan is stored under outputs/ (cpu, h100 or h200, by the
    file's name) with the id planned today: the new load-point fields left every id as it was."""
    p = P.load(path)
    machine = next((m for m in ("h200", "h100") if m in path.stem), "cpu")
    root = REPO / "outputs" / machine / p.experiment
    if not (root / "runs").is_dir():
        pytest.skip(f"no committed experiment {root.relative_to(REPO)}")
    if p.section(SEARCH):
        pytest.skip("a search stores the points it chose, not every run its params plan "
                    "(tests/search hold its summaries)")
    stored = {str(r["run_id"]) for r in Store(root).rows()}
    planned = {r.run_id for r in make_plan(p).runs}
    assert planned <= stored, sorted(planned - stored)[:5]


def _legacy_digest(point: LoadPoint) -> str:
    """The id hash as tunebook computed it before reset_prefix_cache, seed and ignore_eos
    existed (and the workload file's fields)."""
    old = {k: v for k, v in asdict(point).items()
           if k not in ("reset_prefix_cache", "seed", "ignore_eos", "workload", "replay_speed",
                        "goodput")}
    return hashlib.sha256(json.dumps(old, sort_keys=True, default=str).encode()).hexdigest()[:6]


def test_new_fields_change_the_id_only_away_from_their_default() -> None:
    base = make_plan(P.parse(_p(dataset="random_prefix", prefix_len=64))).runs[0]
    assert f"-p{_legacy_digest(base.point)}-" in base.run_id
    no_reset = make_plan(P.parse(_p(dataset="random_prefix", prefix_len=64,
                                    reset_prefix_cache=False))).runs[0]
    seeded = make_plan(P.parse(_p(dataset="random_prefix", prefix_len=64, seed=0))).runs[0]
    to_eos = make_plan(P.parse(_p(dataset="random_prefix", prefix_len=64,
                                  ignore_eos=False))).runs[0]
    assert len({base.run_id, no_reset.run_id, seeded.run_id, to_eos.run_id}) == 4


def test_a_scalar_prefix_len_plans_as_a_list_of_one() -> None:
    a = make_plan(P.parse(_p(dataset="random_prefix", prefix_len=64)))
    b = make_plan(P.parse(_p(dataset="random_prefix", prefix_len=[64])))
    assert [r.run_id for r in a.runs] == [r.run_id for r in b.runs]


# -- a prefix-length sweep ----------------------------------------------------------------------


def test_prefix_len_list_is_one_point_per_value() -> None:
    p = P.parse(_p(dataset="random_prefix", users=[1, 2], prefix_len=[64, 256, 512],
                   input_len=32, num_warmups=0))
    plan = make_plan(p)
    assert [(r.point.max_concurrency, r.point.prefix_len) for r in plan.runs] == [
        (1, 64), (1, 256), (1, 512), (2, 64), (2, 256), (2, 512)]
    assert len({r.run_id for r in plan.runs}) == 6
    assert "--random-prefix-len" in bench_argv(plan.runs[2].point, "http://h", "m", "t", 1)
    assert p.load.prompts_sent() == 3 * (4 + 8)


def test_to_dict_round_trips_scalar_and_list() -> None:
    for prefix in (64, [64, 128]):
        p = P.parse(_p(dataset="random_prefix", prefix_len=prefix, reset_prefix_cache=False,
                       seed=5))
        d = p.to_dict()
        assert d["load"]["prefix_len"] == prefix  # the panel edits a scalar as a number
        assert d["load"]["reset_prefix_cache"] is False and d["load"]["seed"] == 5
        again = P.parse(yaml.safe_load(yaml.safe_dump(d)))
        assert [r.run_id for r in make_plan(again).runs] == [r.run_id for r in make_plan(p).runs]


def test_parts_plan_prefix_lists_and_reset_per_part() -> None:
    data = {"experiment": "ch", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
            "load": {"input_len": 32, "output_len": 4, "num_warmups": 0},
            "parts": [{"name": "prefix", "load": {"dataset": "random_prefix", "users": [1],
                                                  "prefix_len": [64, 128]}},
                      {"name": "warm", "load": {"users": [1, 2], "reset_prefix_cache": False}}]}
    plan = make_plan(P.parse(data))
    assert [(r.part, r.point.prefix_len, r.point.reset_prefix_cache) for r in plan.runs] == [
        ("prefix", 64, True), ("prefix", 128, True), ("warm", 0, False), ("warm", 0, False)]


def test_describe_says_what_is_not_reset_and_fixed_seeds() -> None:
    text = make_plan(P.parse(_p(reset_prefix_cache=False, seed=3))).describe()
    assert "(no cache reset)" in text and "seed=3" in text
    assert "no cache reset" not in make_plan(P.parse(_p())).describe()


@pytest.mark.parametrize("load,key,words", [
    ({"dataset": "random_prefix", "prefix_len": [64, 0]}, "load.prefix_len", "prefix_len > 0"),
    ({"dataset": "random_prefix", "prefix_len": [64, 64]}, "load.prefix_len", "duplicates"),
    ({"dataset": "random_prefix", "prefix_len": [64, -1]}, "load.prefix_len[1]", ">= 0"),
    ({"dataset": "random_prefix", "prefix_len": []}, "load.prefix_len", "non-empty"),
    ({"dataset": "random_prefix", "prefix_len": "64"}, "load.prefix_len", "integer"),
    ({"dataset": "random", "prefix_len": [0, 64]}, "load.prefix_len", "random_prefix"),
    ({"dataset": "random_prefix", "prefix_len": [64, 1000]}, "load.input_len",
     "exceeds max_model_len"),  # the longest prefix of the list is the one that must fit
    ({"reset_prefix_cache": "yes"}, "load.reset_prefix_cache", "boolean"),
    ({"seed": -1}, "load.seed", ">= 0"),
])
def test_bad_load_keys(load: dict, key: str, words: str) -> None:
    problems = _problems(_p(**load))
    assert key in problems and words in problems[key], problems


def test_max_runs_counts_prefix_lengths() -> None:
    data = _p(dataset="random_prefix", users=[1, 2], prefix_len=list(range(1, 41)),
              input_len=16, output_len=4)
    data["max_runs"] = 50
    problems = _problems(data)
    assert "40 prefix lengths" in problems["load.prefix_len"]


def test_dev_mode_is_not_a_params_variable() -> None:
    data = _p()
    data["engine_env"] = {"VLLM_SERVER_DEV_MODE": "1"}
    assert "set by tunebook" in _problems(data)["engine_env.VLLM_SERVER_DEV_MODE"]


# -- the block-reuse probe ------------------------------------------------------------------


def test_block_reuse_plans_two_requests_per_point() -> None:
    p = P.parse(_probe())
    plan = make_plan(p)
    assert [r.point.prefix_len for r in plan.runs] == [0, 31, 32, 33]
    assert all(r.point.dataset == BLOCK_REUSE and r.point.num_prompts == 2
               and r.point.num_warmups == 0 and r.point.max_concurrency == 1
               and r.point.reset_prefix_cache for r in plan.runs)
    assert plan.runs[1].point.label == "block reuse, 31 of 80 shared"
    assert p.load.prompts_sent() == 8
    with pytest.raises(ValueError, match="not one vLLM's client sends"):
        bench_argv(plan.runs[0].point, "http://h", "m", "t", 1)
    # users default to [1] for the probe
    data = _probe()
    del data["load"]["users"]
    assert P.parse(data).load.users == (1,)


def test_server_options_follow_the_runs() -> None:
    probe_runs = make_plan(P.parse(_probe())).runs
    assert server_options(probe_runs) == server_options(probe_runs[:1])
    opts = server_options(probe_runs)
    assert opts.dev_mode and opts.prompt_tokens_details
    warm = make_plan(P.parse(_p(reset_prefix_cache=False))).runs
    assert not server_options(warm).dev_mode and not server_options(warm).prompt_tokens_details
    assert server_options(make_plan(P.parse(_p())).runs).dev_mode


@pytest.mark.parametrize("load,key,words", [
    ({"users": [2]}, "load.users", "must be [1]"),
    ({"request_rates": [1.0]}, "load.request_rates", "left out"),
    ({"prefix_len": [0, 80]}, "load.prefix_len", "below input_len 80"),
    ({"reset_prefix_cache": False}, "load.reset_prefix_cache", "must be true"),
    ({"num_prompts": 10}, "load.num_prompts", "does not apply"),
    ({"num_warmups": 1}, "load.num_warmups", "does not apply"),
])
def test_bad_block_reuse(load: dict, key: str, words: str) -> None:
    data = _probe()
    data["load"].update(load)
    problems = _problems(data)
    assert key in problems and words in problems[key], problems


def test_block_reuse_context_check_is_the_prompt_alone() -> None:
    data = _probe()
    data["load"].update(input_len=1020, output_len=4, prefix_len=[512])
    assert make_plan(P.parse(data)).runs  # 1020 + 4 fits 1024: the prefix is inside the prompt
    data["load"]["input_len"] = 1021
    assert "input_len + output_len = 1,025" in _problems(data)["load.input_len"]
