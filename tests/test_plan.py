from pathlib import Path

from tunebook import params as P
from tunebook.plan import make_plan

PARAMS = Path(__file__).resolve().parents[1] / "params" / "quickstart.yaml"


def test_grid_and_stable_ids() -> None:
    p = P.load(PARAMS)
    plan = make_plan(p)
    assert len(plan.engines) == 2 and len(plan.runs) == 8
    assert len({r.run_id for r in plan.runs}) == 8
    assert [r.run_id for r in make_plan(P.load(PARAMS)).runs] == [r.run_id for r in plan.runs]
    # num_prompts scales with users
    assert [r.point.num_prompts for r in plan.runs_for(plan.engines[0])] == [4, 8, 16, 32]


def test_ids_change_with_what_defines_a_run() -> None:
    a = make_plan(P.load(PARAMS))
    b = make_plan(P.load(PARAMS, {"load.output_len": 64}))
    c = make_plan(P.load(PARAMS, {"repeats": 2}))
    assert not {r.run_id for r in a.runs} & {r.run_id for r in b.runs}
    assert {r.run_id for r in a.runs} < {r.run_id for r in c.runs}


def test_describe_marks_done() -> None:
    plan = make_plan(P.load(PARAMS))
    text = plan.describe({plan.runs[0].run_id})
    assert "1 already done" in text and "7 to run" in text
    assert "--max-num-seqs 4" in text and "VLLM_CPU_KVCACHE_SPACE=1" in text
