"""Chapter 5 — benchmarking honestly: peak against knee, and a peer engine on the same
client (Figs 5.1–5.3)."""

from __future__ import annotations

from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.manual import result, setting

CHAPTER = chapter(5, "Benchmarking honestly", None,
                  "The throughput peak is not the latency knee; vLLM beside SGLang.")


@figure("5.1")
class PeakIsNotKnee(FigureUnit):
    title = "The throughput peak is not the latency knee"
    refs = (
        result("output_tok_s_peak", 275, "tok/s", "peak output throughput (no cache reset)"),
        result("peak_users", 32, "users", "concurrent users at the throughput peak"),
    )
    note = ("The claim names no machine. Its peak output at 32 users is also Fig 3.1's default "
            "at 32 users.")


@figure("5.2")
class SameOutputAsSglang(FigureUnit):
    title = "vLLM and SGLang write the same output"
    refs = (
        result("output_diff_pct_vllm_vs_sglang_max", 3, "%",
               "vLLM and SGLang output differ by at most this", "≤"),
        setting("max_users", 32, "users", "up to this many concurrent users", "≤"),
    )
    note = "'the same output' most likely means output throughput; the claim does not say."
    needs = Needs(gpu=True, peer_engine="SGLang")


@figure("5.3")
class TokenGapVsSglang(FigureUnit):
    title = "The P99 token gap beside SGLang"
    refs = (
        result("p99_itl_ratio_vllm_vs_sglang_32_users", 2.0, "x",
               "P99 inter-token gap, vLLM ÷ SGLang", ">"),
        setting("users", 32, "users", "concurrent users of the measurement"),
    )
    needs = Needs(gpu=True, peer_engine="SGLang")
