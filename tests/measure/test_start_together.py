"""start_together: engine configs started at once and measured one at a time (the params side;
tests/figures/test_chapters_cpu.py::test_ch04_live runs two real engines started together)."""

from __future__ import annotations

from pathlib import Path

from tunebook.inputs import params as P
from tunebook.measure.sweep import Sweep, SweepOptions

TEXT = """\
experiment: together
model: qwen3-tiny
start_together: 2
engine:
  kv_cache_memory_bytes: 1073741824
  gpu_memory_utilization: 0.4
engine_grid:
  - {}
  - {enforce_eager: true}
  - {max_num_seqs: 4}
load: {users: [1]}
"""


def test_round_trip_and_dry_run(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(TEXT)
    p = P.load(f)
    assert p.start_together == 2
    assert P.parse(p.to_dict()).start_together == 2
    text = Sweep(p, tmp_path / "out", SweepOptions(progress=False)).describe()
    assert "start_together: 2 engine configs start at once" in text
    # one engine at a time: the key is left out, so older params files read the same
    alone = {**p.to_dict(), "start_together": 1, "engine": {"kv_cache_memory_bytes": 2**30}}
    assert "start_together" not in P.parse(alone).to_dict()


def test_pinned_pool_and_memory_fraction_may_be_set_together_only_when_starting_together(
        tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(TEXT.replace("start_together: 2\n", ""))
    try:
        P.load(f)
    except P.ParamsError as e:
        assert "conflicts with gpu_memory_utilization" in str(e)
    else:
        raise AssertionError("kv_cache_memory_bytes with gpu_memory_utilization was accepted")


def test_batches_group_configs_of_one_model_in_plan_order(tmp_path: Path) -> None:
    from tunebook.inputs.plan import make_plan
    from tunebook.measure.supply import batches

    f = tmp_path / "p.yaml"
    f.write_text(TEXT.replace("  - {max_num_seqs: 4}\n", "  - {model: qwen3-8b}\n"
                              "  - {max_num_seqs: 4}\n  - {model: qwen3-8b, max_num_seqs: 4}\n"))
    plan = make_plan(P.load(f))
    work = [(e, plan.runs_for(e)) for e in plan.engines]
    got = [[e.model for e, _ in b] for b in batches(work, 2)]
    assert got == [["qwen3-tiny", "qwen3-tiny"], ["qwen3-tiny"], ["qwen3-8b", "qwen3-8b"]]
    alone = [[e.model for e, _ in b] for b in batches(work, 1)]
    assert alone == [[e.model] for e in plan.engines]  # one at a time: the plan's order
