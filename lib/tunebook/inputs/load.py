"""Load points: what one run sends a server — dataset, users, request rate, lengths, prompts —
with a stable identity for its run id, the dataset seed of each run, and the arguments of
vLLM's benchmark client that send it (`bench_argv`). A new load kind is a dataset here (and its
params in tunebook.inputs.params); tunebook.measure.client runs whatever arguments it is given.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from tunebook.models import prompts
from tunebook.models.prompts import PROMPT_SETS

# The block-reuse probe of Fig 3.3 (tunebook.measure.probe): two requests per point, not a load.
BLOCK_REUSE = "block_reuse"
# Fig 4.2's prompt sets (tunebook.models.prompts): vLLM `custom` datasets built from the stdlib.
PROMPT_DATASETS = tuple(PROMPT_SETS)
# vLLM's client sends these
BENCH_DATASETS = ("random", "random_prefix", "prefix_repetition", *PROMPT_DATASETS)
DATASETS = (*BENCH_DATASETS, BLOCK_REUSE)

# Fields added to LoadPoint after runs were stored. At these values a field is left out of the
# run id (tunebook.inputs.plan), so every run stored before it existed keeps its id and still
# resumes
# as done; any other value makes a different run.
_ID_NEUTRAL: dict[str, Any] = {"reset_prefix_cache": True, "seed": None, "ignore_eos": True}


@dataclass(frozen=True)
class LoadPoint:
    dataset: str  # one of DATASETS
    max_concurrency: int
    request_rate: float | None  # None = send all at once (inf)
    input_len: int  # block_reuse: the length of both prompts; PROMPT_DATASETS: the longest
    output_len: int
    prefix_len: int  # block_reuse: tokens the second prompt shares with the first
    num_prefixes: int
    num_prompts: int
    num_warmups: int
    reset_prefix_cache: bool = True  # POST /reset_prefix_cache before the point
    seed: int | None = None  # dataset seed; None = a fresh one per run
    ignore_eos: bool = True  # False: answers end at the model's EOS (real weights)

    def as_row(self) -> dict[str, Any]:
        """The point's columns (the row says what happened: prefix_cache_reset, seed)."""
        d = asdict(self)
        for k in ("num_prefixes", "reset_prefix_cache", "seed"):
            d.pop(k)
        return d

    def identity(self) -> dict[str, Any]:
        """What defines the point, for its run id (see _ID_NEUTRAL)."""
        return {k: v for k, v in asdict(self).items()
                if not (k in _ID_NEUTRAL and v == _ID_NEUTRAL[k])}

    @property
    def label(self) -> str:
        if self.dataset == BLOCK_REUSE:
            return f"block reuse, {self.prefix_len} of {self.input_len} shared"
        rate = "inf" if self.request_rate is None else f"{self.request_rate:g}"
        prefix = f", prefix {self.prefix_len}" if self.prefix_len else ""
        return f"{self.max_concurrency} users, {rate} req/s{prefix}"


def fresh_seed() -> int:
    return random.SystemRandom().randrange(1, 2**31 - 1)


def point_seed(point: LoadPoint) -> int:
    """The dataset seed of one run: the fixed `load.seed`, else a fresh one."""
    return point.seed if point.seed is not None else fresh_seed()


# what vLLM's client reports of each latency
PERCENTILES = "50,90,99"
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"


def bench_argv(point: LoadPoint, base_url: str, model_name: str, tokenizer: str,
               seed: int) -> list[str]:
    """`vllm bench serve` arguments for one load point."""
    argv = [
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model_name, "--served-model-name", model_name, "--tokenizer", tokenizer,
        "--num-prompts", str(point.num_prompts), "--num-warmups", str(point.num_warmups),
        "--max-concurrency", str(point.max_concurrency),
        "--request-rate", "inf" if point.request_rate is None else str(point.request_rate),
        "--seed", str(seed), "--temperature", "0",
        "--percentile-metrics", PERCENTILE_METRICS, "--metric-percentiles", PERCENTILES,
        "--save-detailed", "--disable-tqdm", *(["--ignore-eos"] if point.ignore_eos else []),
        # vLLM's default, pinned: its test request would cache the first measured prompt
        "--ready-check-timeout-sec", "0",
    ]
    if point.dataset in ("random", "random_prefix"):
        argv += ["--dataset-name", "random", "--random-input-len", str(point.input_len),
                 "--random-output-len", str(point.output_len),
                 "--random-prefix-len", str(point.prefix_len)]
    elif point.dataset == "prefix_repetition":
        argv += ["--dataset-name", "prefix_repetition",
                 "--prefix-repetition-prefix-len", str(point.prefix_len),
                 "--prefix-repetition-suffix-len", str(point.input_len),
                 "--prefix-repetition-num-prefixes", str(point.num_prefixes),
                 "--prefix-repetition-output-len", str(point.output_len)]
    elif point.dataset in PROMPT_DATASETS:
        # Built for this tokenizer: prompts of at most input_len tokens (chat template
        # included: vLLM's client applies it), code at least output_len tokens long.
        path = prompts.dataset_file(point.dataset, tokenizer, point.input_len, point.output_len)
        argv += ["--dataset-name", "custom", "--dataset-path", str(path),
                 "--custom-output-len", str(point.output_len)]
    else:
        raise ValueError(f"dataset {point.dataset!r} is not one vLLM's client sends")
    return argv
