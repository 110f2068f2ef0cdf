from pathlib import Path

from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan

PARAMS = Path(__file__).resolve().parents[2] / "params" / "quickstart.yaml"


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


def test_engine_grid_may_swap_the_model() -> None:
    p = P.load(Path(__file__).resolve().parents[2] / "params" / "ch02-h200.yaml")
    plan = make_plan(p)
    models = [e.model for e in plan.engines]
    assert models[:-1] == ["qwen3-8b"] * (len(models) - 1) and models[-1] == "qwen1.5-110b"
    assert all("model" not in e.knobs for e in plan.engines)  # never rendered as a flag
    assert plan.engines[-1].label == "model=qwen1.5-110b"
    assert "vllm serve qwen1.5-110b" in plan.describe()


def test_model_belongs_at_top_level_not_in_engine() -> None:
    import pytest

    with pytest.raises(P.ParamsError, match="engine.model"):
        P.parse({"experiment": "x", "model": "qwen3-tiny", "engine": {"model": "qwen3-8b"},
                 "load": {"users": [1]}})


def test_configs_sharing_compiled_artifacts_run_back_to_back() -> None:
    """gpu_memory_utilization and prefix caching are not in vLLM's compile-cache key, so the
    configs differing only in them start one after another; the grid's order is kept
    otherwise, and eager configs (nothing compiled) group together."""
    from tunebook.inputs.plan import compile_key

    grid = [{}, {"max_num_seqs": 16}, {"gpu_memory_utilization": 0.5}, {"enforce_eager": True},
            {"max_num_seqs": 16, "enable_prefix_caching": False},
            {"enforce_eager": True, "max_num_seqs": 4}]
    plan = make_plan(P.load(PARAMS, {"engine_grid": grid}))
    assert [e.label for e in plan.engines] == [
        "default", "gpu_memory_utilization=0.5", "max_num_seqs=16",
        "max_num_seqs=16, enable_prefix_caching=False", "enforce_eager=True",
        "enforce_eager=True, max_num_seqs=4"]
    keys = [compile_key(e) for e in plan.engines]
    assert keys[0] == keys[1] != keys[2] == keys[3] != keys[4] == keys[5] == "eager"


def test_a_null_knob_is_the_default_config() -> None:
    """`quantization: null` in an engine_grid entry means vLLM's default: the same config, id
    and runs as leaving the knob out (a search space `[null, fp8]` reuses the default's stored
    runs), and no flag; null also unsets a knob the base engine section set."""
    base = make_plan(P.load(PARAMS, {"engine_grid": [{"max_num_seqs": 4}]}))
    null = make_plan(P.load(PARAMS, {"engine_grid": [{"max_num_seqs": 4, "quantization": None}]}))
    assert [r.run_id for r in null.runs] == [r.run_id for r in base.runs]
    assert "quantization" not in null.engines[0].knobs
    assert "--quantization" not in null.describe()
    unset = make_plan(P.load(PARAMS, {"engine.quantization": "fp8",
                                      "engine_grid": [{"max_num_seqs": 4, "quantization": None}]}))
    assert [r.run_id for r in unset.runs] == [r.run_id for r in base.runs]
