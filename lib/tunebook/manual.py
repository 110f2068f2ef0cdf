"""The vLLM manual's figures and the numbers they state, as labelled reference data.

The claims are parsed from the manual's figure index (``data/figure-index.txt``, a copy of
the manual's own index, shipped with the package). The numbers in each claim are encoded by
hand below as :class:`Ref` rows, so that a notebook can put "what the manual measured" next
to "what we measured here" — always labelled as reference, never mixed into our results.

The manual measured on a DGX Spark and an NVIDIA L4 with Qwen3-8B; where a claim names no
machine, ``Figure.hardware`` is None and ``Figure.note`` says so (we do not guess).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

INDEX_PATH = Path(__file__).parent / "data" / "figure-index.txt"
DEFAULT_MODEL = "Qwen3-8B"

# Ref.kind: what the figure observed, or a condition it was observed under.
RESULT = "result"
SETTING = "setting"


@dataclass(frozen=True)
class Ref:
    """One number a claim states."""

    name: str  # snake_case, unit in the name: output_tok_s_default_32_users
    value: float
    unit: str  # "x" is a ratio; "%" a percentage
    meaning: str  # one line
    qualifier: str = "="  # "=" stated, "≈" "about", ">" "more than", "≤" "within"/"up to"
    kind: str = RESULT  # RESULT or SETTING
    model: str | None = None  # overrides Figure.model when a claim names two models


@dataclass(frozen=True)
class Figure:
    fig: str  # "1.3"
    chapter: int
    claim: str  # verbatim from the index
    hardware: str | None  # "DGX Spark", "L4", or None when the claim names no machine
    model: str
    refs: tuple[Ref, ...]
    note: str | None = None

    @property
    def results(self) -> tuple[Ref, ...]:
        return tuple(r for r in self.refs if r.kind == RESULT)

    @property
    def settings(self) -> tuple[Ref, ...]:
        return tuple(r for r in self.refs if r.kind == SETTING)

    def ref(self, name: str) -> Ref:
        for r in self.refs:
            if r.name == name:
                return r
        raise KeyError(f"Fig {self.fig} has no ref {name!r}; it has {[r.name for r in self.refs]}")


@dataclass(frozen=True)
class Edition:
    vllm_version: str  # "0.31.0"
    vllm_commit: str  # "db9527a"
    date: str  # "2026-10-05"
    edition: str  # "2026.10"

    @property
    def label(self) -> str:
        return f"Edition {self.edition}"


# Digits in a claim that are names, not numbers the figure states (checked by the tests).
NOT_MEASUREMENTS: dict[str, str] = {
    "Qwen3-30B-A3B": "model name",
    "Qwen3-8B": "model name",
    "BF16": "dtype name",
    "FP8": "dtype name",
    "L4": "GPU name (NVIDIA L4)",
    "99th percentile": "the metric's name (P99)",
    "P99": "the metric's name",
}


def _r(name, value, unit, meaning, qualifier="=", model=None) -> Ref:
    return Ref(name, float(value), unit, meaning, qualifier, RESULT, model)


def _s(name, value, unit, meaning, qualifier="=") -> Ref:
    return Ref(name, float(value), unit, meaning, qualifier, SETTING)


_USERS_32 = _s("users", 32, "users", "concurrent users of the measurement")

_REFS: dict[str, tuple[Ref, ...]] = {
    "1.3": (
        _r("output_ratio_64_vs_1", 8.0, "x", "total output tok/s at 64 users ÷ at 1 user"),
        _r("tpot_ratio_64_vs_1", 7.5, "x", "time per output token at 64 users ÷ at 1 user", "≈"),
        _s("high_load_users", 64, "users", "the high load point"),
        _s("low_load_users", 1, "users", "the low load point"),
    ),
    "2.1": (
        _r("kv_kib_per_token_qwen3_8b", 144, "KiB/token", "KV cache per token, Qwen3-8B",
           model="Qwen3-8B"),
        _r("kv_kib_per_token_qwen3_30b_a3b", 96, "KiB/token",
           "KV cache per token, Qwen3-30B-A3B (fewer KV heads)", model="Qwen3-30B-A3B"),
    ),
    "2.2": (
        _r("kv_pool_tokens", 24096, "tokens", "tokens the KV cache pool holds"),
        _r("users_fit_full_context", 2.94, "users",
           "requests of the full context length that fit the pool (vLLM's 'x')"),
        _s("tokens_per_user", 640, "tokens", "tokens each user holds in the second case"),
        _r("users_fit_640_tokens", 37, "users", "users holding 640 tokens each that fit"),
    ),
    "2.4": (
        _s("gpu_memory_utilization", 0.75, "fraction", "--gpu-memory-utilization"),
        _r("vllm_memory_gib", 91.3, "GiB", "memory vLLM takes at that fraction"),
        _r("unified_memory_gib", 121.7, "GiB", "memory the CPU and the GPU share"),
    ),
    "2.5": (
        _r("tokens_per_gib_bf16", 7300, "tokens/GiB", "KV tokens per GiB, BF16 cache", "≈"),
        _r("tokens_per_gib_fp8", 14600, "tokens/GiB", "KV tokens per GiB, FP8 cache", "≈"),
    ),
    "2.6": (
        _r("output_tok_s_fp8_weights_32_users", 284.7, "tok/s", "output tok/s, FP8 weights"),
        _r("output_tok_s_baseline_weights_32_users", 208.8, "tok/s",
           "output tok/s, the unquantized weights (the claim names no dtype)"),
        _USERS_32,
    ),
    "3.1": (
        _s("max_num_seqs_cap", 16, "sequences", "the cap (--max-num-seqs)"),
        _r("matched_default_up_to_users", 16, "users", "the cap matched the default up to here",
           "≤"),
        _r("output_tok_s_default_32_users", 275, "tok/s", "output tok/s, default max_num_seqs"),
        _r("output_tok_s_cap16_32_users", 172, "tok/s", "output tok/s, max_num_seqs=16"),
        _USERS_32,
    ),
    "3.2": (
        _r("ttft_ms_prefix_cache_on", 400, "ms",
           "time to first token at every shared prefix length, prefix cache on", "≈"),
    ),
    "3.4": (
        _s("request_rate_req_s", 0.5, "req/s", "offered load (--request-rate)"),
        _s("max_num_batched_tokens", 16384, "tokens", "the raised token budget per step"),
        _r("p99_itl_ms_baseline", 574, "ms", "P99 ITL before (the claim names no budget)"),
        _r("p99_itl_ms_budget_16384", 798, "ms", "P99 ITL with max_num_batched_tokens=16384"),
    ),
    "4.1": (
        _r("best_draft_depth_32_users", 3, "draft tokens", "draft depth with the highest output"),
        _r("tied_draft_depth_low_1_user", 3, "draft tokens", "the lower of two tied depths"),
        _r("tied_draft_depth_high_1_user", 5, "draft tokens", "the higher of two tied depths"),
        _USERS_32,
    ),
    "4.2": (
        _r("median_tpot_ratio_ngram_1_user", 1 / 3, "x",
           "median TPOT with n-gram speculation ÷ without, 1 user", "≈"),
        _r("median_tpot_ratio_ngram_4_users", 0.37, "x",
           "median TPOT with n-gram speculation ÷ without, 4 users"),
    ),
    "4.3": (
        _r("tpot_slowdown_pct_eager_min", 1.2, "%", "eager mode vs CUDA graphs, smallest"),
        _r("tpot_slowdown_pct_eager_max", 2.3, "%", "eager mode vs CUDA graphs, largest"),
    ),
    "5.1": (
        _r("output_tok_s_peak", 275, "tok/s", "peak output throughput (no cache reset)"),
        _r("peak_users", 32, "users", "concurrent users at the throughput peak"),
    ),
    "5.2": (
        _r("output_diff_pct_vllm_vs_sglang_max", 3, "%",
           "vLLM and SGLang output differ by at most this", "≤"),
        _s("max_users", 32, "users", "up to this many concurrent users", "≤"),
    ),
    "5.3": (
        _r("p99_itl_ratio_vllm_vs_sglang_32_users", 2.0, "x",
           "P99 inter-token gap, vLLM ÷ SGLang", ">"),
        _USERS_32,
    ),
    "8.1": (
        _r("processes_total", 6, "processes", "API server + engine core + GPU workers"),
        _r("gpu_worker_processes", 4, "processes", "one GPU worker per GPU"),
        _s("tensor_parallel_size", 4, "GPUs", "--tensor-parallel-size"),
    ),
    "8.2": (_s("max_num_batched_tokens", 2048, "tokens/step", "token budget of each step"),),
    "8.3": (_s("block_size", 16, "tokens/block", "tokens in one KV cache block"),),
    "8.4": (
        _r("tokens_per_target_pass", 1.8, "tokens/pass",
           "tokens one real request got per target pass", "≈"),
    ),
}

_NO_MACHINE = "The claim names no machine."
_CLOCK = "Measured 'with the clock locked'; the claim names no machine."
_NOTES: dict[str, str] = {
    "1.3": "8x the total output at 64 users means each user got 1/8 of the 1-user rate.",
    "2.1": "A model property (2 x layers x KV heads x head dim x 2 bytes in BF16), "
    "not a measurement.",
    "2.2": _NO_MACHINE + " 24,096 / 2.94 implies a context length of about 8,192 tokens "
    "(not stated in the claim).",
    "2.4": "0.75 x 121.7 GiB = 91.3 GiB.",
    "2.5": "A model property: 1 GiB / 144 KiB per token ≈ 7,282 tokens in BF16.",
    "2.6": _CLOCK + " The claim does not name the weights FP8 was compared against.",
    "3.1": _NO_MACHINE,
    "3.4": _NO_MACHINE,
    "4.1": _CLOCK,
    "5.1": _NO_MACHINE + " 275 tok/s at 32 users is also Fig 3.1's default at 32 users.",
    "5.2": "'the same output' most likely means output throughput; the claim does not say.",
    "8.1": "An architecture figure: process counts, not a performance measurement.",
    "8.2": "A scheduler illustration: the budget is a setting, not a measurement.",
    "8.3": "A KV cache illustration: the block size is a setting, not a measurement.",
}
_MODELS: dict[str, str] = {"2.1": "Qwen3-8B / Qwen3-30B-A3B"}


def _hardware(claim: str) -> str | None:
    if "DGX Spark" in claim:
        return "DGX Spark"
    if re.search(r"\bL4\b", claim):
        return "L4"
    return None


def _parse_edition(line: str) -> Edition:
    version, commit, date, edition = (p.strip() for p in line.split("·"))
    return Edition(
        vllm_version=version.removeprefix("vLLM").strip(),
        vllm_commit=commit,
        date=date,
        edition=edition.removeprefix("Edition").strip(),
    )


def _parse(text: str) -> tuple[dict[str, Figure], Edition]:
    figures: dict[str, Figure] = {}
    for m in re.finditer(r"^(\d+)\.(\d+)\s+(\S.*?)\s*$", text, flags=re.M):
        fig, claim = f"{m[1]}.{m[2]}", m[3]
        figures[fig] = Figure(
            fig=fig,
            chapter=int(m[1]),
            claim=claim,
            hardware=_hardware(claim),
            model=_MODELS.get(fig, DEFAULT_MODEL),
            refs=_REFS.get(fig, ()),
            note=_NOTES.get(fig),
        )
    unknown = set(_REFS) - set(figures)
    if unknown:
        raise ValueError(f"refs for figures missing from the index: {sorted(unknown)}")
    last = [ln for ln in text.splitlines() if ln.strip()][-1]
    return figures, _parse_edition(last)


FIGURES, EDITION = _parse(INDEX_PATH.read_text(encoding="utf-8"))
SOURCE = f"vLLM manual, {EDITION.label} — reference, not measured here"

FRAME_COLUMNS = (
    "fig", "ref", "value", "unit", "meaning", "qualifier", "kind", "hardware", "model", "source",
)


def figure(fig: str) -> Figure:
    """FIGURES[fig], with an error that lists the figures there are."""
    try:
        return FIGURES[str(fig)]
    except KeyError:
        raise KeyError(f"no Fig {fig!r} in the manual; figures: {', '.join(FIGURES)}") from None


def reference_frame(figs: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per Ref of the given figures (all when None), labelled as reference data."""
    chosen = [figure(f) for f in (FIGURES if figs is None else figs)]
    rows = [
        {
            "fig": f.fig,
            "ref": r.name,
            "value": r.value,
            "unit": r.unit,
            "meaning": r.meaning,
            "qualifier": r.qualifier,
            "kind": r.kind,
            "hardware": f.hardware,
            "model": r.model or f.model,
            "source": SOURCE,
        }
        for f in chosen
        for r in f.refs
    ]
    return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))
