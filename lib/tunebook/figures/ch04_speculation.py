"""Chapter 4 — speculative decoding and CUDA graphs: draft depth, n-gram speculation, eager
mode (Figs 4.1–4.3). Random weights make speculative acceptance meaningless: these figures
need real weights (SmolLM2-135M)."""

from __future__ import annotations

from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.manual import result, setting

CHAPTER = chapter(4, "Speculative decoding and CUDA graphs", None,
                  "Draft depth, n-gram speculation, and eager mode against CUDA graphs.")


@figure("4.1")
class DraftDepth(FigureUnit):
    title = "Draft depth"
    refs = (
        result("best_draft_depth_32_users", 3, "draft tokens",
               "draft depth with the highest output"),
        result("tied_draft_depth_low_1_user", 3, "draft tokens", "the lower of two tied depths"),
        result("tied_draft_depth_high_1_user", 5, "draft tokens",
               "the higher of two tied depths"),
        setting("users", 32, "users", "concurrent users of the measurement"),
    )
    note = "Measured 'with the clock locked'; the claim names no machine."
    needs = Needs(gpu=True, knobs=("speculative_config",), real_weights=True)


@figure("4.2")
class NgramSpeculation(FigureUnit):
    title = "n-gram speculation"
    refs = (
        result("median_tpot_ratio_ngram_1_user", 1 / 3, "x",
               "median TPOT with n-gram speculation ÷ without, 1 user", "≈"),
        result("median_tpot_ratio_ngram_4_users", 0.37, "x",
               "median TPOT with n-gram speculation ÷ without, 4 users"),
    )
    needs = Needs(knobs=("speculative_config",), real_weights=True)


@figure("4.3")
class EagerMode(FigureUnit):
    title = "Eager mode against CUDA graphs"
    refs = (
        result("tpot_slowdown_pct_eager_min", 1.2, "%", "eager mode vs CUDA graphs, smallest"),
        result("tpot_slowdown_pct_eager_max", 2.3, "%", "eager mode vs CUDA graphs, largest"),
    )
    needs = Needs(gpu=True, knobs=("enforce_eager",))
