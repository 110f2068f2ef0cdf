"""Load points: what one run sends a server — dataset, users, request rate, lengths, prompts —
with a stable identity for its run id, and the dataset seed of each run.

tunebook.measure.client turns a point into vLLM's benchmark client's arguments and runs it.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

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
