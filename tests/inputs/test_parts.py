"""`parts:` — one experiment with several load shapes (a chapter), each with its engine configs;
shared engine configs start once, rows carry their part, figures read their parts' rows."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tunebook import figures
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.results.evidence import Evidence

CHAPTER = {
    "experiment": "ch", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
    "load": {"input_len": 64, "output_len": 16, "num_warmups": 0},
    "figures": ["3.1", "3.2"],
    "parts": [
        {"name": "cap", "engine_grid": [{}, {"max_num_seqs": 4}], "figures": ["3.1"],
         "load": {"users": [1, 2, 4, 8]}},
        {"name": "prefix", "engine_grid": [{}, {"enable_prefix_caching": False}],
         "figures": ["3.2"],
         "load": {"dataset": "prefix_repetition", "users": [1], "prefix_len": 256,
                  "num_prompts": 4}},
    ],
}


def _parse(data: dict) -> P.SweepParams:
    return P.parse(yaml.safe_load(yaml.safe_dump(data)), source="ch.yaml")


def test_parts_plan_shared_engines_once_and_tag_runs() -> None:
    p = _parse(CHAPTER)
    assert [part.name for part in p.parts] == ["cap", "prefix"]
    assert p.parts[1].load.input_len == 64  # the top-level load is each part's default
    plan = make_plan(p)
    # prefix caching is not in vLLM's compile-cache key: that config starts right after the
    # default, whose compiled artifacts it loads (plan.by_compile_key)
    assert [e.label for e in plan.engines] == ["default", "enable_prefix_caching=False",
                                               "max_num_seqs=4"]
    assert len(plan.runs) == 2 * 4 + 2 * 1
    default = plan.engines[0]
    assert {r.part for r in plan.runs_for(default)} == {"cap", "prefix"}
    assert "[prefix]" in plan.describe()
    assert {r["part"] for r in plan.to_dict()["runs"]} == {"cap", "prefix"}


def test_parts_round_trip_and_ids_of_a_file_without_parts_are_unchanged() -> None:
    p = _parse(CHAPTER)
    again = P.parse(p.to_dict(), source="again")
    assert [r.run_id for r in make_plan(again).runs] == [r.run_id for r in make_plan(p).runs]
    flat = {k: v for k, v in CHAPTER.items() if k != "parts"}
    flat["engine_grid"] = CHAPTER["parts"][0]["engine_grid"]
    flat["load"] = {**CHAPTER["load"], **CHAPTER["parts"][0]["load"]}
    cap_ids = {r.run_id for r in make_plan(p).runs if r.part == "cap"}
    assert {r.run_id for r in make_plan(_parse(flat)).runs} == cap_ids


@pytest.mark.parametrize(("change", "key"), [
    (lambda d: d["parts"][1]["load"].update(users=[0]), "parts[1].load.users[0]"),
    (lambda d: d["parts"][0].update(name="a b"), "parts[0].name"),
    (lambda d: d["parts"][1].update(name="cap"), "parts[1].name"),
    (lambda d: d["parts"][0]["engine_grid"].append({"max_num_seqz": 1}),
     "parts[0].engine_grid[2].max_num_seqz"),
    (lambda d: d["parts"][0].update(figures=["9.9"]), "parts[0].figures[0]"),
    (lambda d: d["parts"][0].update(figures=["2.1"]), "parts[0].figures"),
    (lambda d: d.update(engine_grid=[{}]), "engine_grid"),
    (lambda d: d.update(parts=[]), "parts"),
    (lambda d: d["parts"][1]["load"].update(input_len=5000), "parts[1].load.input_len"),
])
def test_bad_parts_name_the_part(change, key: str) -> None:
    data = yaml.safe_load(yaml.safe_dump(CHAPTER))
    change(data)
    with pytest.raises(P.ParamsError) as e:
        P.parse(data, source="ch.yaml")
    assert any(k == key for k, _ in e.value.problems), e.value.problems


def test_figures_read_the_rows_of_their_parts() -> None:
    rows = []
    for part, users, tok_s in (("cap", 1, 100.0), ("cap", 2, 190.0), ("prefix", 1, 5.0)):
        rows.append({"status": "ok", "run_id": f"{part}{users}", "part": part,
                     "engine_config_id": "e", "engine_label": "default",
                     "max_concurrency": users, "output_tok_s": tok_s})
    ev = Evidence(Path("/nonexistent/ch"), pd.DataFrame(rows), [],
                  _parse(CHAPTER).to_dict())
    assert ev.parts_for("3.1") == {"cap"} and ev.parts_for("1.1") == set()
    assert set(ev.for_figure("3.1").df["part"]) == {"cap"}
    assert ev.for_figure("3.1").df["output_tok_s"].min() == 100.0
    no_parts = Evidence(Path("/x"), pd.DataFrame(rows), [], {"figures": ["3.1"]})
    assert no_parts.for_figure("3.1") is no_parts
    assert figures.verdict(ev, "3.2").figure == "3.2"


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "params")
                                        .glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_params_file_round_trips(path: Path) -> None:
    """What a sweep records (inputs/params__*.yaml, to_dict) parses again to the same plan."""
    p = P.load(path)
    again = P.parse(p.to_dict(), source=f"{path.name} again")
    assert [r.run_id for r in make_plan(again).runs] == [r.run_id for r in make_plan(p).runs]


def test_a_probe_part_does_not_inherit_counts_meant_for_the_others() -> None:
    data = yaml.safe_load(yaml.safe_dump(CHAPTER))
    data["load"].update(num_warmups=2, prompts_per_user=3)  # for the cap and prefix parts
    data["parts"].append({"name": "blocks", "engine_grid": [{}],
                          "load": {"dataset": "block_reuse", "users": [1], "input_len": 64,
                                   "prefix_len": [16, 32]}})
    p = P.parse(data, source="ch.yaml")
    assert p.parts[0].load.num_warmups == 2 and p.parts[2].load.dataset == "block_reuse"
    data["parts"][2]["load"]["num_warmups"] = 1  # set on the probe itself: refused
    with pytest.raises(P.ParamsError, match=r"parts\[2\]\.load\.num_warmups"):
        P.parse(data, source="ch.yaml")


def test_a_load_point_two_parts_share_stands_for_both_parts_figures(tmp_path: Path) -> None:
    """Same engine config, same load in two parts: one run, whose row names the first part;
    the second part's figures still read it (from the plan, not the row's column)."""
    data = {**CHAPTER, "parts": [
        {"name": "cap", "engine_grid": [{}], "figures": ["3.1"], "load": {"users": [1, 2]}},
        {"name": "other", "engine_grid": [{}], "figures": ["3.2"], "load": {"users": [1]}}]}
    p = _parse(data)
    runs = make_plan(p).runs
    assert len(runs) == 2 and {r.part for r in runs} == {"cap"}  # the shared point: once
    rows = [{"status": "ok", "run_id": r.run_id, "part": r.part, "engine_config_id": "e",
             "engine_label": "default", "max_concurrency": r.point.max_concurrency}
            for r in runs]
    ev = Evidence(Path("/nonexistent/ch"), pd.DataFrame(rows), [], p.to_dict())
    assert list(ev.for_figure("3.2").df["max_concurrency"]) == [1]
    assert len(ev.for_figure("3.1").df) == 2
    # the stored plan says it, each part that asked a run: read back, not planned again
    plan = make_plan(p).to_dict()
    assert sorted(map(tuple, (r["parts"] for r in plan["runs"]))) == [("cap",), ("cap", "other")]
    root = tmp_path / "ch"
    root.mkdir()
    (root / "plan.json").write_text(json.dumps(plan, default=str))
    stored = Evidence(root, pd.DataFrame(rows), [], {"parts": "no longer parses"})
    assert stored.planned_runs({"other"}) == {r.run_id for r in runs
                                              if r.point.max_concurrency == 1}
