"""Chapter 4 and Fig 8.4: rules on SYNTHETIC rows (made-up numbers with known answers, not
measurements); the measured verdicts come from outputs/*/ch04 (no engine here)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tunebook import figures
from tunebook.figures import ch04_speculation as ch04
from tunebook.results.evidence import DIFFERS, HOLDS, NOT_MEASURED, Evidence


def _ev(rows: list[dict]) -> Evidence:
    base = {"status": "ok", "hardware": "test box", "gpu_name": None, "request_rate": None,
            "prefix_len": 0, "model": "smollm2-135m", "load_format": "auto",
            "dataset": "fresh_text"}
    return Evidence(Path("/nonexistent/exp"), pd.DataFrame([{**base, **r} for r in rows]), [],
                    {"model": "smollm2-135m"})


def _draft(depth: int) -> str:
    return json.dumps({"method": "draft_model", "model": "smollm2-135m-q4",
                       "num_speculative_tokens": depth})


def _spec_counters(depth: int, p: list[float], drafts: int = 100) -> dict:
    """Counter columns as tunebook.servers.metrics derives them: acceptance by position p (prefix
    shares), tokens per pass 1 + sum(p)."""
    accepted = round(sum(p) * drafts)
    return {"spec_drafts": drafts, "spec_draft_tokens": drafts * depth,
            "spec_accepted_tokens": accepted,
            "spec_acceptance_rate": accepted / (drafts * depth),
            "spec_tokens_per_pass": 1 + accepted / drafts,
            "spec_acceptance_by_pos": json.dumps(p)}


ACCEPT = [0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.06]


def _depth_rows(out: dict[int, dict[int, float]]) -> list[dict]:
    """out[users][depth] = output tok/s (depth 0 = no speculation)."""
    rows = []
    for users, by_depth in out.items():
        for depth, tok_s in by_depth.items():
            spec = _spec_counters(depth, ACCEPT[:depth]) if depth else {}
            rows.append({"engine_config_id": f"d{depth}", "engine_label": f"d{depth}",
                         "max_concurrency": users, "output_tok_s": tok_s,
                         "median_tpot_ms": 1000 * users / tok_s,
                         "speculative_config": _draft(depth) if depth else None,
                         "part": "depth", **spec})
    return rows


MANUAL_LIKE = {1: {0: 100, 1: 140, 2: 160, 3: 175, 4: 172, 5: 174, 6: 160, 7: 150},
               32: {0: 2000, 1: 2300, 2: 2450, 3: 2500, 4: 2400, 5: 2300, 6: 2100, 7: 2000}}


def test_4_1_best_depth_and_ties() -> None:
    c = figures.verdict(_ev(_depth_rows(MANUAL_LIKE)), "4.1")
    assert c.verdict == HOLDS and c.measured_value == 3
    assert "stand-in" in c.measured and "predict" in c.why
    shifted = {1: MANUAL_LIKE[1], 32: {**MANUAL_LIKE[32], 1: 2600}}  # depth 1 wins at 32
    c = figures.verdict(_ev(_depth_rows(shifted)), "4.1")
    assert c.verdict == DIFFERS and c.measured_value == 1
    no_tie = {1: {**MANUAL_LIKE[1], 5: 140}, 32: MANUAL_LIKE[32]}  # 5 no longer ties with 3
    assert figures.verdict(_ev(_depth_rows(no_tie)), "4.1").verdict == DIFFERS
    assert figures.verdict(_ev(_depth_rows({1: {0: 100}})), "4.1").verdict == NOT_MEASURED
    assert figures.get("4.1").chart(_ev(_depth_rows(MANUAL_LIKE))).to_dict()


def test_4_1_predicted_best_depth_from_costs_and_acceptance() -> None:
    """Pass time = 4 ms + 1 ms per draft; E_k = 1 + sum(ACCEPT[:k]): E/cost peaks at k = 3
    (2.85/7 = 0.407 vs 2.40/6 = 0.400 at k=2 and 3.15/8 = 0.394 at k=4)."""
    t = pd.DataFrame([{"depth": k, "pass_ms": 4.0 + k, "acceptance_by_pos": ACCEPT[:k]}
                      for k in range(1, 8)])
    best, how = ch04.DraftDepth.predicted_best(t)
    assert best == 3 and "1.00 ms" in how and "4.00 ms" in how


def test_speculation_on_dummy_weights_is_labelled_and_never_a_result() -> None:
    rows = [{**r, "load_format": "dummy", "model": "qwen3-8b"} for r in
            _depth_rows(MANUAL_LIKE)]
    ev = _ev(rows)
    for fig in ("4.1", "8.4"):
        c = figures.verdict(ev, fig)
        assert c.verdict == NOT_MEASURED and "dummy" in (c.why + c.measured)
    t = figures.get("8.4").table(ev)
    assert (t.weights == ch04.DUMMY_NOTE).all() and len(t) == 14
    chart = json.dumps(figures.get("8.4").chart(ev).to_dict())
    assert "DUMMY WEIGHTS" in chart
    # beside real rows, dummy ones are left out and said to be
    real = _depth_rows(MANUAL_LIKE)
    c = figures.verdict(_ev(real + rows[:2]), "8.4")
    assert "dummy-weights run(s) left out" in c.measured


def _ngram_rows(ratio_1: float, ratio_4: float, fresh: float = 1.05) -> list[dict]:
    ngram = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    rows = []
    for ds, ratios in (("code_edit", {1: ratio_1, 4: ratio_4}), ("fresh_text", {1: fresh})):
        for users, ratio in ratios.items():
            rows += [{"engine_config_id": "none", "engine_label": "default", "dataset": ds,
                      "max_concurrency": users, "median_tpot_ms": 10.0,
                      "speculative_config": None},
                     {"engine_config_id": "ng", "engine_label": f"speculative_config={ngram}",
                      "dataset": ds, "max_concurrency": users, "median_tpot_ms": 10.0 * ratio,
                      "speculative_config": ngram,
                      **_spec_counters(3, [0.7, 0.6, 0.5] if ds == "code_edit" else
                                       [0.1, 0.02, 0.0])}]
    return rows


def test_4_2_ngram_ratio_on_copying_prompts() -> None:
    c = figures.verdict(_ev(_ngram_rows(0.35, 0.40)), "4.2")
    assert c.verdict == HOLDS and c.measured_value == pytest.approx(0.35)
    assert "fresh answers" in c.measured
    assert figures.verdict(_ev(_ngram_rows(0.9, 0.95)), "4.2").verdict == DIFFERS
    only_fresh = [r for r in _ngram_rows(0.35, 0.4) if r["dataset"] == "fresh_text"]
    assert figures.verdict(_ev(only_fresh), "4.2").verdict == NOT_MEASURED
    assert figures.get("4.2").chart(_ev(_ngram_rows(0.35, 0.40))).to_dict()


def _eager_rows(model: str, graphs: dict[int, float], added_ms: float) -> list[dict]:
    return [{"engine_config_id": f"{model}-{e}", "engine_label": "enforce_eager=True" if e
             else "default", "model": model, "max_concurrency": u,
             "median_tpot_ms": t + (added_ms if e else 0.0), "enforce_eager": e or None}
            for u, t in graphs.items() for e in (False, True)]


def test_4_3_eager_slowdown_per_model() -> None:
    small = _eager_rows("qwen3-8b", {1: 40.0, 8: 45.0, 64: 80.0}, 0.6)  # 1.5%, 1.3%, 0.75%
    c = figures.verdict(_ev(small), "4.3")
    assert c.verdict == HOLDS and c.measured_value == pytest.approx(1.5)
    big = _eager_rows("qwen3-8b", {1: 6.0, 8: 7.0, 64: 12.0}, 6.0)  # 100%: launch-bound
    c = figures.verdict(_ev(big + _eager_rows("smollm2-135m", {1: 2.0}, 5.0)), "4.3")
    assert c.verdict == DIFFERS and "6.00" in c.why and "smollm2-135m" in c.measured
    assert figures.verdict(_ev(small[::2]), "4.3").verdict == NOT_MEASURED
    assert figures.get("4.3").chart(_ev(big)).to_dict()


def test_8_4_tokens_per_pass_and_the_mechanism() -> None:
    rows = _ngram_rows(0.35, 0.40)
    c = figures.verdict(_ev(rows), "8.4")
    # ngram x3 on code edits at 1 user: 1 + 0.7 + 0.6 + 0.5 = 2.8 > 1.25 x 1.8
    assert c.measured_value == pytest.approx(2.8) and c.verdict == DIFFERS
    assert "never rose" in c.why
    for r in rows:
        if r.get("spec_drafts"):
            r.update(_spec_counters(3, [0.5, 0.2, 0.1]))  # 1.8
    assert figures.verdict(_ev(rows), "8.4").verdict == HOLDS
    rows[1].update(_spec_counters(3, [0.2, 0.5, 0.1]))  # a later position above an earlier
    c = figures.verdict(_ev(rows), "8.4")
    assert c.verdict == DIFFERS and "break the mechanism" in c.why
    assert figures.get("8.4").chart(_ev(rows)).to_dict()
